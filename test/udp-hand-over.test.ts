import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { isIP } from 'node:net';
import { networkInterfaces } from 'node:os';
import { afterEach, describe, expect, it } from 'vitest';
import { handOverPeer } from '../src/io/net/udp-hand-over.js';
import { UdpProxySocket } from '../src/io/net/udp-proxy.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { captureLogger, udpAsk, udpEcho, waitUntil, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * UdpProxySocket's hand-over (docs/handover.md "UDP"): two proxies in one SO_REUSEPORT group on
 * loopback, as an old process and its successor. The old one hands over while a client keeps a
 * session on it, others' datagrams sit in its listener's queue, and new clients start flows. Each
 * proxy has an endpoint of its own (replies prefixed `old:` and `new:`), so a reply says who
 * served it.
 */
const IDLE_MS = 250;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

const hasIPv6Loopback = Object.values(networkInterfaces()).some((list) => list?.some((a) => a.address === '::1'));

/** A client whose send() reaches the kernel at once (a literal resolves synchronously): a burst sent in one tick is queued before the proxies read. */
async function client(host: string): Promise<UdpSocket> {
  const s = createSocket({ type: isIP(host) === 6 ? 'udp6' : 'udp4', lookup: (h, _f, cb) => cb(null, h, isIP(h)) });
  await new Promise<void>((resolve) => s.bind(0, host, () => resolve()));
  cleanups.push(() => s.close());
  return s;
}

/** Every datagram a client gets: its text and where it came from. */
function collect(s: UdpSocket): Array<{ text: string; from: string }> {
  const got: Array<{ text: string; from: string }> = [];
  s.on('message', (m, r) => got.push({ text: m.toString(), from: `${r.address}|${r.port}` }));
  return got;
}

async function proxy(name: string, host: string, port: number, endpointHost: string): Promise<{ proxy: UdpProxySocket; port: number; records: ReturnType<typeof captureLogger>['records'] }> {
  const e = await udpEcho(endpointHost, name);
  cleanups.push(() => e.close());
  const { logger, records } = captureLogger('debug');
  const p = new UdpProxySocket({ name: 'default/dns:dns', balancer: FakeBalancer.of([e.port], { ip: endpointHost }), logger, idleTimeoutMs: IDLE_MS, reusePort: true });
  cleanups.push(() => p.close());
  const bound = await p.listen({ host, port });
  return { proxy: p, port: bound.port, records };
}

const CASES = [
  { bind: '127.0.0.1', to: '127.0.0.1', skip: false },
  { bind: '0.0.0.0', to: '127.0.0.1', skip: false },
  { bind: '::1', to: '::1', skip: !hasIPv6Loopback },
  { bind: '::', to: '::1', skip: !hasIPv6Loopback },
];

