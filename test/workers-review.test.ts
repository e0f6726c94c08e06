import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { systemClock } from '../src/core/clock.js';
import { toEndpoint, type Endpoint } from '../src/core/model.js';
import type { ProxyUnit } from '../src/core/units.js';
import { silentLogger } from '../src/log.js';
import type { ListenSpec } from '../src/seams/portal.js';
import type { UnitBatch } from '../src/seams/unit-set.js';
import type { WorkerLauncher } from '../src/seams/workers.js';
import { WorkerPool, type WorkerPoolOptions } from '../src/workers/worker-pool.js';
import { InProcessLauncher } from './helpers/in-process-workers.js';
import { tcpEchoServer, waitFor } from './helpers/net.js';
import { withDeadline } from './helpers/proxy-fixtures.js';

const SEED = 0x1234;
const pools: WorkerPool[] = [];
const closers: Array<() => Promise<void> | void> = [];

afterEach(async () => {
  for (const p of pools.splice(0)) await p.shutdown(0);
  for (const c of closers.splice(0)) await c();
});

async function startPool(launcher: WorkerLauncher, over: Partial<WorkerPoolOptions> = {}): Promise<WorkerPool> {
  const pool = new WorkerPool({ size: 2, launcher, logger: silentLogger(), clock: systemClock, random: Math.random, restartBackoff: { initialMs: 10, maxMs: 10 }, reportIntervalMs: 60_000, ...over });
  pools.push(pool);
  await pool.launch();
  return pool;
}

function unit(id: string, endpoints: Endpoint[]): ProxyUnit {
  return { id, servicePort: id, service: id.split(':')[0] as string, protocol: 'TCP', scope: 'all', portals: [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }], endpoints, affinity: { type: 'None', timeoutSeconds: 0 } };
}

const PROXY_PORT_SPEC: ListenSpec[] = [{ host: '127.0.0.1', port: 0, proxyPort: true, portals: [] }];
const batch = (over: Partial<UnitBatch>): UnitBatch => ({ close: [], recreate: [], open: [], update: [], ...over });

async function backend(): Promise<Endpoint> {
  const b = await tcpEchoServer('127.0.81.1', 'a');
  closers.push(() => b.close());
  return toEndpoint({ ip: '127.0.81.1', port: b.port });
}

function acceptedBy(launcher: InProcessLauncher, index: number): number {
  return launcher.current(index).units.stats().reduce((n, s) => n + s.stats.accepted, 0);
}

/** One connection through `port`, spliced to its endpoint (its first byte read), left open. */
async function spliced(port: number): Promise<Socket> {
  const s = connect({ host: '127.0.0.1', port });
  s.on('error', () => undefined);
  closers.push(() => void s.destroy());
  await withDeadline(new Promise((r) => s.once('data', r)), 5000, 'the connection to be spliced');
  return s;
}

describe('WorkerPool review', () => {
  it("a closed service port's counters do not go down while another worker still drains it", async () => {
    const launcher = new InProcessLauncher({ seed: SEED });
    const pool = await startPool(launcher);
    const a = await backend();
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a]), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    // Connections until both workers hold some; each is known to be on the worker whose count moved.
    const on: Socket[][] = [[], []];
    for (let i = 0; i < 200 && (on[0]?.length === 0 || on[1]?.length === 0); i++) {
      const before = [acceptedBy(launcher, 0), acceptedBy(launcher, 1)];
      const s = await spliced(port);
      const w = acceptedBy(launcher, 0) > (before[0] as number) ? 0 : 1;
      on[w]?.push(s);
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
    const a = await backend();
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a]), listen: PROXY_PORT_SPEC }] }));
    const port = pool.views()[0]?.proxyPort as number;
    const socks: Socket[] = [];
    for (let i = 0; i < 30; i++) socks.push(await spliced(port));
    for (const s of socks) s.destroy();
    await waitFor(() => [0, 1].every((i) => inner.current(i).units.activeConnections() === 0), 'the connections to end');
    expect((await pool.readStats()).reading.node.accepted).toBe(30);
    await pool.shutdown(1000);
    const after = await pool.readStats();
    expect(after.reading.node.accepted).toBe(30);
    expect(pool.figures().reduce((n, f) => n + f.connectionsAccepted, 0)).toBe(30);
  });
});
