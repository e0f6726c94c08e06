import { randomBytes } from 'node:crypto';
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import type { LoadBalancer } from '../src/core/balancer/load-balancer.js';
import { toEndpoint, type Endpoint } from '../src/core/model.js';
import { PortForwardDialer } from '../src/io/port-forward/port-forward-dialer.js';
import { HttpTunnelOpener, type OpenedTunnel, type TunnelOpener, type TunnelTransport } from '../src/io/port-forward/tunnel-opener.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { captureLogger, connectTo, tcpBackend, waitUntil, withDeadline, type LogRecord, type TcpBackend } from './helpers/proxy-fixtures.js';
import { seeded } from './helpers/seeded.js';

/**
 * The port-forward dialer behind a real TcpProxySocket, against the fixture API server's
 * pods/portforward (SPDY and WebSocket, checked with kubectl in port-forward-kubectl.test.ts), to
 * loopback "pods". Every connection goes client -> proxy -> tunnel (SPDY over the transport) ->
 * fixture kubelet -> the pod's backend, and back.
 */

const LO = '127.0.0.1';
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

interface Setup {
  api: FakeApiServer;
  dialer: PortForwardDialer;
  proxy: TcpProxySocket;
  port: number;
  records: LogRecord[];
  /** The fake clock the tunnels' sweep reads. */
  clock: { ms: number };
}

/** An echo backend whose replies start with `name:` (so the client knows which pod answered). */
async function pod(name: string): Promise<TcpBackend> {
  const b = await tcpBackend(LO, (s) => {
    s.write(`${name}:`);
    s.pipe(s);
  });
  cleanups.push(() => b.close());
  return b;
}

/** Endpoints for pods `default/<name>` at pod port 80; their IPs are never dialed. */
function endpoints(names: string[]): Endpoint[] {
  return names.map((name, i) => toEndpoint({ ip: `10.244.0.${i + 10}`, port: 80, targetPod: { namespace: 'default', name } }));
}

async function setup(opts: { transport?: TunnelTransport; balancer?: LoadBalancer; pods?: Record<string, number>; dialTimeoutsMs?: number[] } = {}): Promise<Setup> {
  const api = await FakeApiServer.start();
  cleanups.push(() => api.close());
  for (const [name, port] of Object.entries(opts.pods ?? {})) api.portForward.addPod('default', name, { 80: port });
  const { logger, records } = captureLogger('debug');
  const clock = { ms: 0 };
  const opener = new HttpTunnelOpener({ kc: api.kubeConfig(), logger, transport: opts.transport ?? 'auto' });
  const dialer = new PortForwardDialer({ opener, logger, now: () => clock.ms });
  cleanups.push(() => dialer.close());
  const balancer = opts.balancer ?? new FakeBalancer(endpoints(Object.keys(opts.pods ?? {})));
  const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer, logger, ...(opts.dialTimeoutsMs ? { dialTimeoutsMs: opts.dialTimeoutsMs } : {}) });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  const { port } = await proxy.listen({ host: LO, port: 0 });
  return { api, dialer, proxy, port, records, clock };
}

/** Write `data`, read the reply up to `expect` bytes, then end and wait for the end. */
async function talk(port: number, data: Buffer | string, expectBytes: number, timeoutMs = 10_000): Promise<Buffer> {
  const { socket, got } = await connectTo(port);
  socket.write(data);
  await got.until(expectBytes, timeoutMs);
  socket.end();
  const all = await withDeadline(got.ended, timeoutMs, 'the end of the reply');
  socket.destroy();
  return all;
}

const drained = (proxy: TcpProxySocket): Promise<void> => withDeadline(proxy.drained(), 10_000, 'the proxy to drain');