describe.each(CASES)('UdpProxySocket hand-over, listening on $bind', ({ bind, to, skip }) => {
  it.skipIf(skip)('no datagram or reply lost: the kept session stays on the old proxy and replies from the service address, queued datagrams are served, new flows reach the successor', async () => {
    const old = await proxy('old', bind, 0, to);
    const port = old.port;
    const next = await proxy('new', bind, port, to);
    const service = `${to}|${port}`;

    // A client whose flow the group hashes to the old proxy keeps a session there.
    let keeper: UdpSocket | undefined;
    for (let i = 0; i < 64 && keeper === undefined; i++) {
      const c = await client(to);
      if ((await udpAsk(c, port, to, 'hi')).msg.toString() === 'old:hi') keeper = c;
    }
    if (keeper === undefined) throw new Error('no flow of 64 reached the old proxy');
    const kept = collect(keeper);

    // A burst from new flows, sent in this tick: what the group gives the old proxy sits in its
    // listener's queue when the hand-over begins.
    const burst = await Promise.all(Array.from({ length: 24 }, () => client(to)));
    const burstGot = burst.map(collect);
    burst.forEach((c, i) => {
      for (let k = 0; k < 3; k++) c.send(`b${i}-${k}`, port, to);
    });
    const readBefore = old.proxy.stats.udpDatagrams;
    const handedOver = old.proxy.close({ handOver: true });
    // The kept session lives on, through a socket of its own.
    expect(old.proxy.active()).toBeGreaterThanOrEqual(1);
    await withDeadline(handedOver, 5000, 'the hand-over');
    expect(old.proxy.addresses()).toEqual([]);
    // The old proxy read from its queue after the hand-over began: the path under test ran.
    expect(old.proxy.stats.udpDatagrams).toBeGreaterThan(readBefore);

    // Every burst datagram answered once, from the service address, by whichever proxy got it.
    await waitUntil(() => burstGot.every((g) => g.length === 3), 'every burst datagram answered');
    burstGot.forEach((g, i) => {
      expect(g.map((r) => r.from)).toEqual([service, service, service]);
      expect(g.map((r) => r.text.replace(/^(old|new):/, '')).sort()).toEqual([`b${i}-0`, `b${i}-1`, `b${i}-2`]);
    });
    expect(burstGot.flat().some((r) => r.text.startsWith('old:'))).toBe(true);

    // The kept session: the same proxy (and endpoint), replies from the service address.
    for (let k = 0; k < 5; k++) keeper.send(`k${k}`, port, to);
    await waitUntil(() => kept.length === 5, 'the kept session\'s replies');
    expect(kept).toEqual(Array.from({ length: 5 }, (_, k) => ({ text: `old:k${k}`, from: service })));

    // New flows go to the successor.
    for (let i = 0; i < 8; i++) {
      const c = await client(to);
      const { msg, from } = await udpAsk(c, port, to, `n${i}`);
      expect(msg.toString()).toBe(`new:n${i}`);
      expect(`${from.address}|${from.port}`).toBe(service);
    }

    // The session idles out just as its client's next datagram reaches its socket (sent in this
    // tick, before the proxy reads): that datagram is still served, by the old proxy.
    keeper.send('edge', port, to);
    old.proxy.sweep(performance.now() + IDLE_MS);
    await waitUntil(() => kept.length === 6, 'the reply to the datagram that came as its session ended');
    expect(kept[5]).toEqual({ text: 'old:edge', from: service });

    // Idle sessions end as before, and with them their sockets: the kept client's next datagram
    // reaches the successor.
    old.proxy.sweep(performance.now() + IDLE_MS);
    await withDeadline(old.proxy.drained(), 1000, 'the old proxy to drain');
    expect(old.proxy.active()).toBe(0);
    expect((await udpAsk(keeper, port, to, 'later')).msg.toString()).toBe('new:later');
    expect(next.proxy.stats.udpDatagramsDropped).toBe(0);
    expect(old.proxy.stats.udpDatagramsDropped).toBe(0);
    expect(old.records.filter((r) => r.level >= 40)).toEqual([]);
  });
});

describe('UdpProxySocket hand-over, cut at the end of the grace period', () => {
  it('ends the sessions it kept, and their sockets, also one still read after its session idled out: the client\'s next datagram reaches the successor', async () => {
    const old = await proxy('old', '127.0.0.1', 0, '127.0.0.1');
    await proxy('new', '127.0.0.1', old.port, '127.0.0.1');
    let keeper: UdpSocket | undefined;
    for (let i = 0; i < 64 && keeper === undefined; i++) {
      const c = await client('127.0.0.1');
      if ((await udpAsk(c, old.port, '127.0.0.1', 'hi')).msg.toString() === 'old:hi') keeper = c;
    }
    if (keeper === undefined) throw new Error('no flow of 64 reached the old proxy');
    await old.proxy.close({ handOver: true });
    expect((await udpAsk(keeper, old.port, '127.0.0.1', 'kept')).msg.toString()).toBe('old:kept');
    // The session idles out with a datagram in its socket's queue, and the cut comes before that
    // socket is read to the end: what it holds is cut with it, and begins no session here.
    keeper.send('cut', old.port, '127.0.0.1');
    old.proxy.sweep(performance.now() + IDLE_MS);
    old.proxy.destroyAll();
    expect(old.proxy.active()).toBe(0);
    await withDeadline(old.proxy.drained(), 1000, 'the old proxy to drain');
    expect((await udpAsk(keeper, old.port, '127.0.0.1', 'after')).msg.toString()).toBe('new:after');
    expect(old.proxy.active()).toBe(0);
  });
});

describe('handOverPeer', () => {
  it('is the listener\'s own address, or the family\'s loopback for a wildcard bind', () => {
    expect(handOverPeer({ host: '10.0.0.1', port: 53 })).toEqual({ host: '10.0.0.1', port: 53 });
    expect(handOverPeer({ host: '0.0.0.0', port: 53 })).toEqual({ host: '127.0.0.1', port: 53 });
    expect(handOverPeer({ host: '::', port: 53 })).toEqual({ host: '::1', port: 53 });
    expect(handOverPeer({ host: 'fd00::1', port: 53 })).toEqual({ host: 'fd00::1', port: 53 });
  });
});
