import { writeFile } from 'node:fs/promises';
import { createConnection, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Spawned } from './helpers/cli.js';
import { waitFor } from './helpers/net.js';
import { startLoad, type Load, type LoadOptions, type LoadResult } from './helpers/handover-load.js';
import { createHandoverNode, handoverState, HO, loggedPid, type HandoverNode } from './helpers/handover-node.js';
import { iptablesSkipReason, netnsSkipReason, nsExec, nsRequest, reportSkip } from './helpers/netns.js';

/**
 * `--handover-socket`: restarts that drop no connection (docs/handover.md). Real proxy processes
 * (the built CLI) in a network namespace each test creates, where the proxy turns on
 * net.ipv4.tcp_migrate_req; the clients run in the same namespace (test/helpers/handover-load.ts).
 *
 * The Done-when numbers (1,000 long-lived connections, 20 restarts) run with HANDOVER_FULL=1;
 * CI runs fewer, which exercise the same swaps.
 */
reportSkip('handover.test.ts', netnsSkipReason);

const FULL = process.env.HANDOVER_FULL === '1';

interface Logged {
  msg?: string;
  [k: string]: unknown;
}

/** The proxy's JSON log lines whose msg is `msg`. */
function logged(p: Spawned, msg: RegExp): Logged[] {
  return p.stdout().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Logged).filter((l) => typeof l.msg === 'string' && msg.test(l.msg));
}

function loadOptions(host: string, long: number, maxSeconds: number): LoadOptions {
  // A line every 200 ms on each long-lived connection; every second with HANDOVER_FULL's 1,000 (the
  // machine has two cores, shared).
  // UDP: new flows (each query a session of its own, which hand-overs move to the successor) and
  // flows that keep one session across the swaps (which stay on the process that opened them).
  return { host, tcpPort: HO.tcpPort, udpPort: HO.udpPort, long, chunkMs: FULL ? 1000 : 200, shortConcurrency: 4, maxShort: 500_000, maxUdp: 100_000, udpWaitMs: 300, udpTries: 5, udpConcurrency: 3, udpPersistent: 6, maxSeconds };
}

/**
 * What a client must never see across a hand-over. No UDP datagram is lost: the old process serves
 * what its listeners had queued, and its sessions reply through sockets of their own. (A query
 * retried because its first answer came late, on a busy machine, is not a loss; udpLost counts the
 * tries never answered, even late.)
 */
function expectClean(r: LoadResult, long: number): void {
  expect({ ...r, udpOk: undefined, udpRetried: undefined, udpRetries: undefined, udpLate: undefined, shortOk: undefined, longBytes: undefined }).toEqual({
    longOpened: long, longCompleted: long, longErrors: [], longMismatch: 0,
    shortRefused: 0, shortReset: 0, shortOther: [], shortMismatch: 0,
    udpFailed: 0, udpLost: 0, udpWrongSource: 0, timedOut: false,
    udpOk: undefined, udpRetried: undefined, udpRetries: undefined, udpLate: undefined, shortOk: undefined, longBytes: undefined,
  });
  expect(r.shortOk).toBeGreaterThan(0);
  expect(r.udpOk).toBeGreaterThan(0);
}

/** A newcomer played by the test over the hand-over socket (pid 4242): welcomed, not yet ready. */
async function welcomedNewcomer(node: HandoverNode): Promise<{ line: Socket; got: () => string }> {
  const line = createConnection(node.socket);
  let got = '';
  line.setEncoding('utf8');
  line.on('data', (d: string) => (got += d));
  line.write(`${JSON.stringify({ t: 'hello', protocol: 1, version: 'test', pid: 4242, portal: 'loopback', bindAddress: '0.0.0.0' })}\n`);
  await waitFor(() => got.includes('"welcome"'), 'the welcome');
  return { line, got: () => got };
}