for (const transport of ['websocket', 'spdy'] as const) {
  describe(`port-forward dialer over ${transport}`, () => {
    it('carries 100 concurrent connections over one tunnel', async () => {
      const web = await pod('web-0');
      const s = await setup({ transport, pods: { 'web-0': web.port } });
      const payloads = Array.from({ length: 100 }, (_, i) => randomBytes(16 * 1024 + i));
      const replies = await Promise.all(payloads.map((p) => talk(s.port, p, p.length + 'web-0:'.length)));
      replies.forEach((r, i) => expect(r.equals(Buffer.concat([Buffer.from('web-0:'), payloads[i] as Buffer]))).toBe(true));
      expect(s.api.portForward.opened[transport]).toBe(1);
      expect(s.api.portForward.counters.forwards).toBe(100);
      expect(s.dialer.tunnelCount()).toBe(1);
      await drained(s.proxy);
      // One attempt each, but on a loaded machine a stream may miss its dial deadline and be tried
      // again (the retry is the behaviour under test elsewhere): none may fail for good.
      expect(s.proxy.stats).toMatchObject({ accepted: 100, dialExhausted: 0, active: 0 });
      expect(s.proxy.stats.dialAttempts).toBeGreaterThanOrEqual(100);
      expect(s.proxy.stats.dialAttempts).toBeLessThanOrEqual(105);
    });

    it('carries 10 MiB each way at once, byte-identical, on two connections', async () => {
      const web = await pod('web-0');
      const s = await setup({ transport, pods: { 'web-0': web.port } });
      const one = async (): Promise<void> => {
        const payload = randomBytes(10 * 1024 * 1024);
        const reply = await talk(s.port, payload, payload.length + 6, 30_000);
        expect(reply.subarray(6).equals(payload)).toBe(true);
      };
      await Promise.all([one(), one()]);
      expect(s.api.portForward.opened[transport]).toBe(1);
    });
  });
}

describe('port-forward dialer: failures on one stream', () => {
  it("tries the next pod when the error stream reports one, and keeps the failing pod's tunnel", async () => {
    const a = await pod('a');
    const b = await pod('b');
    const balancer = new FakeBalancer(endpoints(['a', 'b']));
    const s = await setup({ balancer, pods: { a: a.port, b: b.port } });
    // Warm a's tunnel, then make its next stream fail as a refused pod port does.
    expect((await talk(s.port, 'x', 3)).toString()).toBe('a:x');
    s.api.portForward.pods.get('default/a')?.failNext.push('failed to connect to localhost:80 inside namespace "a": connection refused');
    balancer.setEndpoints(endpoints(['a', 'b'])); // the next pick is a again
    expect((await talk(s.port, 'hello', 7)).toString()).toBe('b:hello');
    expect(s.api.portForward.counters.errors).toBe(1);
    // The client's bytes went to b: the first attempt failed after its bytes were sent to a.
    expect(balancer.calls.slice(1, 3).map((c) => [c.picked, c.reset])).toEqual([['10.244.0.10:80', false], ['10.244.0.11:80', true]]);
    // One stream's error never tears the tunnel down: a's tunnel serves the next connection.
    expect(s.api.portForward.tunnelCount('default/a')).toBe(1);
    expect((await talk(s.port, 'again', 7)).toString()).toMatch(/^[ab]:again$/);
    expect(s.api.portForward.opened.websocket).toBe(2);
    await drained(s.proxy);
    expect(s.proxy.stats.dialFailures.other).toBe(1);
  });

  it("tries the next pod when the pod's port refuses before any byte was relayed", async () => {
    const b = await pod('b');
    const balancer = new FakeBalancer(endpoints(['a', 'b']));
    const s = await setup({ balancer, pods: { b: b.port } });
    s.api.portForward.addPod('default', 'a', {}); // port 80 refuses
    expect((await talk(s.port, 'hi', 4)).toString()).toBe('b:hi');
    expect(s.api.portForward.counters.errors).toBe(1);
  });

  it('resets the client when the pod is deleted mid-connection, and the next connection reaches another pod', async () => {
    const a = await pod('a');
    const b = await pod('b');
    const balancer = new FakeBalancer(endpoints(['a', 'b']));
    const s = await setup({ balancer, pods: { a: a.port, b: b.port } });
    const { socket, got } = await connectTo(s.port);
    socket.write('before');
    await got.until(8);
    expect(got.bytes().toString()).toBe('a:before');
    s.api.portForward.deletePod('default', 'a');
    await expect(withDeadline(got.ended, 10_000, 'the reset')).rejects.toMatchObject({ code: 'ECONNRESET' });
    socket.destroy();
    // The balancer still names a (no watch here): its tunnel's new stream fails, b answers.
    expect((await talk(s.port, 'after', 7)).toString()).toBe('b:after');
    await drained(s.proxy);
  });

  it('opens a new tunnel for the next connection after the tunnel dropped', async () => {
    const web = await pod('web-0');
    const s = await setup({ pods: { 'web-0': web.port } });
    const { socket, got } = await connectTo(s.port);
    socket.write('one');
    await got.until(9);
    expect(s.api.portForward.dropTunnels()).toBe(1);
    // The pod had spoken: the client is reset rather than sent elsewhere.
    await expect(withDeadline(got.ended, 10_000, 'the reset')).rejects.toMatchObject({ code: 'ECONNRESET' });
    socket.destroy();
    await waitUntil(() => s.records.some((r) => r.msg.startsWith('port-forward tunnel dropped')), 'the drop to be seen');
    expect((await talk(s.port, 'two', 9)).toString()).toBe('web-0:two');
    expect(s.api.portForward.opened.websocket).toBe(2);
    await drained(s.proxy);
  });

  it('re-dials on a new tunnel a connection whose tunnel dropped before the pod spoke', async () => {
    const silent = await tcpBackend(LO, (sock) => sock.resume()); // reads, never answers
    cleanups.push(() => silent.close());
    const web = await pod('web-1');
    const balancer = new FakeBalancer(endpoints(['web-0', 'web-1']));
    const s = await setup({ balancer, pods: { 'web-0': silent.port, 'web-1': web.port } });
    const { socket, got } = await connectTo(s.port);
    socket.write('waiting');
    await waitUntil(() => s.api.portForward.forwardCount() === 1, 'the forward to web-0');
    s.api.portForward.dropTunnels('default/web-0');
    await got.until('web-1:waiting'.length, 10_000);
    expect(got.bytes().toString()).toBe('web-1:waiting');
    socket.destroy();
    await drained(s.proxy);
  });
});

