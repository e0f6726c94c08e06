import { execFile, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import type { Socket as UdpSocket } from 'node:dgram';
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import type { LoadBalancer } from '../src/core/balancer/load-balancer.js';
import { parseProcNetUdp } from '../src/io/net/proc-net-udp.js';
import { UdpProxySocket } from '../src/io/net/udp-proxy.js';
import { LISTENER_RECV_BUFFER_BYTES, UdpReceiveBuffers } from '../src/io/net/udp-receive-buffers.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { boundUdp, captureLogger, closedUdpPort, udpAsk, udpEcho, waitUntil, withDeadline, type LogRecord } from './helpers/proxy-fixtures.js';

const LO = '127.0.0.1';
const IDLE_MS = 250;
/** The proxier's coarse sweep period these tests pretend to run at. */
const SWEEP_PERIOD_MS = 100;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function echo(host = LO, name = ''): ReturnType<typeof udpEcho> {
  const e = await udpEcho(host, name);
  cleanups.push(() => e.close());
  return e;
}

async function client(host = LO): Promise<UdpSocket> {
  const s = await boundUdp(host);
  cleanups.push(() => s.close());
  return s;
}

interface Setup {
  proxy: UdpProxySocket;
  port: number;
  records: LogRecord[];
}

async function proxyFor(balancer: LoadBalancer, opts: { maxSessions?: number; host?: string; receiveBuffers?: UdpReceiveBuffers } = {}): Promise<Setup> {
  const { logger, records } = captureLogger('debug');
  const proxy = new UdpProxySocket({
    name: 'default/dns:dns',
    balancer,
    logger,
    idleTimeoutMs: IDLE_MS,
    ...(opts.maxSessions ? { maxSessions: opts.maxSessions } : {}),
    ...(opts.receiveBuffers ? { receiveBuffers: opts.receiveBuffers } : {}),
  });
  cleanups.push(() => proxy.close());
  const { port } = await proxy.listen({ host: opts.host ?? LO, port: 0 });
  return { proxy, port, records };
}

const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

describe('UdpProxySocket: datagrams', () => {
  it('echoes through the proxy, replying from the service address and port', async () => {
    const e = await echo(LO, 'A');
    const balancer = FakeBalancer.of([e.port]);
    const { proxy, port } = await proxyFor(balancer);
    const c = await client();

    const { msg, from } = await udpAsk(c, port, LO, 'hello');
    expect(msg.toString()).toBe('A:hello');
    expect(from).toEqual({ address: LO, port });
    expect(proxy.active()).toBe(1);
    expect(proxy.stats).toMatchObject({ udpDatagrams: 1, udpSessionsCreated: 1, udpSessionsActive: 1, bytesToEndpoint: 5, bytesToClient: 7 });
    expect(balancer.calls).toEqual([{ clientIP: LO, reset: false, picked: `${LO}:${e.port}` }]);

    // Later datagrams from the same client reuse its session.
    expect((await udpAsk(c, port, LO, 'again')).msg.toString()).toBe('A:again');
    expect(proxy.stats.udpSessionsCreated).toBe(1);
  });

  it('works over IPv6 loopback', async () => {
    const e = await echo('::1');
    const { port } = await proxyFor(FakeBalancer.of([e.port], { ip: '::1' }), { host: '::1' });
    const c = await client('::1');
    const { msg, from } = await udpAsk(c, port, '::1', 'six');
    expect(msg.toString()).toBe('six');
    expect(from).toEqual({ address: '::1', port });
  });

  it.each([60_000, 65_507])('passes a %d-byte datagram intact both ways', async (size) => {
    const e = await echo();
    const { proxy, port } = await proxyFor(FakeBalancer.of([e.port]));
    const c = await client();
    const payload = randomBytes(size);
    const { msg } = await udpAsk(c, port, LO, payload);
    expect(e.sizes).toEqual([size]);
    expect(msg.length).toBe(size);
    expect(sha256(msg)).toBe(sha256(payload));
    expect(proxy.stats.bytesToClient).toBe(size);
  });

  it('gives two clients separate sessions, each sticking to its endpoint', async () => {
    const a = await echo(LO, 'A');
    const b = await echo(LO, 'B');
    const { proxy, port } = await proxyFor(FakeBalancer.of([a.port, b.port]));
    const c1 = await client();
    const c2 = await client();

    for (let i = 0; i < 3; i++) {
      expect((await udpAsk(c1, port, LO, `one${i}`)).msg.toString()).toBe(`A:one${i}`);
      expect((await udpAsk(c2, port, LO, `two${i}`)).msg.toString()).toBe(`B:two${i}`);
    }
    expect(proxy.active()).toBe(2);
    expect(proxy.stats).toMatchObject({ udpSessionsCreated: 2, udpDatagrams: 6 });
  });

  it('drops and counts a datagram when there are no endpoints', async () => {
    const { proxy, port } = await proxyFor(new FakeBalancer([]));
    const c = await client();
    c.send('lost', port, LO);
    await waitUntil(() => proxy.stats.udpDatagrams === 1, 'the datagram to arrive');
    expect(proxy.stats.noEndpointRejects).toBe(1);
    expect(proxy.active()).toBe(0);
  });

  it('ends the session, and keeps serving, when the session socket cannot connect to its endpoint', async () => {
    // connect() to the broadcast address fails at once with EACCES (no SO_BROADCAST): the kernel
    // refuses it before any packet could leave, so nothing is sent anywhere. Node hands that error
    // to connect()'s callback rather than emitting it; a send on the unconnected socket used to
    // throw outside any handler and end the process.
    const { proxy, port, records } = await proxyFor(FakeBalancer.of([9], { ip: '255.255.255.255' }));
    const c = await client();
    c.send('first', port, LO);
    c.send('second', port, LO);
    await waitUntil(() => records.some((r) => r.msg === 'udp session error'), 'the session error to be logged');
    await waitUntil(() => proxy.active() === 0, 'the session to end');
    c.send('third', port, LO);
    await waitUntil(() => proxy.stats.udpDatagrams === 3, 'the next datagram to be taken');
    await waitUntil(() => proxy.active() === 0, 'its session to end too');
    // Still alive and serving: a working endpoint behind the same listener answers.
    const e = await echo(LO, 'ok');
    const good = await proxyFor(FakeBalancer.of([e.port]));
    expect((await udpAsk(await client(), good.port, LO, 'hi')).msg.toString()).toBe('ok:hi');
  });
});

describe('UdpProxySocket: sessions', () => {
  it('expires a session after the idle timeout, on the sweep', async () => {
    const e = await echo();
    const balancer = FakeBalancer.of([e.port]);
    const { proxy, port } = await proxyFor(balancer);
    const c = await client();

    const before = performance.now(); // the session's last activity is no earlier than this
    await udpAsk(c, port, LO, 'ping');
    const after = performance.now(); // ... and no later than this

    proxy.sweep(before + IDLE_MS - 1);
    expect(proxy.active()).toBe(1);
    proxy.sweep(after + IDLE_MS + SWEEP_PERIOD_MS);
    expect(proxy.active()).toBe(0);
    expect(proxy.stats.udpSessionsActive).toBe(0);
    expect(balancer.released).toEqual([`${LO}:${e.port}`]);
    await withDeadline(proxy.drained(), 1000, 'drained');

    // The client's next datagram opens a fresh session.
    expect((await udpAsk(c, port, LO, 'again')).msg.toString()).toBe('again');
    expect(proxy.stats.udpSessionsCreated).toBe(2);
  });

  it('past maxSessions, reclaims the least recently active session and says so', async () => {
    const e = await echo();
    const { proxy, port, records } = await proxyFor(FakeBalancer.of([e.port]), { maxSessions: 2 });
    const [c1, c2, c3] = [await client(), await client(), await client()] as const;

    await udpAsk(c1, port, LO, '1');
    await udpAsk(c2, port, LO, '2');
    await udpAsk(c1, port, LO, '1 again'); // now c2 is the least recently active
    await udpAsk(c3, port, LO, '3');

    expect(proxy.active()).toBe(2);
    expect(proxy.stats).toMatchObject({ udpSessionsReclaimed: 1, udpSessionsCreated: 3 });
    expect(records.filter((r) => r.msg.includes('least recently active session reclaimed'))).toHaveLength(1);
    // c1 kept its session; c2 lost its own and gets a new one.
    await udpAsk(c1, port, LO, '1 still');
    expect(proxy.stats.udpSessionsCreated).toBe(3);
    await udpAsk(c2, port, LO, '2 back');
    expect(proxy.stats.udpSessionsCreated).toBe(4);
  });

  it('ends a session on ICMP port unreachable and re-picks with sessionAffinityReset', async () => {
    const dead = await closedUdpPort();
    const e = await echo(LO, 'live');
    // Sticky: without the reset flag the new session would go to the dead endpoint again.
    const balancer = FakeBalancer.of([dead, e.port], { sticky: true });
    const { proxy, port, records } = await proxyFor(balancer);
    const c = await client();

    c.send('into the void', port, LO);
    await waitUntil(() => proxy.stats.udpSessionsCreated === 1 && proxy.active() === 0, 'the refused session to end');
    expect((await udpAsk(c, port, LO, 'retry')).msg.toString()).toBe('live:retry');
    expect(balancer.calls.map((x) => [x.reset, x.picked])).toEqual([
      [false, `${LO}:${dead}`],
      [true, `${LO}:${e.port}`],
    ]);
    expect(balancer.released).toEqual([`${LO}:${dead}`]);
    expect(records.some((r) => r.msg === 'endpoint refused: udp session ended')).toBe(true);
  });
});

describe('UdpProxySocket: lifecycle', () => {
  it('serves several listeners; destroyAll ends sessions but keeps listening; close ends all', async () => {
    const e = await echo();
    const { proxy, port } = await proxyFor(FakeBalancer.of([e.port]));
    const second = await proxy.listen({ host: LO, port: 0 });
    expect(proxy.addresses()).toEqual([{ host: LO, port }, second]);
    const c = await client();

    await udpAsk(c, port, LO, 'a');
    await udpAsk(c, second.port, LO, 'b'); // same client, other listener: its own session
    expect(proxy.active()).toBe(2);

    proxy.destroyAll();
    expect(proxy.active()).toBe(0);
    await withDeadline(proxy.drained(), 1000, 'drained');
    expect((await udpAsk(c, port, LO, 'c')).msg.toString()).toBe('c');

    await proxy.unlisten(second);
    await proxy.unlisten(second); // already gone is not a failure
    expect(proxy.addresses()).toEqual([{ host: LO, port }]);

    await proxy.close();
    expect(proxy.addresses()).toEqual([]);
    expect(proxy.active()).toBe(0);
    expect(proxy.stats.udpSessionsActive).toBe(0);
  });

  it('rejects listen() with the system error when the address is taken', async () => {
    const { proxy, port } = await proxyFor(new FakeBalancer([]));
    await expect(proxy.listen({ host: LO, port })).rejects.toMatchObject({ code: 'EADDRINUSE' });
    expect(proxy.addresses()).toHaveLength(1);
  });
});

/** The listener sockets and their sessions, which the proxy keeps to itself. */
interface Internals {
  listeners: Map<string, { socket: UdpSocket; sessions: Map<string, { lastActivity: number }> }>;
}
const internals = (proxy: UdpProxySocket): Internals => proxy as unknown as Internals;

/**
 * Counts reads of every open session's lastActivity from now on: how many sessions an operation
 * looks at (a scan reads every one). Writes are not counted.
 */
function countLooks(proxy: UdpProxySocket): { looks: number } {
  const counter = { looks: 0 };
  for (const listener of internals(proxy).listeners.values()) {
    for (const session of listener.sessions.values()) {
      let value = session.lastActivity;
      Object.defineProperty(session, 'lastActivity', {
        get: () => (counter.looks++, value),
        set: (v: number) => void (value = v),
        configurable: true,
        enumerable: true,
      });
    }
  }
  return counter;
}

/** Sends `count` datagrams of `size` bytes at once: the event loop cannot read any of them meanwhile. */
async function burst(port: number, count: number, size: number): Promise<void> {
  const c = await client();
  await new Promise<void>((resolve) => c.connect(port, LO, () => resolve()));
  const payload = Buffer.alloc(size, 1);
  for (let i = 0; i < count; i++) c.send(payload); // a connected send reaches the kernel at once
}

describe('UdpProxySocket: activity order', () => {
  it('reclaims the least recently active session, counting replies, not the oldest created', async () => {
    const [a, b, c] = [await echo(LO, 'A'), await echo(LO, 'B'), await echo(LO, 'C')];
    const balancer = FakeBalancer.of([a.port, b.port, c.port]);
    const { proxy, port } = await proxyFor(balancer, { maxSessions: 3 });
    // A remembers where its session socket is, to send it a datagram of its own.
    let aSession: { address: string; port: number } | undefined;
    a.socket.on('message', (_m, r) => (aSession = { address: r.address, port: r.port }));
    const [c1, c2, c3, c4, c5] = [await client(), await client(), await client(), await client(), await client()] as const;

    await udpAsk(c1, port, LO, '1'); // to A
    await udpAsk(c2, port, LO, '2'); // to B
    await udpAsk(c3, port, LO, '3'); // to C
    await udpAsk(c2, port, LO, '2 again');
    // Only the endpoint speaks: c1's session is now the most recently active.
    const pushed = new Promise<Buffer>((resolve) => c1.once('message', resolve));
    a.socket.send('news', aSession?.port as number, aSession?.address as string);
    expect((await withDeadline(pushed, 2000, 'the pushed datagram')).toString()).toBe('news');

    await udpAsk(c4, port, LO, '4'); // reclaims c3's session (to C): c3 < c2 < c1
    expect(balancer.released).toEqual([`${LO}:${c.port}`]);
    await udpAsk(c5, port, LO, '5'); // then c2's (to B), which was active before c1's push
    expect(balancer.released).toEqual([`${LO}:${c.port}`, `${LO}:${b.port}`]);
    expect(proxy.stats).toMatchObject({ udpSessionsReclaimed: 2, udpSessionsCreated: 5 });
    expect((await udpAsk(c1, port, LO, 'still')).msg.toString()).toBe('A:still');
    expect(proxy.stats.udpSessionsCreated).toBe(5);
  });

  it('neither a reclaim nor the idle sweep looks at every session', async () => {
    const N = 64;
    const e = await echo();
    const { proxy, port } = await proxyFor(FakeBalancer.of([e.port]), { maxSessions: N });
    const clients: UdpSocket[] = [];
    for (let i = 0; i < N; i++) clients.push(await client());
    for (const c of clients) await udpAsk(c, port, LO, 'hi');
    expect(proxy.active()).toBe(N);

    const counter = countLooks(proxy);
    await udpAsk(await client(), port, LO, 'one more'); // reclaims one
    expect(proxy.stats.udpSessionsReclaimed).toBe(1);
    expect(counter.looks).toBeLessThanOrEqual(2);

    counter.looks = 0;
    proxy.sweep(performance.now()); // none is idle
    expect(proxy.active()).toBe(N);
    expect(counter.looks).toBeLessThanOrEqual(2);

    counter.looks = 0;
    proxy.sweep(performance.now() + IDLE_MS); // all are
    expect(proxy.active()).toBe(0);
    expect(counter.looks).toBeLessThanOrEqual(2 * N);
  });
});

describe('UdpProxySocket: what is counted', () => {
  it('counts the bytes of datagrams sent on, not of those dropped when their session could not connect', async () => {
    // As above: connect() to the broadcast address fails at once, before anything is sent.
    const { proxy, port } = await proxyFor(FakeBalancer.of([9], { ip: '255.255.255.255' }));
    const c = await client();
    c.send('first', port, LO);
    await waitUntil(() => proxy.stats.udpDatagrams === 1 && proxy.active() === 0, 'the first session to fail');
    c.send('second', port, LO);
    await waitUntil(() => proxy.stats.udpDatagrams === 2 && proxy.active() === 0, 'the second session to fail');
    expect(proxy.stats).toMatchObject({ bytesToEndpoint: 0, udpDatagramsDropped: 2 });

    const e = await echo();
    const good = await proxyFor(FakeBalancer.of([e.port]));
    await udpAsk(c, good.port, LO, 'hello');
    expect(good.proxy.stats).toMatchObject({ bytesToEndpoint: 5, udpDatagramsDropped: 0 });
  });

  // Only a raw socket sends from port 0: root, and python3 to build the datagram.
  const rawSocketTool = process.getuid?.() === 0 && spawnSync('python3', ['-c', 'import socket'], { stdio: 'ignore' }).status === 0;
  it.skipIf(!rawSocketTool)('drops a datagram from source port 0, where no reply can go, and keeps serving', async () => {
    const e = await echo();
    const { proxy, port } = await proxyFor(FakeBalancer.of([e.port]));
    const script = [
      'import socket, struct, sys',
      'port = int(sys.argv[1])',
      's = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)',
      "s.sendto(struct.pack('!HHHH', 0, port, 12, 0) + b'zero', ('127.0.0.1', 0))",
    ].join('\n');
    await new Promise<void>((resolve, reject) => execFile('python3', ['-c', script, String(port)], { timeout: 10_000 }, (err) => (err ? reject(err) : resolve())));
    await waitUntil(() => proxy.stats.udpDatagrams === 1, 'the datagram from port 0');
    expect(proxy.stats).toMatchObject({ udpDatagramsDropped: 1, udpSessionsCreated: 0 });
    // Were it sent on, the endpoint's reply would be sent to port 0: dgram throws, out of a handler.
    expect((await udpAsk(await client(), port, LO, 'still here')).msg.toString()).toBe('still here');
    expect(e.sizes).toEqual([10]);
  });

  it('logs a flood of listener errors once, not once each', async () => {
    const { proxy, records } = await proxyFor(new FakeBalancer([]));
    const [listener] = [...internals(proxy).listeners.values()];
    // As a receive error on every datagram of a flood would come.
    for (let i = 0; i < 50; i++) listener?.socket.emit('error', Object.assign(new Error('recvmsg ENOBUFS'), { code: 'ENOBUFS' }));
    const logged = records.filter((r) => r.msg === 'listener error');
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatchObject({ suppressed: 0, err: { code: 'ENOBUFS' } });
  });
});

describe('UdpProxySocket: the listener\'s receive buffer', () => {
  const rmemMax = Number(readFileSync('/proc/sys/net/core/rmem_max', 'utf8'));

  // 20 datagrams of 50 kB (some 1.3 MB as the kernel charges them) fit in a buffer of 2 MiB or
  // more; the kernel's default (about 208 KiB) holds three of them. Only as big as rmem_max allows.
  it.skipIf(rmemMax < 1024 * 1024)('takes a 1 MB burst whole while the event loop is busy', async () => {
    const sink = await client(); // an endpoint that never answers
    const { proxy, port } = await proxyFor(FakeBalancer.of([sink.address().port]));
    await burst(port, 20, 50_000);
    await waitUntil(() => proxy.stats.udpDatagrams === 20, 'all 20 datagrams to be read');
    expect(proxy.stats.bytesToEndpoint).toBe(20 * 50_000);
  });

  it('counts what the kernel dropped from a full receive buffer, when asked (at scrape time)', async () => {
    const { logger } = captureLogger('debug');
    const receiveBuffers = new UdpReceiveBuffers({ logger });
    const sink = await client();
    const { proxy, port } = await proxyFor(FakeBalancer.of([sink.address().port]), { receiveBuffers });
    // More than any listener's buffer can hold: Linux grants at most twice what is asked.
    const count = Math.ceil((3 * LISTENER_RECV_BUFFER_BYTES) / 60_000);
    await burst(port, count, 60_000);
    expect(proxy.stats.udpReceiveBufferDrops).toBe(0); // nothing is read on the data path
    await receiveBuffers.refresh();
    const drops = proxy.stats.udpReceiveBufferDrops;
    expect(drops).toBeGreaterThan(0);
    // Every datagram was either dropped by the kernel or read by the proxy.
    await waitUntil(() => proxy.stats.udpDatagrams + drops === count, 'the rest to be read');
    await receiveBuffers.refresh();
    expect(proxy.stats.udpReceiveBufferDrops).toBe(drops); // counted once
  });

  it('says once, at debug, that the kernel granted less than asked', async () => {
    const { logger, records } = captureLogger('debug');
    // Linux grants at most net.core.rmem_max (and reports twice that).
    const receiveBuffers = new UdpReceiveBuffers({ logger, bytes: rmemMax + 4096 });
    const { proxy, port } = await proxyFor(new FakeBalancer([]), { receiveBuffers });
    await proxy.listen({ host: LO, port: 0 });
    const said = records.filter((r) => r.msg.includes('receive buffers are smaller than asked'));
    expect(said).toHaveLength(1);
    expect(said[0]).toMatchObject({ level: 20, asked: rmemMax + 4096, granted: 2 * rmemMax });
    // The listener works all the same.
    expect(proxy.addresses().map((a) => a.port)).toContain(port);
  });

  it('reads the drops of unconnected sockets from /proc/net/udp and udp6, by local address', () => {
    // Captured on Linux 6.x (x86-64), plus two lines written by hand: 10.96.0.10:53 and [fd00::a]:53.
    const udp = `   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops            
  594: 0100007F:8CAB 0100007F:DF48 01 00000000:00000000 00:00000000 00000000     0        0 169338 2 000000002ca1661b 0        
 5359: 0100007F:DF48 00000000:0000 07 00000000:00032DC0 00:00000000 00000000     0        0 169336 2 00000000f3035a89 30       
  100: 0A00600A:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 169400 2 0000000000000000 7
   12: 00000000:0044 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 169401 2 0000000000000000 0
`;
    const udp6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  614: 00000000000000000000000001000000:8CBF 00000000000000000000000001000000:D4F3 01 00000000:00000000 00:00000000 00000000     0        0 169339 2 0000000037d1ad59 0
 2714: 00000000000000000000000001000000:D4F3 00000000000000000000000000000000:0000 07 00000000:00032DC0 00:00000000 00000000     0        0 169337 2 00000000ad039c28 30
  300: 000000FD00000000000000000A000000:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 169402 2 0000000000000000 1
  301: this line is not one
`;
    const table = parseProcNetUdp(udp6, parseProcNetUdp(udp, new Map(), 'LE'), 'LE');
    // The connected sockets (remote address set) are left out.
    expect(Object.fromEntries(table)).toEqual({
      '127.0.0.1:57160': 30,
      '10.96.0.10:53': 7,
      '0.0.0.0:68': 0,
      '[::1]:54515': 30,
      '[fd00::a]:53': 1,
    });
    // A big-endian kernel prints the bytes in order.
    expect(Object.fromEntries(parseProcNetUdp(udp.replace('0A00600A', '0A60000A'), new Map(), 'BE'))).toMatchObject({ '10.96.0.10:53': 7 });
  });
});
