import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect, Socket } from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { toEndpoint } from '../src/core/model.js';
import type { LoadBalancer } from '../src/core/balancer/load-balancer.js';
import type { DialRequest } from '../src/seams/dialer.js';
import { DirectDialer, keepAliveDelayMs } from '../src/io/net/direct-dialer.js';
import { backlogFromSomaxconn } from '../src/io/net/listen-backlog.js';
import { TcpProxySocket, type TcpProxySocketOptions } from '../src/io/net/tcp-proxy.js';
import { TcpConnection } from '../src/io/net/tcp-connection.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { captureLogger, connectTo, tcpBackend, waitUntil, withDeadline } from './helpers/proxy-fixtures.js';

const LO = '127.0.0.1';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function backend(): ReturnType<typeof tcpBackend> {
  const b = await tcpBackend();
  cleanups.push(() => b.close());
  return b;
}

async function proxyFor(balancer: LoadBalancer, opts: Partial<TcpProxySocketOptions> = {}): Promise<{ proxy: TcpProxySocket; port: number }> {
  const { logger } = captureLogger('warn');
  const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer: new DirectDialer(), logger, ...opts });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  const { port } = await proxy.listen({ host: LO, port: 0 });
  return { proxy, port };
}

async function connected(port: number): ReturnType<typeof connectTo> {
  const conn = await connectTo(port);
  cleanups.push(() => conn.socket.destroy());
  return conn;
}

/** One IPv4 TCP socket of this network namespace, as /proc/net/tcp lists it. */
interface TcpRow {
  localPort: number;
  remotePort: number;
  /** 01 = ESTABLISHED. */
  state: string;
  /** The pending timer: 0 none, 1 retransmit, 2 keepalive, 3 TIME_WAIT, 4 zero-window probe. */
  timer: number;
  /** When it fires, in USER_HZ ticks (1/100 s) from now. */
  ticks: number;
}

function tcpRows(): TcpRow[] {
  const port = (addr: string): number => parseInt(addr.split(':')[1] as string, 16);
  return readFileSync('/proc/net/tcp', 'utf8')
    .split('\n')
    .slice(1)
    .filter((l) => l.trim() !== '')
    .map((line) => {
      const f = line.trim().split(/\s+/);
      const [timer, ticks] = (f[5] as string).split(':');
      return { localPort: port(f[1] as string), remotePort: port(f[2] as string), state: f[3] as string, timer: parseInt(timer as string, 16), ticks: parseInt(ticks as string, 16) };
    });
}

/**
 * The proxy's two sockets of one connection: the accepted one (its local port the proxy's, its
 * peer the client's) and the dialed one (its peer the backend's), plus the test client's own.
 */
function legs(proxyPort: number, client: Socket, backendPort: number): { accepted?: TcpRow; dialed?: TcpRow; client?: TcpRow } {
  const rows = tcpRows().filter((r) => r.state === '01');
  const accepted = rows.find((r) => r.localPort === proxyPort && r.remotePort === client.localPort);
  const dialed = rows.find((r) => r.remotePort === backendPort);
  const own = rows.find((r) => r.localPort === client.localPort && r.remotePort === proxyPort);
  return { ...(accepted ? { accepted } : {}), ...(dialed ? { dialed } : {}), ...(own ? { client: own } : {}) };
}

/** The legs as the kernel shows them, once `ok` holds of them. */
async function legsOnceThey(port: number, socket: Socket, echoPort: number, ok: (l: ReturnType<typeof legs>) => boolean, what: string): Promise<ReturnType<typeof legs>> {
  let seen = legs(port, socket, echoPort);
  await waitUntil(() => {
    seen = legs(port, socket, echoPort);
    return ok(seen);
  }, `${what} (saw ${JSON.stringify(seen)})`);
  return seen;
}

/** Only the dialer's batch timer is faked: the sockets and the test's waits run on real time. */
function fakeBatchTimer(): void {
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
  cleanups.push(() => vi.useRealTimers());
}