describe('port-forward dialer: backpressure', () => {
  it('stops the pod when the client does not read, and delivers every byte once it does', async () => {
    const total = 48 * 1024 * 1024;
    let accepted = 0;
    let sent = 0;
    // The pod offers `total` bytes as fast as its socket takes them.
    const firehose = await tcpBackend(LO, (sock) => {
      const chunk = Buffer.alloc(64 * 1024, 0x5a);
      const pump = (): void => {
        while (sent < total) {
          sent += chunk.length;
          if (!sock.write(chunk)) return;
        }
        sock.end();
      };
      sock.on('drain', pump);
      sock.resume();
      pump();
      const tick = setInterval(() => (accepted = sock.bytesWritten - sock.writableLength), 20);
      sock.on('close', () => clearInterval(tick));
    });
    cleanups.push(() => firehose.close());
    const s = await setup({ pods: { 'web-0': firehose.port } });
    const { socket, got } = await connectTo(s.port);
    socket.pause();
    socket.write('go');
    // Wait until the pod is held back: what it got out has not grown for half a second.
    let last = -1;
    let since = performance.now();
    await waitUntil(() => {
      if (accepted !== last) {
        last = accepted;
        since = performance.now();
      }
      return accepted > 0 && performance.now() - since > 500;
    }, 'the pod to be held back', 20_000);
    expect(accepted).toBeLessThan(total);
    // What is in flight sits in the kernel's buffers on each loopback hop (some 13 MiB here),
    // and the proxy stops reading the tunnel once a stream queues 256 KiB.
    socket.resume();
    await withDeadline(got.ended, 30_000, 'every byte');
    expect(got.bytes().length).toBe(total);
    socket.destroy();
  });

  it('stops the client when the pod does not read, and delivers every byte once it does', async () => {
    const total = 32 * 1024 * 1024;
    let received = 0;
    let podSocket: Socket | undefined;
    const sink = await tcpBackend(LO, (sock) => {
      podSocket = sock;
      sock.pause();
      sock.on('data', (d: Buffer) => (received += d.length));
      sock.on('end', () => sock.end('done'));
    });
    cleanups.push(() => sink.close());
    const s = await setup({ pods: { 'web-0': sink.port } });
    const { socket } = await connectTo(s.port);
    const chunk = Buffer.alloc(64 * 1024, 0x33);
    let offered = 0;
    const pump = (): void => {
      while (offered < total) {
        offered += chunk.length;
        if (!socket.write(chunk)) return;
      }
      socket.end();
    };
    socket.on('drain', pump);
    pump();
    await waitUntil(() => podSocket !== undefined, 'the pod connection');
    // The client is held back: what its socket took stops growing well short of the total.
    let last = -1;
    let since = performance.now();
    const accepted = (): number => socket.bytesWritten - socket.writableLength;
    await waitUntil(() => {
      if (accepted() !== last) {
        last = accepted();
        since = performance.now();
      }
      return performance.now() - since > 500;
    }, 'the client to be held back', 20_000);
    expect(accepted()).toBeLessThan(total);
    podSocket?.resume();
    await waitUntil(() => received === total, 'every byte at the pod', 30_000);
    socket.destroy();
  });
});

