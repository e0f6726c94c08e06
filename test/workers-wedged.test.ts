import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { systemClock } from '../src/core/clock.js';
import { toEndpoint, type Endpoint } from '../src/core/model.js';
import type { ProxyUnit } from '../src/core/units.js';
import { buildConfig } from '../src/config.js';
import { ForkLauncher } from '../src/io/workers/fork-launcher.js';
import type { ListenSpec } from '../src/seams/portal.js';
import type { UnitBatch } from '../src/seams/unit-set.js';
import { workerInit } from '../src/start-workers.js';
import { WorkerPool } from '../src/workers/worker-pool.js';
import { runCli, type Spawned } from './helpers/cli.js';
import { freePort, tcpEchoServer, tcpRequest, waitFor } from './helpers/net.js';
import { endpointSlice, list, service } from './helpers/objects.js';
import { captureLogger, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * A worker that is alive but does not answer (here: real worker processes stopped with SIGSTOP)
 * must not hold the node: a sync completes with the other workers, the wedged one is killed,
 * counted and replaced, and shutdown ends.
 */

const WORKER_MAIN = fileURLToPath(new URL('../dist/bundle/worker-main.js', import.meta.url));
const SEED = 0x5eed;
const pools: WorkerPool[] = [];
const closers: Array<() => Promise<void> | void> = [];
const stopped: number[] = [];

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** SIGSTOP, remembered so that cleanup can continue and kill it whatever the test did. */
function stop(pid: number): void {
  stopped.push(pid);
  process.kill(pid, 'SIGSTOP');
}

afterEach(async () => {
  for (const pid of stopped.splice(0)) {
    if (!alive(pid)) continue;
    process.kill(pid, 'SIGCONT');
    process.kill(pid, 'SIGKILL');
  }
  for (const p of pools.splice(0)) await p.shutdown(0);
  for (const c of closers.splice(0)) await c();
});

function config(): ReturnType<typeof buildConfig> {
  const outcome = parseCommandLine(['--bind-address', '127.0.0.1']);
  if (outcome.kind !== 'run') throw new Error(outcome.output);
  return buildConfig(outcome.options);
}

/** Two real worker processes (dist/bundle/worker-main.js), with deadlines short enough for a test. */
async function startPool(): Promise<{ pool: WorkerPool; records: ReturnType<typeof captureLogger>['records'] }> {
  const cfg = config();
  const launcher = new ForkLauncher({ entry: WORKER_MAIN, init: (i) => ({ ...workerInit(cfg, 2, SEED, i), logLevel: 'silent' }), execArgv: [] });
  const { logger, records } = captureLogger('info');
  const pool = new WorkerPool({ size: 2, launcher, logger, clock: systemClock, random: Math.random, restartBackoff: { initialMs: 10, maxMs: 10 }, reportIntervalMs: 60_000, applyTimeoutMs: 500, requestTimeoutMs: 500 });
  pools.push(pool);
  await pool.launch();
  return { pool, records };
}

function unit(id: string, endpoints: Endpoint[]): ProxyUnit {
  return { id, servicePort: id, service: id.split(':')[0] as string, protocol: 'TCP', scope: 'all', portals: [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }], endpoints, affinity: { type: 'None', timeoutSeconds: 0 } };
}

const PROXY_PORT_SPEC: ListenSpec[] = [{ host: '127.0.0.1', port: 0, proxyPort: true, portals: [] }];
const batch = (over: Partial<UnitBatch>): UnitBatch => ({ close: [], recreate: [], open: [], update: [], ...over });

async function backend(name: string): Promise<Endpoint> {
  const b = await tcpEchoServer('127.0.0.1', name);
  closers.push(() => b.close());
  return toEndpoint({ ip: '127.0.0.1', port: b.port });
}