/** A socket dialed to a fresh backend by a DirectDialer with this keepalive, its batch timer faked. */
async function batchDial(keepAliveMs: number): Promise<Socket> {
  fakeBatchTimer();
  const echo = await backend();
  return new DirectDialer({ keepAliveMs }).dial(dialTo(echo.port));
}

/** A proxy to a fresh echo backend with one connection through it that has relayed a byte each way. */
async function relayedOnce(opts: Partial<TcpProxySocketOptions>) {
  const echo = await backend();
  const { proxy, port } = await proxyFor(FakeBalancer.of([echo.port]), opts);
  const { socket, got } = await connected(port);
  socket.write('x');
  await got.until(1);
  return { proxy, port, echo, socket, got };
}

function dialTo(port: number): DialRequest {
  return { endpoint: toEndpoint({ ip: LO, port }), clientAddress: LO, clientPort: 1, localAddress: LO, localPort: 2, timeoutMs: 1000 };
}

describe('TCP keepalive on both legs', () => {
  it('runs the keepalive timer on the accepted and the dialed socket, with the delay asked for', async () => {
    const { proxy, port, echo, socket } = await relayedOnce({ keepAliveMs: 7000, dialer: new DirectDialer({ keepAliveMs: 7000 }) });
    // The accepted leg gets it at the second sweep the connection lives through.
    proxy.sweep(1000);
    proxy.sweep(2000);
    // Once every byte is acknowledged, the timer the kernel runs on an idle socket is keepalive's.
    const seen = await legsOnceThey(port, socket, echo.port, (l) => l.accepted?.timer === 2 && l.dialed?.timer === 2, 'keepalive timers on both proxy sockets');
    for (const leg of [seen.accepted, seen.dialed]) {
      expect(leg?.ticks).toBeGreaterThan(0);
      expect(leg?.ticks).toBeLessThanOrEqual(700); // 7 s, not the kernel's default of two hours
    }
    // The control: the test's own client socket was not asked for keepalive, and runs no timer.
    expect(seen.client?.timer).toBe(0);
  });

  it('gives the dialed leg keepalive after it lived a tick, not at connect: a short connection never pays for it', async () => {
    fakeBatchTimer();
    const echo = await backend();
    const dialer = new DirectDialer({ keepAliveMs: 7000 });
    const request = dialTo(echo.port);
    const young = await dialer.dial(request);
    const gone = await dialer.dial(request);
    cleanups.push(() => young.destroy());
    // Closed before its tick: it leaves the batch and is never touched.
    const goneKeepAlive = vi.spyOn(gone, 'setKeepAlive');
    const closed = new Promise((resolve) => gone.once('close', resolve));
    gone.destroy();
    await closed;
    const dialed = (): TcpRow | undefined => tcpRows().find((r) => r.state === '01' && r.localPort === young.localPort && r.remotePort === echo.port);
    expect(dialed()?.timer).toBe(0);
    vi.advanceTimersByTime(1000); // the first tick: it connected during this one
    expect(dialed()?.timer).toBe(0);
    vi.advanceTimersByTime(1000); // the second: it lived a whole tick
    const leg = dialed();
    expect(leg?.timer).toBe(2);
    expect(leg?.ticks).toBeGreaterThan(0);
    expect(leg?.ticks).toBeLessThanOrEqual(700);
    expect(goneKeepAlive).not.toHaveBeenCalled();
    // Nothing waits any more: the batch's timer is gone.
    expect(vi.getTimerCount()).toBe(0);
  });

  it('gives the accepted leg keepalive at the second sweep it lives through: a connection closed before never gets it', async () => {
    const echo = await backend();
    const { proxy, port } = await proxyFor(FakeBalancer.of([echo.port]), { keepAliveMs: 7000, dialer: new DirectDialer({ keepAliveMs: 0 }) });
    const first = await connected(port);
    first.socket.write('x');
    await first.got.until(1);
    const accepted = (): TcpRow | undefined => legs(port, first.socket, echo.port).accepted;
    expect(accepted()?.timer).toBe(0);
    proxy.sweep(1000); // it was accepted during this one
    expect(accepted()?.timer).toBe(0);

    // A second connection, closed before its second sweep: it leaves without keepalive.
    const short = await connected(port);
    short.socket.write('y');
    await short.got.until(1);
    const setKeepAlive = vi.spyOn(Socket.prototype, 'setKeepAlive');
    cleanups.push(() => setKeepAlive.mockRestore());
    short.socket.end();
    await withDeadline(short.got.ended, 5000, 'the short connection to end');
    await waitUntil(() => proxy.active() === 1, 'the short connection to be released');

    proxy.sweep(2000); // the first's second sweep: it lived through a whole one
    const leg = accepted();
    expect(leg?.timer).toBe(2);
    expect(leg?.ticks).toBeGreaterThan(0);
    expect(leg?.ticks).toBeLessThanOrEqual(700);
    // Once: the sweep that gave it keepalive, for the one connection still open.
    expect(setKeepAlive).toHaveBeenCalledTimes(1);
    expect(setKeepAlive.mock.contexts[0]).toHaveProperty('remotePort', first.socket.localPort);
    // None awaits keepalive any more (the short one left the count when it closed): later sweeps
    // look at no connection.
    const looked = vi.spyOn(TcpConnection.prototype, 'keepAliveOnceLived');
    cleanups.push(() => looked.mockRestore());
    proxy.sweep(3000);
    proxy.sweep(4000);
    expect(looked).not.toHaveBeenCalled();
    expect(setKeepAlive).toHaveBeenCalledTimes(1);
  });

  it('gives keepalive at once to the clients still without it when the port closes (no sweep comes at shutdown)', async () => {
    const { proxy, port, echo, socket, got } = await relayedOnce({ keepAliveMs: 7000, dialer: new DirectDialer({ keepAliveMs: 0 }) });
    expect(legs(port, socket, echo.port).accepted?.timer).toBe(0);
    await proxy.close();
    // The listener is gone; the connection lives on, now with keepalive.
    const seen = await legsOnceThey(port, socket, echo.port, (l) => l.accepted?.timer === 2, 'keepalive on the accepted socket');
    expect(seen.accepted?.ticks).toBeLessThanOrEqual(700);
    socket.write('y');
    await got.until(2);
    // None awaits it any more: a closed port's sweeps (a retired one is still swept) look at none.
    const looked = vi.spyOn(TcpConnection.prototype, 'keepAliveOnceLived');
    cleanups.push(() => looked.mockRestore());
    proxy.sweep(1000);
    proxy.sweep(2000);
    expect(looked).not.toHaveBeenCalled();
  });

  it('lets go of a socket as soon as it closes: the batch stops at the next tick', async () => {
    const socket = await batchDial(7000);
    expect(vi.getTimerCount()).toBe(1);
    const closed = new Promise((resolve) => socket.once('close', resolve));
    socket.destroy();
    await closed;
    vi.advanceTimersByTime(1000);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('rounds a keepalive delay as the kernel takes it, for both legs: whole seconds, at least one, 0 off', () => {
    expect([0, 1, 500, 1500, 15_000].map(keepAliveDelayMs)).toEqual([0, 1000, 1000, 1000, 15_000]);
  });

  it('starts no batch timer with keepalive off', async () => {
    const socket = await batchDial(0);
    cleanups.push(() => socket.destroy());
    expect(vi.getTimerCount()).toBe(0);
  });

  it('is off on both legs with 0', async () => {
    const { proxy, port, echo, socket } = await relayedOnce({ keepAliveMs: 0, dialer: new DirectDialer({ keepAliveMs: 0 }) });
    // The sweeps that would give the accepted leg keepalive come and go.
    proxy.sweep(1000);
    proxy.sweep(2000);
    await legsOnceThey(port, socket, echo.port, (l) => l.accepted?.timer === 0 && l.dialed?.timer === 0, 'no timer on either proxy socket');
  });
});

describe('TCP idle limit', () => {
  it('closes, at the sweep, a connection without a byte either way for the limit, and not a busy one', async () => {
    const echo = await backend();
    const { proxy, port } = await proxyFor(FakeBalancer.of([echo.port]), { idleTimeoutMs: 1000 });
    const idle = await connected(port);
    const busy = await connected(port);
    idle.socket.write('a');
    busy.socket.write('b');
    await idle.got.until(1);
    await busy.got.until(1);

    proxy.sweep(10_000); // the first look
    busy.socket.write('c');
    await busy.got.until(2);
    proxy.sweep(11_000); // a second later: only the busy connection moved
    expect((await withDeadline(idle.got.ended, 5000, 'the idle connection to be closed')).toString()).toBe('a');
    await waitUntil(() => proxy.active() === 1, 'the idle connection to be released');

    busy.socket.write('d');
    await busy.got.until(3);
    proxy.sweep(11_500);
    proxy.sweep(12_400); // quiet for 900 ms only
    expect(proxy.active()).toBe(1);
    proxy.sweep(12_500);
    expect((await withDeadline(busy.got.ended, 5000, 'the busy connection, once idle, to be closed')).toString()).toBe('bcd');
    await withDeadline(proxy.drained(), 5000, 'the proxy to drain');
    await waitUntil(() => echo.open.size === 0, 'the endpoint side to be closed');
  });

  it('never closes anything by default', async () => {
    const echo = await backend();
    const { proxy, port } = await proxyFor(FakeBalancer.of([echo.port]));
    const { socket, got } = await connected(port);
    socket.write('a');
    await got.until(1);
    proxy.sweep(0);
    proxy.sweep(1e12);
    socket.write('b');
    await got.until(2);
    expect(proxy.active()).toBe(1);
  });
});

describe('the accept backlog', () => {
  const somaxconn = Number(readFileSync('/proc/sys/net/core/somaxconn', 'utf8').trim());

  /** Recv-Q (connections waiting for accept()) and Send-Q (the backlog) of a listening socket, from ss. */
  function listenQueues(port: number): { queued: number; backlog: number } {
    const out = execFileSync('ss', ['-Hltn', `sport = :${port}`], { encoding: 'utf8' }).trim();
    const [, queued, backlog] = out.split(/\s+/);
    return { queued: Number(queued), backlog: Number(backlog) };
  }

  it('is net.core.somaxconn, as the kernel reports it for the listener', async () => {
    const { port } = await proxyFor(new FakeBalancer([]));
    expect(listenQueues(port).backlog).toBe(somaxconn);
  });

  it('holds a burst of 1,000 connections made before the proxy could accept one', async () => {
    if (somaxconn < 1000) return; // this host caps every backlog below the burst
    const { proxy, port } = await proxyFor(new FakeBalancer([]));
    const clients: Socket[] = [];
    cleanups.push(() => clients.forEach((s) => s.destroy()));
    for (let i = 0; i < 1000; i++) clients.push(connect({ port, host: LO }).on('error', () => {}));
    // net.connect() calls connect() on the next tick; a tick queued after theirs runs before the
    // event loop can accept. Loopback handshakes complete within connect(), so every connection
    // is in the accept queue by then, or was dropped for want of room (and would be retried a
    // second later by its SYN's retransmission).
    const { queued } = await new Promise<{ queued: number }>((resolve) => process.nextTick(() => resolve(listenQueues(port))));
    expect(queued).toBe(1000);
    await waitUntil(() => proxy.stats.accepted === 1000, 'every connection to be accepted');
  });

  it('falls back to 4096 when somaxconn cannot be read', () => {
    expect(backlogFromSomaxconn('4096\n')).toBe(4096);
    expect(backlogFromSomaxconn('65535\n')).toBe(65535);
    expect(backlogFromSomaxconn(undefined)).toBe(4096);
    expect(backlogFromSomaxconn('0\n')).toBe(4096);
    expect(backlogFromSomaxconn('junk')).toBe(4096);
  });
});