describe('port-forward dialer: round-robin', () => {
  it('spreads connections over three pods in turn', async () => {
    // Pods that answer and end at once: a forward then ends without containerd's second of grace.
    const once = async (name: string): Promise<number> => {
      const b = await tcpBackend(LO, (sock) => sock.once('data', () => sock.end(`${name}:.`)));
      cleanups.push(() => b.close());
      return b.port;
    };
    const pods = { 'web-0': await once('web-0'), 'web-1': await once('web-1'), 'web-2': await once('web-2') };
    const balancer = new RoundRobinBalancer({ clock: { now: () => 0 }, random: seeded(7) });
    balancer.setEndpoints(endpoints(Object.keys(pods)));
    const s = await setup({ balancer, pods });
    const seen: string[] = [];
    for (let i = 0; i < 9; i++) seen.push((await talk(s.port, '.', 7)).toString().split(':')[0] as string);
    expect(seen.slice(0, 3).sort()).toEqual(['web-0', 'web-1', 'web-2']);
    expect(seen.slice(3)).toEqual([...seen.slice(0, 3), ...seen.slice(0, 3)]);
    expect(s.api.portForward.opened.websocket).toBe(3);
  });
});

describe('port-forward dialer: transports', () => {
  it('falls back to the SPDY upgrade when the API server does not tunnel WebSockets, and says so once', async () => {
    const pods = { 'web-0': (await pod('web-0')).port, 'web-1': (await pod('web-1')).port };
    const s = await setup({ pods });
    s.api.portForward.websockets = false;
    expect((await talk(s.port, 'a', 7)).toString()).toMatch(/^web-[01]:a$/);
    expect((await talk(s.port, 'b', 7)).toString()).toMatch(/^web-[01]:b$/);
    expect(s.api.portForward.opened).toEqual({ websocket: 0, spdy: 2 });
    // Learned once: the second pod's tunnel went straight to SPDY.
    expect(s.api.portForward.refused.map((r) => r.status)).toEqual([400]);
    expect(s.records.filter((r) => r.msg.includes('does not tunnel port-forward over WebSocket'))).toHaveLength(1);
  });

  it('uses SPDY when RBAC grants create but not get on pods/portforward', async () => {
    const s = await setup({ pods: { 'web-0': (await pod('web-0')).port } });
    s.api.portForward.forbiddenGet.add('default');
    expect((await talk(s.port, 'a', 7)).toString()).toBe('web-0:a');
    expect(s.api.portForward.opened).toEqual({ websocket: 0, spdy: 1 });
  });

  it('says once which RBAC grant is missing when pods/portforward is forbidden', async () => {
    const s = await setup({ pods: { 'web-0': (await pod('web-0')).port }, dialTimeoutsMs: [2000, 2000] });
    s.api.portForward.forbidden.add('default');
    for (let i = 0; i < 2; i++) {
      const { socket, got } = await connectTo(s.port);
      socket.write('x');
      await expect(withDeadline(got.ended, 10_000, 'the reset')).rejects.toMatchObject({ code: 'ECONNRESET' });
      socket.destroy();
    }
    const lines = s.records.filter((r) => r.msg.startsWith('forbidden:'));
    expect(lines).toHaveLength(1);
    expect(lines[0]?.msg).toBe('forbidden: cannot create pods/portforward in namespace default: grant get and create on pods/portforward there (deploy/developer/port-forward-role.yaml)');
  });
});

