import type { Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { type Endpoint, toEndpoint } from '../src/core/model.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { UdpProxySocket } from '../src/io/net/udp-proxy.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { boundUdp, captureLogger, closedTcpPort, closedUdpPort, connectTo, exchange, tcpBackend, udpEcho, unresponsiveTcpPort, waitUntil, withDeadline } from './helpers/proxy-fixtures.js';

const LO = '127.0.0.1';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

/** A backend that names itself in every reply and counts the connections it was given. */
async function named(name: string): Promise<{ endpoint: Endpoint; accepted: () => number }> {
  let accepted = 0;
  const b = await tcpBackend(LO, (s: Socket) => {
    accepted++;
    s.write(`${name}:`);
    s.pipe(s);
  });
  cleanups.push(() => b.close());
  return { endpoint: toEndpoint({ ip: LO, port: b.port }), accepted: () => accepted };
}

/** A TCP proxy socket on loopback whose balancer picks by least connections; closed after the test. */
async function leastConnectionsProxy(): Promise<{ balancer: RoundRobinBalancer; proxy: TcpProxySocket; port: number }> {
  const balancer = new RoundRobinBalancer({ clock: systemClock, random: Math.random });
  balancer.setAlgorithm('least-connections');
  const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer: new DirectDialer(), logger: captureLogger('warn').logger });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  const { port } = await proxy.listen({ host: LO, port: 0 });
  return { balancer, proxy, port };
}

describe('least-connections on real sockets', () => {
  it('sends new connections away from the endpoint that holds long-lived ones', async () => {
    const [a, b, c] = [await named('a'), await named('b'), await named('c')];
    const { balancer, port } = await leastConnectionsProxy();
    // Three long-lived connections land on a, the only endpoint then.
    balancer.setEndpoints([a.endpoint]);
    const long: Socket[] = [];
    for (let i = 0; i < 3; i++) {
      const { socket, got } = await connectTo(port);
      cleanups.push(() => socket.destroy());
      await got.until(2);
      long.push(socket);
    }
    balancer.setEndpoints([a.endpoint, b.endpoint, c.endpoint]);
    const replies: string[] = [];
    for (let i = 0; i < 8; i++) replies.push((await exchange(port, 'x')).toString());
    expect(replies.filter((r) => r.startsWith('a:'))).toEqual([]);
    expect(replies.filter((r) => r.startsWith('b:')).length).toBe(4);
    expect(a.accepted()).toBe(3);
    // Once the long ones close, a is the least loaded again.
    for (const s of long) s.destroy();
    await waitUntil(() => balancer.load().find((l) => l.addr === a.endpoint.addr)?.active === 0, 'a to be released');
    expect((await exchange(port, 'y')).toString()).toMatch(/^[abc]:y$/);
    expect(balancer.load().map((l) => l.active)).toEqual([0, 0, 0]);
  });
});

describe('a retry after a failed dial', () => {
  it('goes to another endpoint, not back to the one that failed, though that one holds fewer connections', async () => {
    const live = await tcpBackend(LO, (s: Socket) => {
      s.write('live:');
      s.pipe(s);
    });
    cleanups.push(() => live.close());
    const liveEp = toEndpoint({ ip: LO, port: live.port });
    const deadEp = toEndpoint({ ip: LO, port: await closedTcpPort() });
    const { balancer, proxy, port } = await leastConnectionsProxy();
    balancer.setEndpoints([liveEp]);
    // A long-lived connection on the live endpoint; then the refusing one joins, holding none.
    const busy = await connectTo(port);
    cleanups.push(() => busy.socket.destroy());
    await busy.got.until('live:'.length);
    balancer.setEndpoints([liveEp, deadEp]);
    const { socket, got } = await connectTo(port);
    cleanups.push(() => socket.destroy());
    // Refused first (the fewest connections), then retried on the live one: served, not reset.
    await withDeadline(got.until('live:'.length), 5000, 'the live endpoint\'s greeting');
    expect(got.bytes().toString()).toBe('live:');
    expect(proxy.stats.dialFailures.refused).toBe(1);
  });
});

describe('every endpoint handed out is handed back exactly once', () => {
  async function tcpProxy(balancer: FakeBalancer, dialTimeoutsMs = [200, 200, 200]) {
    const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer: new DirectDialer(), logger: captureLogger('warn').logger, dialTimeoutsMs });
    cleanups.push(async () => {
      proxy.destroyAll();
      await proxy.close();
    });
    return { proxy, port: (await proxy.listen({ host: LO, port: 0 })).port };
  }

  const settled = (b: FakeBalancer): number[] => [...b.outstanding().values()];

  it('TCP: across relays, refused and timed-out retries, cuts mid-dial and mid-relay', async () => {
    const good = await named('good');
    const refused = toEndpoint({ ip: LO, port: await closedTcpPort() });
    const dead = await unresponsiveTcpPort();
    cleanups.push(() => dead.close());
    const balancer = new FakeBalancer([refused, toEndpoint({ ip: LO, port: dead.port }), good.endpoint]);
    const { proxy, port } = await tcpProxy(balancer);
    // Each connection starts on the next endpoint: refused then dead then good, dead then good, good.
    for (let i = 0; i < 6; i++) expect((await exchange(port, 'x')).toString()).toBe('good:x');
    // A client cut while its dial hangs, and one cut mid-relay.
    const mid = await connectTo(port);
    await mid.got.until(5);
    const hanging = await connectTo(port);
    await waitUntil(() => balancer.calls.length >= 12, 'a dial to hang');
    proxy.destroyAll();
    mid.socket.destroy();
    hanging.socket.destroy();
    await withDeadline(proxy.drained(), 5000, 'the proxy to drain');
    await waitUntil(() => settled(balancer).every((n) => n === 0), `every pick released: ${JSON.stringify([...balancer.outstanding()])}`);
    expect(balancer.released.length).toBe(balancer.calls.filter((c) => c.picked !== undefined).length);
  });

  it('UDP: across sessions that idle out, are reclaimed, or end on a refusal', async () => {
    const echo = await udpEcho(LO, 'e');
    cleanups.push(() => echo.close());
    const refused = toEndpoint({ ip: LO, port: await closedUdpPort() });
    const balancer = new FakeBalancer([toEndpoint({ ip: LO, port: echo.port }), refused]);
    const proxy = new UdpProxySocket({ name: 'default/dns:dns', balancer, logger: captureLogger('warn').logger, idleTimeoutMs: 100, maxSessions: 2 });
    cleanups.push(() => proxy.close());
    const { port } = await proxy.listen({ host: LO, port: 0 });
    const clients = await Promise.all(Array.from({ length: 5 }, () => boundUdp()));
    for (const c of clients) cleanups.push(() => c.close());
    for (const c of clients) {
      c.send('q', port, LO);
      await waitUntil(() => proxy.stats.udpDatagrams >= clients.indexOf(c) + 1, 'the datagram to be read');
    }
    await waitUntil(() => proxy.stats.udpSessionsReclaimed > 0, 'a reclaim');
    expect(balancer.calls.some((c) => c.picked === refused.addr)).toBe(true);
    proxy.sweep(performance.now() + 1000);
    await waitUntil(() => proxy.active() === 0, 'every session to end');
    expect(settled(balancer).every((n) => n === 0)).toBe(true);
    expect(balancer.released.length).toBe(balancer.calls.filter((c) => c.picked !== undefined).length);
  });
});
