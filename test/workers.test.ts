import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, type Spawned } from './helpers/cli.js';
import { freePort, tcpEchoServer, tcpRequest, udpEchoServer, waitFor } from './helpers/net.js';
import { endpointSlice, list, service } from './helpers/objects.js';
import { boundUdp, udpAsk, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * `--workers 2` with the CLI as a black box, on loopback: connections reach both workers, ClientIP
 * affinity and UDP sessions hold across them, /metrics sums them, a worker killed with SIGKILL is
 * replaced while the other's connections live on, SIGTERM drains both, and a controller killed with
 * SIGKILL leaves no worker behind.
 */

const WEB = '127.96.61.1'; // loopback portal address of ClusterIP 10.96.61.1
const STICKY = '127.96.61.2';
const DNS = '127.96.61.3';
const BACKENDS = ['127.0.61.1', '127.0.61.2', '127.0.61.3'];

let dir: string;
let stateFile: string;
let webPort: number;
let stickyPort: number;
let dnsPort: number;
const closers: Array<() => unknown> = [];
const running: Spawned[] = [];

interface Figures {
  worker: number;
  pid: number | null;
  state: string;
  restarts: number;
  connectionsAccepted: number;
  udpDatagrams: number;
  active: number;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-workers-'));
  stateFile = join(dir, 'state.json');
  const tcp = await freePort(BACKENDS[0]);
  const udp = await freePort(BACKENDS[0]);
  for (const [i, host] of BACKENDS.entries()) {
    const t = await tcpEchoServer(host, `b${i}`, tcp);
    const u = await udpEchoServer(host, `b${i}`, udp);
    closers.push(() => t.close(), () => u.close());
  }
  webPort = await freePort(WEB);
  stickyPort = await freePort(STICKY);
  dnsPort = await freePort(DNS);
  const endpoints = (n: number): Array<{ ip: string }> => BACKENDS.slice(0, n).map((ip) => ({ ip }));
  await writeFile(stateFile, list([
    service({ name: 'web', clusterIP: '10.96.61.1', ports: [{ name: 'http', port: webPort, targetPort: tcp }] }),
    endpointSlice({ service: 'web', ports: [{ name: 'http', port: tcp }], endpoints: endpoints(2) }),
    service({ name: 'sticky', clusterIP: '10.96.61.2', sessionAffinity: 'ClientIP', timeoutSeconds: 600, ports: [{ name: 'http', port: stickyPort, targetPort: tcp }] }),
    endpointSlice({ service: 'sticky', ports: [{ name: 'http', port: tcp }], endpoints: endpoints(3) }),
    service({ name: 'dns', clusterIP: '10.96.61.3', ports: [{ name: 'dns', port: dnsPort, protocol: 'UDP', targetPort: udp }] }),
    endpointSlice({ service: 'dns', ports: [{ name: 'dns', port: udp, protocol: 'UDP' }], endpoints: endpoints(2) }),
  ]));
});

afterAll(async () => {
  for (const r of running) r.kill();
  for (const c of closers) await c();
  await rm(dir, { recursive: true, force: true });
});

interface Proxy {
  r: Spawned;
  admin: string;
}

/** Starts the CLI with two workers; resolves once every Service is served by both. */
async function start(extra: string[] = [], opts: { detached?: boolean } = {}): Promise<Proxy> {
  const r = runCli(['--state', stateFile, '--workers', '2', '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--iptables-min-sync-period', '0s', ...extra], opts);
  running.push(r);
  const line = await r.waitForLine(/kube-userspace-proxy started/);
  const started = JSON.parse(line) as { admin: string; workers: number };
  expect(started.workers).toBe(2);
  const p = { r, admin: started.admin };
  await waitFor(async () => (await workers(p)).every((w) => w.state === 'ready'), 'both workers to serve');
  return p;
}

async function workers(p: Proxy): Promise<Figures[]> {
  return ((await (await fetch(`http://${p.admin}/workers`)).json()) as { workers: Figures[] }).workers;
}

async function metrics(p: Proxy): Promise<string> {
  return (await fetch(`http://${p.admin}/metrics`)).text();
}

