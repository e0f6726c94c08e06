import { createServer, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { ServicePortStats } from '../src/core/stats.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpConnection, type TcpConnectionContext } from '../src/io/net/tcp-connection.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { captureLogger, connectTo, tcpBackend, waitUntil, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * An idle connection's heap is mostly its two sockets and their listeners: the client's five
 * listeners are functions shared by every connection (each finds its connection through the
 * socket), not closures made per connection. This is about memory, so it checks the listeners'
 * identity rather than measuring anything.
 */

const LO = '127.0.0.1';
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

const CLIENT_EVENTS = ['error', 'close', 'data', 'end', 'drain'] as const;

describe('TcpConnection: the client socket listeners', () => {
  it('are the same functions on every connection, and still relay both ways', async () => {
    const echo = await tcpBackend();
    cleanups.push(() => echo.close());
    const { logger } = captureLogger('warn');
    const released: TcpConnection[] = [];
    const ctx: TcpConnectionContext = {
      balancer: FakeBalancer.of([echo.port]),
      dialer: new DirectDialer(),
      stats: new ServicePortStats(),
      dialTimeoutsMs: [2000],
      log: () => logger,
      debugEnabled: () => false,
      outOfDescriptors: () => {},
      released: (conn) => released.push(conn),
      hold: () => false,
      holdEnded: () => {},
      proxyProtocol: false,
      proxyHeader: () => undefined,
    };
    const accepted: Socket[] = [];
    const server: Server = createServer({ allowHalfOpen: true, pauseOnConnect: true }, (client) => {
      accepted.push(client);
      new TcpConnection(ctx, client).start();
    });
    await new Promise<void>((resolve) => server.listen(0, LO, resolve));
    cleanups.push(() => new Promise((resolve) => server.close(resolve)));
    const port = (server.address() as { port: number }).port;

    const a = await connectTo(port);
    const b = await connectTo(port);
    cleanups.push(() => a.socket.destroy(), () => b.socket.destroy());
    // Relaying both ways: every client listener is attached by then.
    a.socket.write('one');
    b.socket.write('two');
    await a.got.until(3);
    await b.got.until(3);
    expect([a.got.bytes().toString(), b.got.bytes().toString()]).toEqual(['one', 'two']);

    expect(accepted).toHaveLength(2);
    const [ca, cb] = accepted as [Socket, Socket];
    for (const event of CLIENT_EVENTS) {
      // Node's own listeners (a socket's 'end') are shared functions too: every one must be.
      const la = ca.listeners(event);
      const lb = cb.listeners(event);
      expect(la.length, `client '${event}' listeners`).toBeGreaterThan(0);
      expect(lb.length, `client '${event}' listeners`).toBe(la.length);
      lb.forEach((fn, i) => expect(fn, `client '${event}' listener ${i} shared`).toBe(la[i]));
    }

    // Each shared listener still reaches its own connection: the FIN and the close.
    a.socket.end();
    await withDeadline(a.got.ended, 5000, 'the first connection to end');
    await waitUntil(() => released.length === 1, 'the first connection to be released');
    b.socket.end();
    await withDeadline(b.got.ended, 5000, 'the second connection to end');
    await waitUntil(() => released.length === 2, 'the second connection to be released');
    expect(ctx.stats.bytesToEndpoint).toBe(6);
    expect(ctx.stats.bytesToClient).toBe(6);
  });
});