describe('port-forward dialer: the tunnel over time', () => {
  it('pings a quiet tunnel, fails one that does not answer, and opens a new one for the next connection', async () => {
    const web = await pod('web-0');
    const s = await setup({ pods: { 'web-0': web.port } });
    const { socket, got } = await connectTo(s.port);
    socket.write('x');
    await got.until(7);
    s.clock.ms += 10_000;
    s.dialer.sweep();
    await waitUntil(() => s.api.portForward.counters.pings === 1, 'a PING');
    s.api.portForward.freeze('default/web-0');
    s.clock.ms += 10_000;
    s.dialer.sweep(); // a second PING goes out, unanswered
    s.clock.ms += 31_000;
    s.dialer.sweep();
    await expect(withDeadline(got.ended, 10_000, 'the reset')).rejects.toMatchObject({ code: 'ECONNRESET' });
    socket.destroy();
    expect(s.records.some((r) => r.reason === 'tunnel-unresponsive')).toBe(true);
    expect((await talk(s.port, 'y', 7)).toString()).toBe('web-0:y');
    expect(s.api.portForward.opened.websocket).toBe(2);
  });

  it('closes a tunnel idle past its limit, and opens one again when needed', async () => {
    const web = await pod('web-0');
    const s = await setup({ pods: { 'web-0': web.port } });
    expect((await talk(s.port, 'x', 7)).toString()).toBe('web-0:x');
    await drained(s.proxy);
    s.dialer.sweep(); // idle from now
    s.clock.ms += 120_000;
    s.dialer.sweep();
    await waitUntil(() => s.api.portForward.tunnelCount() === 0, 'the tunnel to close');
    s.dialer.sweep();
    expect(s.dialer.tunnelCount()).toBe(0);
    expect((await talk(s.port, 'y', 7)).toString()).toBe('web-0:y');
    expect(s.api.portForward.opened.websocket).toBe(2);
  });
});

describe('closing the dialer', () => {
  it('closes a tunnel that finishes opening after dialer.close(), and dials nothing after it', async () => {
    // The tunnel's far end: a plain TCP server standing in for the API server's upgraded connection.
    const peers: Socket[] = [];
    const server = createServer((s) => {
      peers.push(s);
      s.on('error', () => undefined);
      s.resume();
    });
    await new Promise<void>((resolve) => server.listen(0, LO, resolve));
    cleanups.push(() => {
      for (const p of peers) p.destroy();
      server.close();
    });
    let release = (): void => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const opener: TunnelOpener = {
      async open(): Promise<OpenedTunnel> {
        await gate; // a slow API server: TLS, an exec credential plugin, the upgrade
        const pipe = connect((server.address() as AddressInfo).port, LO);
        await new Promise((resolve) => pipe.once('connect', resolve));
        return { pipe, transport: 'spdy' };
      },
    };
    const dialer = new PortForwardDialer({ opener, logger: captureLogger('warn').logger, sweepIntervalMs: 20 });
    const endpoint = toEndpoint({ ip: '10.244.0.1', port: 80, targetPod: { namespace: 'default', name: 'web-0' } });
    const request = { endpoint, clientAddress: LO, clientPort: 1, localAddress: LO, localPort: 2, timeoutMs: 10_000 };
    const dialed = dialer.dial(request);
    dialer.close(); // the proxy stopping, while the tunnel is still opening
    release();
    await expect(dialed).rejects.toMatchObject({ failure: 'tunnel-closed' });
    // The connection the opening made is closed, not left for a sweep that no longer runs.
    await waitUntil(() => peers.length === 1 && (peers[0]?.readableEnded === true || peers[0]?.destroyed === true), 'the late tunnel to be closed');
    await expect(dialer.dial(request)).rejects.toMatchObject({ failure: 'tunnel-closed' });
  });
});