describe('WorkerPool with a wedged worker process', () => {
  it.each([[1, 'another'], [0, 'the first (which binds the proxy ports)']])('worker %i SIGSTOPped (%s): the sync completes without it; it is killed, counted and replaced', async (victim) => {
    const { pool, records } = await startPool();
    const a = await backend('a');
    await pool.apply(batch({ open: [{ unit: unit('default/web:http', [a]), listen: PROXY_PORT_SPEC }] }));
    const pid = pool.figures()[victim]?.pid as number;
    stop(pid);
    await withDeadline(pool.apply(batch({ open: [{ unit: unit('default/api:http', [a]), listen: PROXY_PORT_SPEC }] })), 10_000, 'the sync to complete without the stopped worker');
    const api = pool.views().find((v) => v.unit.id === 'default/api:http')?.proxyPort;
    expect(api).toBeGreaterThan(0);
    expect(pool.unresponsive()).toBe(1);
    expect(records.some((r) => r.msg.includes('did not answer in time') && r.pid === pid)).toBe(true);
    await waitFor(() => !alive(pid), 'the stopped worker to be killed');
    await waitFor(() => pool.figures()[victim]?.state === 'ready' && pool.figures()[victim]?.pid !== pid, 'a replacement to serve');
    expect(pool.restarts()).toBe(1);
    // Both units served (the replacement binds the same proxy ports).
    for (let i = 0; i < 10; i++) expect(await tcpRequest('127.0.0.1', api as number, 'x')).toBe('a:x');
  });
});

describe('--workers 2 with a wedged worker', () => {
  let dir: string;
  let stateFile: string;
  const running: Spawned[] = [];
  const WEB = '127.96.62.1';
  const API = '127.96.62.2';

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-wedged-'));
    stateFile = join(dir, 'state.json');
  });

  afterAll(async () => {
    for (const r of running) r.kill();
    await rm(dir, { recursive: true, force: true });
  });

  it('SIGTERM while a sync waits on a SIGSTOPped worker: the proxy still exits', async () => {
    const b = await tcpEchoServer('127.0.0.1', 'b');
    closers.push(() => b.close());
    const webPort = await freePort(WEB);
    const apiPort = await freePort(API);
    const web = [
      service({ name: 'web', clusterIP: '10.96.62.1', ports: [{ name: 'http', port: webPort, targetPort: b.port }] }),
      endpointSlice({ service: 'web', ports: [{ name: 'http', port: b.port }], endpoints: [{ ip: '127.0.0.1' }] }),
    ];
    await writeFile(stateFile, list(web));
    const r = runCli(['--state', stateFile, '--workers', '2', '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--iptables-min-sync-period', '0s', '--shutdown-grace-period', '1s']);
    running.push(r);
    const started = JSON.parse(await r.waitForLine(/kube-userspace-proxy started/)) as { admin: string };
    const workers = async (): Promise<Array<{ pid: number; state: string }>> => ((await (await fetch(`http://${started.admin}/workers`)).json()) as { workers: Array<{ pid: number; state: string }> }).workers;
    await waitFor(async () => (await workers()).every((w) => w.state === 'ready'), 'both workers to serve');
    stop((await workers())[0]?.pid as number);
    await writeFile(stateFile, list([
      ...web,
      service({ name: 'api', clusterIP: '10.96.62.2', ports: [{ name: 'http', port: apiPort, targetPort: b.port }] }),
      endpointSlice({ service: 'api', ports: [{ name: 'http', port: b.port }], endpoints: [{ ip: '127.0.0.1' }] }),
    ]));
    // The sync is under way: the worker that runs has applied it and serves the new Service.
    await waitFor(() => new Promise<boolean>((resolve) => {
      const s = connect({ host: API, port: apiPort });
      s.once('connect', () => {
        s.destroy();
        resolve(true);
      });
      s.once('error', () => resolve(false));
    }), 'the running worker to serve the new Service');
    r.child.kill('SIGTERM');
    expect(await withDeadline(r.exited, 25_000, 'the proxy to exit')).toBe(0);
    expect(r.stdout()).toMatch(/did not answer in time/);
  }, 40_000);
});