/** One sample of /metrics, or undefined. */
function sample(text: string, name: string, labels = ''): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels === '' ? ' ' : `{${labels}`}`) || (labels === '' && l.startsWith(`${name} `)));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

function gone(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return false;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ESRCH';
  }
}

/** A connection through the proxy, held open after the backend's greeting (`bN:`). */
async function hold(host: string, port: number): Promise<{ socket: Socket; backend: string; ended: Promise<string> }> {
  const socket = connect({ host, port, allowHalfOpen: true });
  const ended = new Promise<string>((resolve) => {
    socket.once('end', () => resolve('end'));
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
    socket.once('close', () => resolve('close'));
  });
  const greeting = await withDeadline(new Promise<string>((resolve, reject) => {
    socket.once('data', (d: Buffer) => resolve(d.toString()));
    socket.once('error', reject);
  }), 5000, 'the backend to greet');
  return { socket, backend: greeting.split(':')[0] as string, ended };
}

/** Whether a held connection still carries bytes both ways (the echo comes back), or has ended. */
function echoes(c: { socket: Socket; ended: Promise<string> }): Promise<boolean> {
  const reply = new Promise<boolean>((resolve) => c.socket.once('data', (d: Buffer) => resolve(d.toString() === 'ping')));
  c.socket.write('ping');
  return withDeadline(Promise.race([reply, c.ended.then(() => false)]), 5000, 'an echo or the end');
}

describe('--workers 2', () => {
  let proxy: Proxy;

  beforeAll(async () => {
    proxy = await start();
  }, 30_000);

  // Its workers listen with SO_REUSEPORT: a proxy left running would share the ports with the next.
  afterAll(async () => {
    proxy.r.child.kill('SIGTERM');
    await withDeadline(proxy.r.exited, 20_000, 'the proxy to exit');
  }, 30_000);

  it('connections reach both workers, round-robin stays within one per worker, and /metrics sums the workers', async () => {
    const before = await workers(proxy);
    const byBackend = new Map<string, number>();
    for (let i = 0; i < 40; i++) {
      const reply = await tcpRequest(WEB, webPort, 'x');
      const name = reply.split(':')[0] as string;
      byBackend.set(name, (byBackend.get(name) ?? 0) + 1);
    }
    const after = await workers(proxy);
    const took = after.map((w, i) => w.connectionsAccepted - (before[i]?.connectionsAccepted ?? 0));
    expect(took.every((n) => n > 0)).toBe(true);
    expect(took.reduce((a, b) => a + b, 0)).toBe(40);
    // Each worker alternates strictly between the two endpoints: node-wide they differ by at most 2.
    expect([...byBackend.keys()].sort()).toEqual(['b0', 'b1']);
    expect(Math.abs((byBackend.get('b0') ?? 0) - (byBackend.get('b1') ?? 0))).toBeLessThanOrEqual(2);
    const text = await metrics(proxy);
    expect(sample(text, 'kube_userspace_proxy_connections_accepted_total', 'service_port="default/web:http"')).toBe(40);
    const perWorker = [0, 1].map((w) => sample(text, 'kube_userspace_proxy_worker_connections_accepted_total', `worker="${w}"`) ?? NaN);
    expect(perWorker).toEqual(after.map((w) => w.connectionsAccepted));
    expect(sample(text, 'kube_userspace_proxy_workers')).toBe(2);
  });

  it('ClientIP affinity holds whichever worker accepts the connection', async () => {
    const before = await workers(proxy);
    const seen = new Set<string>();
    for (let i = 0; i < 30; i++) seen.add((await tcpRequest(STICKY, stickyPort, 'x')).split(':')[0] as string);
    const after = await workers(proxy);
    expect(seen.size).toBe(1);
    expect(after.every((w, i) => w.connectionsAccepted > (before[i]?.connectionsAccepted ?? 0))).toBe(true);
  });

  it("a UDP client's session stays on one worker: one session per client, node-wide", async () => {
    const before = await workers(proxy);
    const text0 = await metrics(proxy);
    const sessions0 = sample(text0, 'kube_userspace_proxy_udp_sessions_total', 'service_port="kube-system/dns:dns"') ?? sample(text0, 'kube_userspace_proxy_udp_sessions_total', 'service_port="default/dns:dns"') ?? 0;
    const clients = await Promise.all(Array.from({ length: 8 }, () => boundUdp('127.0.0.1')));
    try {
      for (const c of clients) {
        const from = new Set<string>();
        for (let i = 0; i < 5; i++) from.add((await udpAsk(c, dnsPort, DNS, `q${i}`)).msg.toString().split(':')[0] as string);
        expect(from.size).toBe(1);
      }
    } finally {
      for (const c of clients) c.close();
    }
    const text = await metrics(proxy);
    expect((sample(text, 'kube_userspace_proxy_udp_sessions_total', 'service_port="default/dns:dns"') ?? 0) - sessions0).toBe(8);
    expect(sample(text, 'kube_userspace_proxy_udp_datagrams_total', 'service_port="default/dns:dns"')).toBe(40);
    const after = await workers(proxy);
    expect(after.reduce((n, w, i) => n + w.udpDatagrams - (before[i]?.udpDatagrams ?? 0), 0)).toBe(40);
  });

  it("a worker killed with SIGKILL is replaced; the other's connections live on; the count of its own is kept", async () => {
    // A worker's `active` counts UDP sessions too: let the earlier test's idle out first.
    await waitFor(async () => sample(await metrics(proxy), 'kube_userspace_proxy_udp_sessions_active', 'service_port="default/dns:dns"') === 0, 'UDP sessions to idle out');
    const held = [];
    for (let i = 0; i < 20; i++) held.push(await hold(WEB, webPort));
    try {
      const before = await workers(proxy);
      expect(before.map((w) => w.active).every((n) => n > 0)).toBe(true);
      const acceptedBefore = sample(await metrics(proxy), 'kube_userspace_proxy_connections_accepted_total', 'service_port="default/web:http"') as number;
      const victim = before[0] as Figures;
      process.kill(victim.pid as number, 'SIGKILL');
      await proxy.r.waitForLine(/worker exited/);
      const outcomes = await Promise.all(held.map((c) => echoes(c)));
      // Exactly the killed worker's connections ended; every one of the other's still echoes.
      expect(outcomes.filter((ok) => ok)).toHaveLength((before[1] as Figures).active);
      expect(outcomes.filter((ok) => !ok)).toHaveLength(victim.active);
      await waitFor(async () => (await workers(proxy))[0]?.state === 'ready', 'the replacement to serve');
      const after = await workers(proxy);
      expect(after[0]?.pid).not.toBe(victim.pid);
      expect(after[0]?.restarts).toBe(1);
      expect(after[1]?.pid).toBe(before[1]?.pid);
      expect(gone(victim.pid as number)).toBe(true);
      for (let i = 0; i < 20; i++) expect(await tcpRequest(WEB, webPort, 'again')).toMatch(/^b[01]:again$/);
      const text = await metrics(proxy);
      expect(sample(text, 'kube_userspace_proxy_worker_restarts_total')).toBe(1);
      expect(sample(text, 'kube_userspace_proxy_connections_accepted_total', 'service_port="default/web:http"')).toBe(acceptedBefore + 20);
      const line = JSON.parse(proxy.r.stdout().split('\n').find((l) => l.includes('worker exited')) as string) as Record<string, unknown>;
      expect(line).toMatchObject({ worker: 0, pid: victim.pid, signal: 'SIGKILL' });
    } finally {
      for (const c of held) c.socket.destroy();
    }
  });
});

describe('--workers 2 stopping', () => {
  it('SIGTERM: both workers stop accepting, let their connections finish, then all exit 0', async () => {
    const p = await start(['--shutdown-grace-period', '60s']);
    const held = [];
    for (let i = 0; i < 20; i++) held.push(await hold(WEB, webPort));
    const figures = await workers(p);
    expect(figures.every((w) => w.active > 0)).toBe(true);
    p.r.child.kill('SIGTERM');
    await p.r.waitForLine(/shutting down/);
    await waitFor(() => new Promise<boolean>((resolve) => {
      const s = connect({ host: WEB, port: webPort });
      s.once('connect', () => {
        s.destroy();
        resolve(false);
      });
      s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
    }), 'new connections to be refused');
    // Every established connection, on either worker, still carries bytes, then ends cleanly.
    for (const c of held) expect(await echoes(c)).toBe(true);
    for (const c of held) c.socket.end();
    for (const c of held) expect(await withDeadline(c.ended, 5000, 'the connection to end')).toBe('end');
    expect(await withDeadline(p.r.exited, 20_000, 'the proxy to exit')).toBe(0);
    expect(p.r.stdout()).toMatch(/"cut":0,"msg":"stopped"/);
    expect(p.r.stdout().split('\n').filter((l) => l.includes('worker drained'))).toHaveLength(2);
    for (const w of figures) expect(gone(w.pid as number)).toBe(true);
  });

  it("Ctrl-C (SIGINT to the whole process group) drains through the controller: the workers do not just die", async () => {
    // Its own process group, as a shell gives a foreground job: the signal reaches every process in it.
    const p = await start(['--shutdown-grace-period', '60s'], { detached: true });
    const held = [];
    for (let i = 0; i < 10; i++) held.push(await hold(WEB, webPort));
    expect((await workers(p)).every((w) => w.active > 0)).toBe(true);
    process.kill(-(p.r.child.pid as number), 'SIGINT');
    await p.r.waitForLine(/shutting down/);
    for (const c of held) expect(await echoes(c)).toBe(true);
    for (const c of held) c.socket.end();
    for (const c of held) expect(await withDeadline(c.ended, 5000, 'the connection to end')).toBe('end');
    expect(await withDeadline(p.r.exited, 20_000, 'the proxy to exit')).toBe(0);
    expect(p.r.stdout()).toMatch(/"cut":0,"msg":"stopped"/);
  });

  it('a controller killed with SIGKILL leaves no worker behind, and a restart serves', async () => {
    const first = await start();
    const pids = (await workers(first)).map((w) => w.pid as number);
    first.r.child.kill('SIGKILL');
    expect(await first.r.exited).toBe('SIGKILL');
    await waitFor(() => pids.every(gone), 'the workers to exit', 5000);
    const second = await start();
    expect(await tcpRequest(WEB, webPort, 'back')).toMatch(/^b[01]:back$/);
    second.r.child.kill('SIGTERM');
    expect(await withDeadline(second.r.exited, 20_000, 'the proxy to exit')).toBe(0);
  });
});
