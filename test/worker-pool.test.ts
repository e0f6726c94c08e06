import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { rendezvousPick } from '../src/core/balancer/shared-order.js';
import { systemClock } from '../src/core/clock.js';
import { toEndpoint, type Endpoint } from '../src/core/model.js';
import type { ProxyUnit } from '../src/core/units.js';
import { silentLogger } from '../src/log.js';
import type { ListenSpec } from '../src/seams/portal.js';
import type { UnitBatch, UnitStatus } from '../src/seams/unit-set.js';
import type { WorkerLauncher } from '../src/seams/workers.js';
import { mergeStatus, WorkerPool, type WorkerPoolOptions } from '../src/workers/worker-pool.js';
import { InProcessLauncher } from './helpers/in-process-workers.js';
import { tcpEchoServer, waitFor } from './helpers/net.js';
import { withDeadline } from './helpers/proxy-fixtures.js';

/**
 * The controller's side of `--workers`, driven directly: two workers on real loopback sockets
 * (in this process, behind a copying channel: helpers/in-process-workers.ts).
 */

const SEED = 0x1234;
const pools: WorkerPool[] = [];
const closers: Array<() => Promise<void> | void> = [];

afterEach(async () => {
  for (const p of pools.splice(0)) await p.shutdown(0);
  for (const c of closers.splice(0)) await c();
});

async function startPool(launcher: WorkerLauncher, size = 2, over: Partial<WorkerPoolOptions> = {}): Promise<WorkerPool> {
  const pool = new WorkerPool({ size, launcher, logger: silentLogger(), clock: systemClock, random: Math.random, restartBackoff: { initialMs: 10, maxMs: 10 }, reportIntervalMs: 60_000, ...over });
  pools.push(pool);
  await pool.launch();
  return pool;
}

function unit(id: string, endpoints: Endpoint[], affinity: ProxyUnit['affinity'] = { type: 'None', timeoutSeconds: 0 }): ProxyUnit {
  return { id, servicePort: id, service: id.split(':')[0] as string, protocol: 'TCP', scope: 'all', portals: [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }], endpoints, affinity };
}

const PROXY_PORT_SPEC: ListenSpec[] = [{ host: '127.0.0.1', port: 0, proxyPort: true, portals: [] }];

const batch = (over: Partial<UnitBatch>): UnitBatch => ({ close: [], recreate: [], open: [], update: [], ...over });

/** Connect from `localAddress` and read the backend's name (the echo server writes `name:` first). */
function whoAnswers(port: number, localAddress = '127.0.0.1'): Promise<string> {
  return withDeadline(new Promise<string>((resolve, reject) => {
    const s = connect({ host: '127.0.0.1', port, localAddress });
    s.once('data', (d: Buffer) => {
      s.destroy();
      resolve(d.toString().split(':')[0] as string);
    });
    s.once('error', reject);
  }), 5000, `an answer via 127.0.0.1:${port}`);
}

async function backends(...names: string[]): Promise<Endpoint[]> {
  const out: Endpoint[] = [];
  for (const [i, name] of names.entries()) {
    const host = `127.0.${81 + i}.1`;
    const b = await tcpEchoServer(host, name);
    closers.push(() => b.close());
    out.push(toEndpoint({ ip: host, port: b.port }));
  }
  return out;
}

/** `n` connections through the proxy port, each spliced to its endpoint (its first byte read); closed after the test. */
async function openSpliced(port: number, n: number): Promise<Socket[]> {
  const held: Socket[] = [];
  closers.push(() => held.forEach((s) => s.destroy()));
  for (let i = 0; i < n; i++) {
    const s = connect({ host: '127.0.0.1', port });
    s.on('error', () => undefined);
    held.push(s);
    await withDeadline(new Promise((r) => s.once('data', r)), 5000, 'the connection to be spliced');
  }
  return held;
}

function acceptedBy(launcher: InProcessLauncher, index: number): number {
  return launcher.current(index).units.stats().reduce((n, s) => n + s.stats.accepted, 0);
}