/** A successor that gave the hand-over up: it exits 1 with one line on stderr, returned. */
async function oneLineExit(successor: Spawned): Promise<string> {
  expect(await successor.exited).toBe(1);
  const lines = successor.stderr().trim().split('\n');
  expect(lines).toHaveLength(1);
  return lines[0] as string;
}

/** One GET on the health port inside the node's namespace (whichever process the kernel picks answers). */
async function healthProbe(node: HandoverNode, path: string): Promise<{ status: number; body: string }> {
  const script = `fetch('http://127.0.0.1:10256${path}').then(async (r) => process.stdout.write(JSON.stringify({ status: r.status, body: await r.text() })), (e) => { process.stderr.write(String(e)); process.exit(1); });`;
  return JSON.parse((await nsExec(node.ns, process.execPath, ['-e', script])).stdout) as { status: number; body: string };
}

const VARIANTS = [
  { name: '--portal loopback', portal: 'loopback', host: HO.loopbackIP, extra: [] as string[], long: FULL ? 1000 : 200, restarts: FULL ? 20 : 5, skip: netnsSkipReason },
  { name: '--portal iptables', portal: 'iptables', host: HO.clusterIP, extra: ['--workers', '1'] as string[], long: FULL ? 1000 : 100, restarts: FULL ? 20 : 3, skip: iptablesSkipReason },
  { name: '--workers 2', portal: 'loopback', host: HO.loopbackIP, extra: ['--workers', '2'] as string[], long: FULL ? 1000 : 100, restarts: FULL ? 20 : 3, skip: netnsSkipReason },
] as const;

/** Each test's namespace, load generator and stand-in process, removed after it whatever happened. */
let node: HandoverNode | undefined;
let load: Load | undefined;
/** A test's own stand-in for an old process: killed here too, since a test that times out never reaches its finally. */
let standIn: { kill(signal: NodeJS.Signals): boolean } | undefined;
afterEach(async () => {
  standIn?.kill('SIGKILL');
  standIn = undefined;
  load?.kill();
  await node?.destroy();
  node = undefined;
  load = undefined;
});

describe.each(VARIANTS)('hand-over across restarts ($name)', ({ portal, host, extra, long, restarts, skip }) => {

  it.skipIf(skip !== undefined)(`${long} long-lived connections, new connections and UDP queries across ${restarts} restarts: no connection refused or reset, no byte lost or reordered, no UDP datagram lost and every reply from the service address; the long-lived ones finish on the first process`, async () => {
    node = await createHandoverNode(`ho${portal.slice(0, 2)}${extra.length}`, { portal });
    const first = node.proxy(extra);
    await first.waitForLine(/answering hand-overs/, 30_000);
    load = startLoad(node.ns, loadOptions(host, long, FULL ? 900 : 240));
    await load.longReady;
    const olds: Spawned[] = [];
    let current = first;
    for (let i = 1; i <= restarts; i++) {
      // Traffic flows before each swap (the load counts in steps of 200).
      await load.shortAtLeast(load.shortOk() + 200, FULL ? 180_000 : 30_000);
      const next = node.proxy(extra);
      await next.waitForLine(/answering hand-overs/, 60_000);
      expect(logged(next, /took over from the previous process/)).toHaveLength(1);
      // The same proxy ports as the old process (the iptables portal's rules point there).
      expect(logged(next, /proxy ports differ/)).toEqual([]);
      await current.waitForLine(/handed over/, 10_000);
      olds.push(current);
      current = next;
    }
    await load.shortAtLeast(load.shortOk() + 200);
    // The first process still holds every long-lived connection, and nothing else.
    expect(first.child.exitCode).toBeNull();
    const result = await load.stop();
    process.stderr.write(`hand-over ${portal} ${extra.join(' ')}: ${JSON.stringify(result)}\n`);
    expectClean(result, long);
    // Every old process exits 0 once its connections are done, having cut none.
    for (const p of olds) expect(await p.exited).toBe(0);
    for (const p of olds) expect(logged(p, /^stopped$/)).toEqual([expect.objectContaining({ cut: 0 })]);
    // The first handed over with every long-lived connection open on it.
    expect((logged(first, /^handed over/)[0]?.active as number)).toBeGreaterThanOrEqual(long);
    expect(logged(current, /handed over/)).toEqual([]);
    current.child.kill('SIGTERM');
    expect(await current.exited).toBe(0);
  }, FULL ? 1_200_000 : 300_000);
});

