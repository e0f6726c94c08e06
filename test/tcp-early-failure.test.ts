import { afterEach, describe, expect, it } from 'vitest';
import type { LoadBalancer } from '../src/core/balancer/load-balancer.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import type { Dialer } from '../src/seams/dialer.js';
import { FailingUpstream } from './helpers/failing-upstream.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { captureLogger, closedTcpPort, connectTo, tcpBackend, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * An upstream that fails after the hand-over and before its endpoint sent a byte, giving back what
 * it was sent (the port-forward dialer's case: the kubelet reports a refused pod port on the error
 * stream only once it tried): the connection dials the next endpoint and sends the bytes there.
 */

const LO = '127.0.0.1';
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});


async function proxyFor(balancer: LoadBalancer, dialer: Dialer): Promise<{ proxy: TcpProxySocket; port: number }> {
  const { logger } = captureLogger('warn');
  const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer, logger });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  const { port } = await proxy.listen({ host: LO, port: 0 });
  return { proxy, port };
}

describe('TcpConnection: an upstream that fails before its endpoint spoke', () => {
  it('sends what the client wrote, and its FIN, to the next endpoint', async () => {
    const echo = await tcpBackend();
    cleanups.push(() => echo.close());
    const dead = await closedTcpPort();
    const balancer = FakeBalancer.of([dead, echo.port]);
    const failed: FailingUpstream[] = [];
    const dialer: Dialer = {
      dial: async (req) => {
        if (req.endpoint.port !== dead) return new DirectDialer().dial(req);
        const u = new FailingUpstream(5);
        failed.push(u);
        return u;
      },
    };
    const { proxy, port } = await proxyFor(balancer, dialer);
    const { socket, got } = await connectTo(port);
    socket.write('hello');
    socket.end(' world');
    expect((await withDeadline(got.ended, 5000, 'the echo')).toString()).toBe('hello world');
    socket.destroy();
    await withDeadline(proxy.drained(), 5000, 'the proxy to drain');
    expect(failed).toHaveLength(1);
    expect(balancer.calls.map((c) => [c.picked, c.reset])).toEqual([[`${LO}:${dead}`, false], [`${LO}:${echo.port}`, true]]);
    expect(balancer.released.sort()).toEqual([`${LO}:${dead}`, `${LO}:${echo.port}`].sort());
    expect(proxy.stats).toMatchObject({ dialAttempts: 2, active: 0 });
    expect(proxy.stats.dialFailures.other).toBe(1);
  });

  it('resets the client when the failure gives nothing back (a plain error)', async () => {
    const echo = await tcpBackend();
    cleanups.push(() => echo.close());
    const dead = await closedTcpPort();
    const balancer = FakeBalancer.of([dead, echo.port]);
    const dialer: Dialer = {
      dial: async (req) => (req.endpoint.port === dead ? new FailingUpstream(1, false) : new DirectDialer().dial(req)),
    };
    const { proxy, port } = await proxyFor(balancer, dialer);
    const { socket, got } = await connectTo(port);
    socket.write('x');
    await expect(withDeadline(got.ended, 5000, 'the reset')).rejects.toMatchObject({ code: 'ECONNRESET' });
    socket.destroy();
    await withDeadline(proxy.drained(), 5000, 'the proxy to drain');
    expect(balancer.calls).toHaveLength(1);
  });

  it('gives up, resetting the client, when every endpoint fails that way', async () => {
    const balancer = FakeBalancer.of([1, 2, 3, 4, 5]);
    const dialer: Dialer = { dial: async () => new FailingUpstream(1) };
    const { proxy, port } = await proxyFor(balancer, dialer);
    const { socket, got } = await connectTo(port);
    socket.write('x');
    await expect(withDeadline(got.ended, 5000, 'the reset')).rejects.toMatchObject({ code: 'ECONNRESET' });
    socket.destroy();
    await withDeadline(proxy.drained(), 5000, 'the proxy to drain');
    // One attempt per dial timeout (four by default), each handed back.
    expect(balancer.calls).toHaveLength(4);
    expect(balancer.released).toHaveLength(4);
    expect(proxy.stats).toMatchObject({ dialAttempts: 4, dialExhausted: 1, active: 0 });
  });
});