describe('WorkerPool', () => {
  it('binds one proxy port per unit, chosen by the first worker and bound by every worker', async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const [view] = pool.views();
    expect(view?.proxyPort).toBeGreaterThan(0);
    for (const i of [0, 1]) expect(launcher.current(i).units.status()[0]?.proxyPort).toBe(view?.proxyPort);
    // The kernel spreads the connections over both workers' sockets.
    for (let i = 0; i < 40; i++) expect(await whoAnswers(view?.proxyPort as number)).toBe('a');
    expect(acceptedBy(launcher, 0)).toBeGreaterThan(0);
    expect(acceptedBy(launcher, 1)).toBeGreaterThan(0);
  });

  it('takes proxy ports from --proxy-port-range once, not once per worker', async () => {
    const launcher = new InProcessLauncher({ seed: SEED, proxyPortRange: { base: 41700, size: 50 } });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: ['x', 'y', 'z'].map((n) => ({ unit: unit(`default/${n}:http`, [a as Endpoint]), listen: PROXY_PORT_SPEC })) }));
    const ports = pool.views().map((v) => v.proxyPort as number);
    expect(new Set(ports).size).toBe(3);
    for (const p of ports) expect(p >= 41700 && p < 41750).toBe(true);
    for (const i of [0, 1]) expect(launcher.current(i).units.views().map((v) => v.proxyPort)).toEqual(ports);
  });

  it('replaces a worker that dies, brings it up to date, and keeps its counts', async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    for (let i = 0; i < 30; i++) await whoAnswers(port);
    const before = (await pool.readStats()).reading.series[0]?.totals.accepted;
    expect(before).toBe(30);
    const oldPid = pool.figures()[0]?.pid;
    launcher.current(0).crash();
    await waitFor(() => pool.figures()[0]?.state === 'ready' && pool.figures()[0]?.pid !== oldPid, 'a replacement worker to serve');
    expect(pool.restarts()).toBe(1);
    expect(pool.figures()[0]?.restarts).toBe(1);
    // The replacement binds the same proxy port, and counts go on from where they were.
    expect(launcher.current(0).units.status()[0]?.proxyPort).toBe(port);
    for (let i = 0; i < 10; i++) expect(await whoAnswers(port)).toBe('a');
    const after = (await pool.readStats()).reading.series[0]?.totals.accepted;
    expect(after).toBe(40);
    // A new unit after the replacement: still one port, bound by both.
    await pool.apply(batch({ open: [{ unit: unit('default/api:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const apiPort = pool.views().find((v) => v.unit.id === 'default/api:http')?.proxyPort;
    for (const i of [0, 1]) expect(launcher.current(i).units.views().find((v) => v.unit.id === 'default/api:http')?.proxyPort).toBe(apiPort);
  });

  it('an apply waiting for a serving worker (every one down) ends at once when interrupted: a stop is not held up', async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    // Replacements are a minute away: the apply below would wait out its 20 s for one.
    const pool = await startPool(launcher, 2, { stableMs: Number.MAX_SAFE_INTEGER, restartBackoff: { initialMs: 60_000, maxMs: 60_000 }, startTimeoutMs: 20_000 });
    const [a] = await backends('a');
    launcher.current(0).crash();
    launcher.current(1).crash();
    await waitFor(() => pool.figures().every((f) => f.state === 'down'), 'both workers to be down');
    const applying = pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const outcome = applying.then(() => 'applied', (err: Error) => err.message);
    setImmediate(() => pool.interrupt());
    expect(await withDeadline(outcome, 2000, 'the apply to end')).toMatch(/^stopping: no worker process serves/);
  });

  it("a unit whose proxy port the first worker could not bind gets one after that worker's replacement", async () => {
    // The range's one port is held by a socket without SO_REUSEPORT: no worker can bind it.
    const blocker = createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const port = (blocker.address() as AddressInfo).port;
    closers.push(() => new Promise<void>((resolve) => blocker.close(() => resolve())));
    const launcher = new InProcessLauncher({ seed: SEED, proxyPortRange: { base: port, size: 1 } });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    expect(pool.views()[0]?.proxyPort).toBeFalsy();
    const oldPid = pool.figures()[0]?.pid;
    launcher.current(0).crash();
    await waitFor(() => pool.figures()[0]?.state === 'ready' && pool.figures()[0]?.pid !== oldPid, 'a replacement worker to serve');
    await new Promise<void>((resolve) => blocker.close(() => resolve()));
    // The next sync: the first worker (the replacement) chooses the port, the other binds it too.
    await pool.apply(batch({}));
    expect(pool.views()[0]?.proxyPort).toBe(port);
    for (const i of [0, 1]) expect(launcher.current(i).units.status()[0]?.proxyPort).toBe(port);
    expect(await whoAnswers(port)).toBe('a');
  });

  it("does not take a new worker busy with its catch-up for wedged: a sync queued behind it is due after it", async () => {
    const inner = new InProcessLauncher({ seed: SEED });
    let launches = 0;
    // The replacement's first answer (to its catch-up) comes 600 ms late, and so everything after it.
    const launcher: WorkerLauncher = {
      launch: (index) => {
        const h = inner.launch(index);
        if (++launches <= 2) return h;
        let held = false;
        let chain = Promise.resolve();
        return {
          pid: h.pid,
          send: (m) => h.send(m),
          onExit: (l) => h.onExit(l),
          kill: (signal) => h.kill(signal),
          onMessage: (l) => h.onMessage((m) => {
            const late = m.t === 'applied' && !held;
            if (late) held = true;
            chain = chain.then(() => (late ? new Promise((r) => setTimeout(r, 600)) : undefined)).then(() => l(m));
          }),
        };
      },
    };
    // A catch-up of 600 units is due in 300 + 600 ms; a sync of nothing new, in 300 ms.
    const pool = await startPool(launcher, 2, { applyTimeoutMs: 300 });
    const many = Array.from({ length: 600 }, (_, i) => ({ unit: unit(`default/s${i}:http`, []), listen: [] }));
    await pool.apply(batch({ open: many }));
    inner.current(0).crash();
    await waitFor(() => pool.figures()[0]?.state === 'catching-up', 'the replacement to catch up');
    await pool.apply(batch({ update: [unit('default/s0:http', [])] }));
    await waitFor(() => pool.figures()[0]?.state === 'ready', 'the replacement to serve');
    expect(pool.unresponsive()).toBe(0);
    expect(pool.restarts()).toBe(1);
  });

  it('relays ClientIP affinity: a client keeps its endpoint on the other worker after the endpoint set grew', async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    const pool = await startPool(launcher);
    const [a, b, c] = await backends('a', 'b', 'c');
    const two = [a, b] as Endpoint[];
    const three = [a, b, c] as Endpoint[];
    // A client address whose first pick would move to c once c is added.
    let client = '';
    for (let i = 2; i < 250 && client === ''; i++) {
      const ip = `127.0.90.${i}`;
      if (rendezvousPick(ip, three, SEED).addr === c?.addr) client = ip;
    }
    expect(client).not.toBe('');
    const affinity = { type: 'ClientIP', timeoutSeconds: 60 } as const;
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', two, affinity), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    const first = await whoAnswers(port, client);
    expect(first).not.toBe('c');
    // Both workers hold the client's entry (the one that served it relayed it through the pool).
    await waitFor(() => [0, 1].every((i) => launcher.current(i).units.stickyEntries().some((u) => u.updates.some((x) => x.clientIP === client))), 'the entry to reach both workers');
    await pool.apply(batch({ update: [unit('default/web:http', three, affinity)] }));
    const seen = new Set<string>();
    const accepted = [acceptedBy(launcher, 0), acceptedBy(launcher, 1)];
    for (let i = 0; i < 30; i++) seen.add(await whoAnswers(port, client));
    expect([...seen]).toEqual([first]);
    // ...and both workers took some of those connections.
    expect(acceptedBy(launcher, 0)).toBeGreaterThan(accepted[0] as number);
    expect(acceptedBy(launcher, 1)).toBeGreaterThan(accepted[1] as number);
  });

  it('reads the kernel counters (/proc/net/udp) for a scrape, not for every periodic report', async () => {
    let reports = 0;
    let refreshes = 0;
    const launcher = new InProcessLauncher({
      seed: SEED,
      onReceive: (_, m) => {
        if (m.t === 'report') reports++;
      },
      onRefreshCounters: () => {
        refreshes++;
      },
    });
    const pool = await startPool(launcher, 2, { reportIntervalMs: 10 });
    await waitFor(() => reports >= 6, 'a few periodic reports');
    expect(refreshes).toBe(0);
    await pool.readStats();
    expect(refreshes).toBe(2);
  });

  it('/services readers share one status query per worker, until a sync completes', async () => {
    let asked = 0;
    const launcher = new InProcessLauncher({
      seed: SEED,
      onReceive: (_, m) => {
        if (m.t === 'status') asked++;
      },
    });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    await Promise.all(Array.from({ length: 5 }, () => pool.refresh()));
    expect(asked).toBe(2);
    await pool.refresh();
    expect(asked).toBe(2);
    await pool.apply(batch({ open: [{ unit: unit('default/api:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    await pool.refresh();
    expect(asked).toBe(4);
    expect(pool.status().map((s) => s.name)).toEqual(['default/api:http', 'default/web:http']);
  });

  it('drains every worker at shutdown and sums what they cut', async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    await openSpliced(port, 20);
    const { cut } = await pool.shutdown(50);
    expect(cut).toBe(20);
    expect(launcher.launched.every((w) => w.dead)).toBe(true);
  });

  it('ends every worker\'s drain at once when the grace period is ended early (a second signal)', async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    await openSpliced(port, 10);
    const endGrace = new AbortController();
    const stopping = pool.shutdown(60_000, { endGrace: endGrace.signal });
    setImmediate(() => endGrace.abort());
    // Well inside the minute: each worker cut what it had and answered.
    expect((await withDeadline(stopping, 5000, 'the shutdown')).cut).toBe(10);
  });

  it('kills a worker that does not answer soon after the grace period is ended early, not at the end of the grace period', async () => {
    const inner = new InProcessLauncher({ seed: SEED });
    // Worker 0 is wedged once the shutdown begins: it reads nothing more from its channel.
    const launcher: WorkerLauncher = {
      launch(index) {
        const h = inner.launch(index);
        return { pid: h.pid, onMessage: (l) => h.onMessage(l), onExit: (l) => h.onExit(l), kill: (sig) => h.kill(sig), send: (m) => (index === 0 && (m.t === 'shutdown' || m.t === 'endGrace') ? undefined : h.send(m)) };
      },
    };
    const pool = await startPool(launcher);
    const endGrace = new AbortController();
    const stopping = pool.shutdown(60_000, { endGrace: endGrace.signal });
    setImmediate(() => endGrace.abort());
    // Within the margin after the second signal (5 s), not the minute's grace and its margin.
    await withDeadline(stopping, 15_000, 'the shutdown to end');
    expect(inner.launched.filter((w) => w.index === 0).every((w) => w.dead)).toBe(true);
  });

  it('counts as cut the connections of a worker that dies while draining', async () => {
    // Worker 0 dies as soon as it has begun to drain, before it can answer.
    const launcher: InProcessLauncher = new InProcessLauncher({
      seed: SEED,
      onReceive: (index, m) => {
        if (index === 0 && m.t === 'shutdown') setImmediate(() => launcher.current(0).crash());
      },
    });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    await openSpliced(port, 20);
    await pool.refreshFigures();
    const open = pool.figures().map((f) => f.active);
    expect(open.every((n) => n > 0)).toBe(true);
    expect((await pool.shutdown(100)).cut).toBe(20);
  });

  it('sums held connections and their counters over the workers (hold-when-empty)', async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    const pool = await startPool(launcher);
    await pool.apply(batch({ open: [{ unit: { ...unit('default/web:http', []), holdWhenEmptyMs: 30_000 }, listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    const held: Socket[] = [];
    for (let i = 0; i < 10; i++) {
      const s = connect({ host: '127.0.0.1', port });
      s.on('error', () => undefined);
      held.push(s);
    }
    closers.push(() => held.forEach((s) => s.destroy()));
    const heldIn = (i: number): number => launcher.current(i).units.stats().reduce((n, u) => n + u.stats.held, 0);
    await waitFor(() => heldIn(0) + heldIn(1) === 10, 'the workers to hold all 10');
    // The kernel spread them over both workers (SO_REUSEPORT), so one worker's figure is not the node's.
    expect([heldIn(0), heldIn(1)].every((n) => n > 0)).toBe(true);
    const totals = (await pool.readStats()).reading.series[0]?.totals;
    expect({ held: totals?.held, heldTotal: totals?.heldTotal }).toEqual({ held: 10, heldTotal: 10 });
    await pool.refresh();
    expect(pool.status()[0]?.held).toBe(10);
  });
});

describe('/services over the workers (mergeStatus)', () => {
  const line = (over: Partial<UnitStatus>): UnitStatus => ({
    name: 'default/web:http', servicePort: 'default/web:http', protocol: 'TCP', scope: 'all', portals: [], reachable: [], proxyPort: null,
    endpoints: ['10.0.0.1:80', '10.0.0.2:80'], sessionAffinity: 'None', loadBalancer: 'round-robin', setAside: [], held: 0, active: 0, errors: [], ...over,
  });

  it('sums what is open and held, and shows every endpoint a worker set aside, until the latest', () => {
    const [merged] = mergeStatus([
      { worker: 0, status: [line({ active: 2, held: 1, setAside: [{ endpoint: '10.0.0.2:80', until: '2026-11-24T10:00:30.000Z' }] })] },
      { worker: 1, status: [line({ active: 3, held: 4, setAside: [{ endpoint: '10.0.0.1:80', until: '2026-11-24T10:00:10.000Z' }, { endpoint: '10.0.0.2:80', until: '2026-11-24T10:01:00.000Z' }], errors: ['cannot listen'] })] },
    ]);
    expect(merged).toMatchObject({
      active: 5,
      held: 5,
      setAside: [{ endpoint: '10.0.0.2:80', until: '2026-11-24T10:01:00.000Z' }, { endpoint: '10.0.0.1:80', until: '2026-11-24T10:00:10.000Z' }],
      errors: ['worker 1: cannot listen'],
    });
  });
});

describe('WorkerPool: counters through drains and shutdown', () => {
  it("a closed service port's counters do not go down while another worker still drains it", async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    // Connections until both workers hold some; each is known to be on the worker whose count moved.
    const on: Socket[][] = [[], []];
    for (let i = 0; i < 200 && (on[0]?.length === 0 || on[1]?.length === 0); i++) {
      const before = [acceptedBy(launcher, 0), acceptedBy(launcher, 1)];
      const [s] = await openSpliced(port, 1);
      const w = acceptedBy(launcher, 0) > (before[0] as number) ? 0 : 1;
      on[w]?.push(s as Socket);
    }
    expect(on.every((l) => l.length > 0)).toBe(true);
    const total = (on[0]?.length ?? 0) + (on[1]?.length ?? 0);
    const accepted = async (): Promise<number | undefined> => (await pool.readStats()).reading.series.find((s) => s.labels.servicePort === 'default/web:http')?.totals.accepted;
    expect(await accepted()).toBe(total);
    // The service port goes; worker 0's connections end, worker 1's still drain.
    await pool.apply(batch({ close: ['default/web:http'] }));
    for (const s of on[0] ?? []) s.destroy();
    await waitFor(() => launcher.current(0).units.activeConnections() === 0, "worker 0's connections to end");
    expect(launcher.current(1).units.activeConnections()).toBeGreaterThan(0);
    // Scrapes while worker 1 still counts on the series: it is a counter, it must not go down.
    for (let i = 0; i < 4; i++) expect(await accepted()).toBe(total);
  });

  it("does not count a worker twice when it exits before the shutdown's last reply", async () => {
    const inner = new InProcessLauncher({ seed: SEED });
    let zeroExited: () => void = () => undefined;
    const zeroGone = new Promise<void>((r) => (zeroExited = r));
    // Worker 1's drain ends after worker 0 has exited (as when worker 1 still has a connection draining).
    const launcher: WorkerLauncher = {
      launch(index) {
        const h = inner.launch(index);
        if (index === 0) h.onExit(() => zeroExited());
        return {
          pid: h.pid,
          send: (m) => h.send(m),
          kill: (sig) => h.kill(sig),
          onExit: (l) => h.onExit(l),
          onMessage: (l) => h.onMessage((m) => (index === 1 && m.t === 'shutdown' ? void zeroGone.then(() => setImmediate(() => l(m))) : l(m))),
        };
      },
    };
    const pool = await startPool(launcher);
    const [a] = await backends('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a as Endpoint]), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    for (const s of await openSpliced(port, 30)) s.destroy();
    await waitFor(() => [0, 1].every((i) => inner.current(i).units.activeConnections() === 0), 'the connections to end');
    expect((await pool.readStats()).reading.node.accepted).toBe(30);
    await pool.shutdown(1000);
    const after = await pool.readStats();
    expect(after.reading.node.accepted).toBe(30);
    expect(pool.figures().reduce((n, f) => n + f.connectionsAccepted, 0)).toBe(30);
  });
});