describe('hand-over faults', () => {
  const request = (n: HandoverNode, what: string): Promise<string> => nsRequest(n.ns, 'tcp', HO.loopbackIP, HO.tcpPort, what, 3000);

  it.skipIf(netnsSkipReason !== undefined)('a hand-over asked with a different --portal is refused in one line; the old process serves on and takes a later hand-over', async () => {
    node = await createHandoverNode('hoportal');
    const old = node.proxy();
    await old.waitForLine(/answering hand-overs/, 30_000);
    const wrong = node.proxy(['--portal', 'bind']);
    expect(await wrong.exited).toBe(1);
    const lines = wrong.stderr().trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^kube-userspace-proxy: hand-over refused by the running proxy \(pid \d+\): --portal bind differs from the running process's --portal loopback/);
    expect(await request(node, 'still')).toBe('be:still');
    expect(logged(old, /refused a hand-over/)).toHaveLength(1);
    const next = node.proxy();
    await next.waitForLine(/took over from the previous process/, 30_000);
    expect(await old.exited).toBe(0);
    expect(await request(node, 'next')).toBe('be:next');
  }, 120_000);

  it.skipIf(netnsSkipReason !== undefined)('--after-handover wait: the drained old process stays, idle and holding no port, until SIGTERM', async () => {
    node = await createHandoverNode('howait');
    const old = node.proxy(['--after-handover', 'wait']);
    await old.waitForLine(/answering hand-overs/, 30_000);
    const next = node.proxy(['--after-handover', 'wait']);
    await next.waitForLine(/took over from the previous process/, 30_000);
    // Nothing to drain: it says so and waits (a DaemonSet's container must not exit before its pod
    // is deleted, or the kubelet restarts it and the restart takes over from the successor).
    await old.waitForLine(/handed over and drained: idle until stopped/, 30_000);
    expect(await request(node, 'served')).toBe('be:served');
    expect(old.child.exitCode).toBeNull();
    // Holding no port: a third process takes over from the second, not from the idle one.
    const third = node.proxy();
    await third.waitForLine(/took over from the previous process/, 30_000);
    expect(logged(third, /took over from the previous process/)[0]?.from).toBe(loggedPid(next));
    old.child.kill('SIGTERM');
    expect(await old.exited).toBe(0);
    expect(logged(old, /^stopped$/)).toEqual([expect.objectContaining({ cut: 0 })]);
  }, 120_000);

  it.skipIf(netnsSkipReason !== undefined)('a new process killed mid-hand-over leaves the old one serving; a second one meanwhile is refused; a later one takes over', async () => {
    node = await createHandoverNode('hokill');
    const old = node.proxy();
    await old.waitForLine(/answering hand-overs/, 30_000);
    load = startLoad(node.ns, loadOptions(HO.loopbackIP, 20, 240));
    await load.longReady;
    // A successor whose API server never answers: welcomed, it waits for its first sync for ever.
    const kubeconfig = `${node.dir}/kubeconfig`;
    const { writeFile } = await import('node:fs/promises');
    await writeFile(kubeconfig, 'apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n');
    const stuck = node.proxy([], ['--kubeconfig', kubeconfig]);
    await stuck.waitForLine(/taking over from the running proxy/, 30_000);
    await old.waitForLine(/a new process is taking over/);
    // Two cannot take over at once.
    const second = node.proxy();
    expect(await second.exited).toBe(1);
    expect(second.stderr()).toMatch(/another process is taking over right now/);
    await load.shortAtLeast(load.shortOk() + 200);
    stuck.child.kill('SIGKILL');
    await stuck.exited;
    await old.waitForLine(/hand-over abandoned, serving on/);
    await load.shortAtLeast(load.shortOk() + 200);
    expect(old.child.exitCode).toBeNull();
    const later = node.proxy();
    await later.waitForLine(/took over from the previous process/, 30_000);
    await old.waitForLine(/handed over/);
    await load.shortAtLeast(load.shortOk() + 200);
    expectClean(await load.stop(), 20);
    expect(await old.exited).toBe(0);
  }, 180_000);

  it.skipIf(netnsSkipReason !== undefined)('the old process SIGKILLed right after handing over: the new one serves, and takes a later hand-over', async () => {
    node = await createHandoverNode('hoold');
    const old = node.proxy();
    await old.waitForLine(/answering hand-overs/, 30_000);
    // Short connections only: the old process's own connections die with it, by design of SIGKILL.
    load = startLoad(node.ns, { ...loadOptions(HO.loopbackIP, 0, 240), shortConcurrency: 2 });
    await load.longReady;
    await load.shortAtLeast(200);
    const next = node.proxy();
    await old.waitForLine(/handed over/, 30_000);
    old.child.kill('SIGKILL');
    await old.exited;
    await next.waitForLine(/took over from the previous process|went away during the hand-over/);
    await next.waitForLine(/answering hand-overs/);
    await load.shortAtLeast(load.shortOk() + 400);
    const later = node.proxy();
    await later.waitForLine(/took over from the previous process/, 30_000);
    await load.shortAtLeast(load.shortOk() + 200);
    const r = await load.stop();
    // Never refused: some listener was there at every moment. A connection the old process had
    // accepted and was relaying when it was killed is reset with it.
    expect(r.shortRefused).toBe(0);
    expect(r.shortMismatch).toBe(0);
    expect(r.udpFailed).toBe(0);
    expect(await next.exited).toBe(0);
  }, 180_000);

  it.skipIf(netnsSkipReason !== undefined)('the old process killed before the new one is ready: the new one carries on as after a normal start', async () => {
    node = await createHandoverNode('hogone');
    // An "old process" that welcomes the newcomer and is then SIGKILLed: the line closes before
    // ready, and its socket file stays behind.
    const { spawn } = await import('node:child_process');
    const script = `require('node:net').createServer((s) => s.once('data', () => { s.write(JSON.stringify({ t: 'welcome', pid: process.pid, version: 'old', proxyPorts: [] }) + '\\n'); process.stdout.write('welcomed\\n'); })).listen(${JSON.stringify(node.socket)});`;
    const fake = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    standIn = fake;
    const fakeExited = new Promise<void>((resolve) => fake.once('exit', () => resolve()));
    try {
      await waitFor(async () => (await import('node:fs/promises')).stat(node!.socket).then(() => true, () => false), 'the fake old process to listen');
      const proxy = node.proxy();
      await new Promise<void>((resolve) => fake.stdout.once('data', () => resolve()));
      fake.kill('SIGKILL');
      await fakeExited;
      await proxy.waitForLine(/answering hand-overs/, 30_000);
      expect(logged(proxy, /taking over from the running proxy/)).toHaveLength(1);
      expect(logged(proxy, /went away during the hand-over: serving as after a normal start/)).toHaveLength(1);
      expect(await request(node, 'alone')).toBe('be:alone');
      // It answers on the path now: a later start takes over from it.
      const next = node.proxy();
      await next.waitForLine(/took over from the previous process/, 30_000);
      expect(await proxy.exited).toBe(0);
    } finally {
      fake.kill('SIGKILL');
    }
  }, 60_000);

  it.skipIf(netnsSkipReason !== undefined)('SIGTERM during a hand-over: the old process serves until the new one is ready, then drains and exits (also with --after-handover wait)', async () => {
    node = await createHandoverNode('hoterm');
    // As deploy/ runs it: the SIGTERM that came mid-hand-over is the stop; no second one follows.
    const old = node.proxy(['--after-handover', 'wait']);
    await old.waitForLine(/answering hand-overs/, 30_000);
    // The newcomer, played by the test over the socket: welcomed, it says ready only later.
    const { line, got } = await welcomedNewcomer(node);
    old.child.kill('SIGTERM');
    await old.waitForLine(/finishing the hand-over before stopping/);
    // Still serving: stopping now would leave the addresses without a listener.
    expect(await request(node, 'waiting')).toBe('be:waiting');
    expect(old.child.exitCode).toBeNull();
    line.write(`${JSON.stringify({ t: 'ready' })}\n`);
    await waitFor(() => got().includes('"released"'), 'released');
    await old.waitForLine(/handed over/);
    expect(logged(old, /handed over/)[0]).toMatchObject({ to: 4242 });
    expect(await old.exited).toBe(0);
    line.destroy();
  }, 60_000);

  it.skipIf(netnsSkipReason !== undefined)('while a successor takes over, the old process\'s /readyz says 503 naming it (the successor\'s pod must not turn ready on the old one\'s answers); /healthz and /livez stay 200; after the successor dies, 200 again', async () => {
    node = await createHandoverNode('hohealth');
    const old = node.proxy();
    await old.waitForLine(/answering hand-overs/, 30_000);
    const probe = (path: string): Promise<{ status: number; body: string }> => healthProbe(node as HandoverNode, path);
    expect((await probe('/readyz')).status).toBe(200);
    // The successor, played by the test over the socket: welcomed, and held before ready.
    const { line } = await welcomedNewcomer(node);
    const during = await probe('/readyz');
    expect(during.status).toBe(503);
    expect(JSON.parse(during.body)).toMatchObject({ message: 'handing over to pid 4242' });
    // The node forwards all through a hand-over: kube-proxy's probes (cloud load balancers) say so.
    expect((await probe('/healthz')).status).toBe(200);
    expect((await probe('/livez')).status).toBe(200);
    line.destroy();
    await old.waitForLine(/hand-over abandoned, serving on/);
    expect((await probe('/readyz')).status).toBe(200);
    expect(await request(node, 'still')).toBe('be:still');
  }, 60_000);

  it.skipIf(netnsSkipReason !== undefined)('a successor whose source holds none of the Services the old process serves (its state file not there yet) does not take over: exit 1 in one line; the old one serves on, ready', async () => {
    node = await createHandoverNode('honone');
    const old = node.proxy();
    await old.waitForLine(/answering hand-overs/, 30_000);
    const later = join(node.dir, 'later.json');
    const next = node.proxy([], ['--state', later]);
    expect(await oneLineExit(next)).toContain('runs none of the running proxy\'s service ports');
    await old.waitForLine(/hand-over abandoned, serving on/);
    expect(await request(node, 'still')).toBe('be:still');
    expect((await healthProbe(node, '/readyz')).status).toBe(200);
    // With its state file there, the next one takes over.
    await writeFile(later, handoverState());
    const third = node.proxy([], ['--state', later]);
    await third.waitForLine(/took over from the previous process/, 30_000);
    await old.waitForLine(/handed over/, 10_000);
    expect(await request(node, 'served')).toBe('be:served');
  }, 90_000);

  it.skipIf(netnsSkipReason !== undefined)('a successor that cannot listen for a service port the old process serves (a lower open-file limit) is not ready: it abandons the hand-over and exits 1 in one line naming it; the old one serves on', async () => {
    node = await createHandoverNode('hounserved');
    const old = node.proxy();
    await old.waitForLine(/answering hand-overs/, 30_000);
    // 257 open files leave room for one listening socket (core/descriptor-budget.ts): the other
    // service port's listener fails with EMFILE, in the successor only.
    const next = node.proxy([], undefined, ['prlimit', '--nofile=257:257']);
    expect(await oneLineExit(next)).toMatch(/^kube-userspace-proxy: hand-over abandoned: \d service ports? the running proxy \(pid \d+\) serves cannot listen here: default\/echo:(tcp|udp)\S*: not served: cannot listen on \S+: out of open files .*; it serves on$/);
    expect(logged(next, /took over from the previous process/)).toEqual([]);
    await old.waitForLine(/hand-over abandoned, serving on/);
    expect(old.child.exitCode).toBeNull();
    expect(await request(node, 'still')).toBe('be:still');
    expect(await nsRequest(node.ns, 'udp', HO.loopbackIP, HO.udpPort, 'still', 3000)).toBe('be:still');
    // A successor with the usual limit takes over.
    const later = node.proxy();
    await later.waitForLine(/took over from the previous process/, 30_000);
    expect(await old.exited).toBe(0);
  }, 90_000);

  it.skipIf(netnsSkipReason !== undefined)('turns on net.ipv4.tcp_migrate_req in its network namespace, and says so', async () => {
    node = await createHandoverNode('homig');
    expect((await nsExec(node.ns, 'cat', ['/proc/sys/net/ipv4/tcp_migrate_req'])).stdout.trim()).toBe('0');
    const proxy = node.proxy();
    await proxy.waitForLine(/answering hand-overs/, 30_000);
    expect((await nsExec(node.ns, 'cat', ['/proc/sys/net/ipv4/tcp_migrate_req'])).stdout.trim()).toBe('1');
    expect(logged(proxy, /set net\.ipv4\.tcp_migrate_req=1/)).toHaveLength(1);
  }, 60_000);

  it.skipIf(netnsSkipReason !== undefined)('the old process leaves the hosts-file block to its successor', async () => {
    node = await createHandoverNode('hohosts');
    const hosts = `${node.dir}/hosts`;
    const { readFile, writeFile } = await import('node:fs/promises');
    await writeFile(hosts, '127.0.0.1 localhost\n');
    const old = node.proxy(['--hosts-file', hosts]);
    await old.waitForLine(/answering hand-overs/, 30_000);
    const block = await waitFor(async () => {
      const text = await readFile(hosts, 'utf8');
      return text.includes('echo.default.svc.cluster.local') ? text : undefined;
    }, 'the hosts-file block');
    const next = node.proxy(['--hosts-file', hosts]);
    await next.waitForLine(/answering hand-overs/, 30_000);
    expect(await old.exited).toBe(0);
    expect(await readFile(hosts, 'utf8')).toBe(block);
    next.child.kill('SIGTERM');
    expect(await next.exited).toBe(0);
    // A normal stop (no successor) takes it out, as before.
    expect(await readFile(hosts, 'utf8')).toBe('127.0.0.1 localhost\n');
  }, 60_000);

  it.skipIf(netnsSkipReason !== undefined)('a socket file left by a killed process is replaced at start', async () => {
    node = await createHandoverNode('hostale');
    const { spawn } = await import('node:child_process');
    const holder = spawn(process.execPath, ['-e', `require('node:net').createServer().listen(${JSON.stringify(node.socket)}, () => process.stdout.write('up'))`], { stdio: ['ignore', 'pipe', 'ignore'] });
    await new Promise<void>((resolve) => holder.stdout.once('data', () => resolve()));
    holder.kill('SIGKILL');
    await new Promise<void>((resolve) => holder.once('exit', () => resolve()));
    const proxy = node.proxy();
    await proxy.waitForLine(/answering hand-overs/, 30_000);
    const next = node.proxy();
    await next.waitForLine(/took over from the previous process/, 30_000);
    expect(await proxy.exited).toBe(0);
  }, 120_000);
});
