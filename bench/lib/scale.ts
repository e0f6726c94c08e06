import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Context } from './context.js';
import { BACKEND_HOST, MOVED_HOST, PROBE_PORT, SCALE_LOOPBACK_PREFIX, SCALE_PORT, SERVICES, type HostPort, type SystemId } from './plan.js';
import { httpOnce, openIdle } from './probe.js';
import { cpuSeconds, rssBytes, sleep, sockets, waitUntil, type Started } from './proc.js';
import type { RunRecord, WorkloadInfo } from './results.js';
import { scaleClusterIP, scaleState } from './state-file.js';
import { spawnProxy, startSystems } from './systems.js';

/** The admin address of proxies started for scale runs (the load phase's proxy has stopped by then). */
const SCALE_ADMIN: HostPort = { host: '127.0.0.1', port: 19250 };
const MB = 1024 * 1024;

export const SCALE_INFO = {
  start: (n: number): WorkloadInfo => ({
    id: `scale-start@${n}`,
    title: `Start-up with ${n} service ports from one state file`,
    metrics: [
      { key: 'listenMs', label: 'start to every port listening', unit: 'ms', better: 'lower' },
      { key: 'cpuMs', label: 'CPU time used by then', unit: 'ms', better: 'lower' },
      { key: 'loadedMs', label: 'start to state file loaded', unit: 'ms', better: 'lower' },
      { key: 'syncedMs', label: 'start to first sync done', unit: 'ms', better: 'lower' },
      { key: 'rssMB', label: 'RSS when listening', unit: 'MB', better: 'lower' },
      { key: 'rssSettledMB', label: 'RSS 1 s later', unit: 'MB', better: 'lower' },
    ],
  }),
  move: (n: number): WorkloadInfo => ({
    id: `endpoint-move@${n}`,
    title: `Endpoint move with ${n} service ports loaded: state-file edit to new connections using it`,
    metrics: [
      { key: 'moveMs', label: 'edit to new connections on the new endpoint', unit: 'ms', better: 'lower' },
      { key: 'loadedMs', label: 'edit to state file loaded', unit: 'ms', better: 'lower' },
      { key: 'syncedMs', label: 'edit to sync done', unit: 'ms', better: 'lower' },
      { key: 'stale', label: 'old-endpoint answers after the first new one', unit: '', better: 'lower' },
    ],
  }),
  idle: (n: number): WorkloadInfo => ({
    id: `idle-conns@${n}`,
    title: `${n} idle proxied connections (one request each, then idle)`,
    metrics: [
      { key: 'baselineMB', label: 'RSS idle, no connections', unit: 'MB', better: 'lower' },
      { key: 'loadedMB', label: 'RSS with the connections', unit: 'MB', better: 'lower' },
      { key: 'deltaMB', label: 'RSS above the idle baseline', unit: 'MB', better: 'lower' },
      { key: 'kbPerConn', label: 'per proxied connection', unit: 'KB', better: 'lower' },
      { key: 'opened', label: 'connections opened', unit: '', better: 'none' },
    ],
  }),
};

/** Listening sockets on the scale port of the scale addresses (one per address and worker). */
function listeningScalePorts(): number {
  let n = 0;
  const prefix = `${SCALE_LOOPBACK_PREFIX}.`;
  for (const s of sockets('tcp')) if (s.state === '0A' && s.port === SCALE_PORT && s.host.startsWith(prefix)) n++;
  return n;
}

/** Milliseconds from `since` (epoch ms) to the first log line with this msg at or after `since` (pino JSON lines). */
function logTimeOf(logFile: string, msg: string, since: number): number {
  let text = '';
  try {
    text = readFileSync(logFile, 'utf8');
  } catch {
    return NaN;
  }
  for (const line of text.split('\n')) {
    if (!line.includes(`"msg":"${msg}"`)) continue;
    try {
      const rec = JSON.parse(line) as { time?: string | number };
      const t = typeof rec.time === 'number' ? rec.time : Date.parse(rec.time ?? '');
      // pino's isoTime has millisecond resolution; the harness's clock reading has more.
      if (t >= Math.floor(since)) return t - since;
    } catch {
      // not JSON
    }
  }
  return NaN;
}

interface ScaleProxy {
  started: Started;
  stateFile: string;
  logFile: string;
  metrics: Record<string, number>;
}

function writeAtomically(file: string, text: string): void {
  writeFileSync(`${file}.tmp`, text);
  renameSync(`${file}.tmp`, file);
}

/**
 * Start a proxy serving `n` service ports with `workers` worker processes; resolves once every one
 * listens in every worker, with the start-up figures.
 */
async function startScaleProxy(ctx: Context, n: number, tag: string, probe: HostPort, workers = 1): Promise<ScaleProxy> {
  const dir = join(ctx.tmp, `scale-${n}-${tag}`);
  mkdirSync(dir, { recursive: true });
  const stateFile = join(dir, 'state.json');
  writeAtomically(stateFile, scaleState({ ports: n, endpoint: { ip: BACKEND_HOST, port: SERVICES.http.port }, probeEndpoint: { ip: probe.host, port: probe.port }, probeVersion: 1 }));
  const logFile = join(dir, 'out.log');
  const wall0 = Date.now();
  const t0 = performance.now();
  const started = spawnProxy(ctx, { name: `proxy with ${n} service ports`, workers, slug: `proxy-scale-${n}-${tag}`, stateFile, admin: SCALE_ADMIN, extraArgs: ctx.options.proxyArgs, logFile });
  // Each worker listens on every port (SO_REUSEPORT): the table lists one socket per worker.
  await waitUntil(() => listeningScalePorts() >= n * workers, `${n} service ports listening`, 120_000, { everyMs: 10, process: started });
  const listenMs = performance.now() - t0;
  // CPU time next to wall time: on a shared machine the gap is time spent waiting for the core.
  const cpuMs = cpuSeconds([started.pid]) * 1000;
  const rssMB = rssBytes([started.pid]) / MB;
  await sleep(1000);
  return {
    started,
    stateFile,
    logFile,
    metrics: {
      listenMs,
      cpuMs,
      loadedMs: logTimeOf(logFile, 'loaded state file', wall0),
      syncedMs: logTimeOf(logFile, 'synced proxy rules', wall0),
      rssMB,
      rssSettledMB: rssBytes([started.pid]) / MB,
    },
  };
}

export async function scaleStart(ctx: Context, n: number, run: number): Promise<RunRecord> {
  const record: RunRecord = { workload: `scale-start@${n}`, system: 'proxy', run, metrics: {} };
  let proxy: ScaleProxy | undefined;
  try {
    proxy = await startScaleProxy(ctx, n, `start-${run}`, { host: BACKEND_HOST, port: PROBE_PORT });
    record.metrics = proxy.metrics;
  } catch (err) {
    record.error = (err as Error).message;
  } finally {
    await proxy?.started.stop();
  }
  return record;
}

/**
 * With `n` service ports loaded, move Service 0's one endpoint between two addresses by editing the
 * state file (write and rename, as editors and ConfigMap updates do), and time how long until a
 * new connection lands on the new endpoint. Probes run back to back on fresh connections; the
 * figure is when the first answer from the new endpoint arrived, counted from the rename.
 */
export async function endpointMove(ctx: Context, n: number, runs: number, record: (r: RunRecord) => void): Promise<void> {
  const workload = `endpoint-move@${n}`;
  let proxy: ScaleProxy | undefined;
  try {
    // With --workers N the move must reach every worker: probes land on all of them.
    proxy = await startScaleProxy(ctx, n, 'move', { host: BACKEND_HOST, port: PROBE_PORT }, ctx.options.workers);
    const target: HostPort = { host: scaleClusterIP(0).replace(/^10\./, '127.'), port: SCALE_PORT };
    const first = await httpOnce(target, 5000);
    if (first !== 'A') throw new Error(`the probe Service answered "${first}" before any move, expected "A"`);
    let version = 1;
    for (let run = 1; run <= runs; run++) {
      const to = run % 2 === 1 ? { host: MOVED_HOST, body: 'B' } : { host: BACKEND_HOST, body: 'A' };
      version++;
      const text = scaleState({ ports: n, endpoint: { ip: BACKEND_HOST, port: SERVICES.http.port }, probeEndpoint: { ip: to.host, port: PROBE_PORT }, probeVersion: version });
      // Leave the minimum sync period (1 s) behind, so the figure is the reaction, not the rate limit.
      await sleep(1500);
      writeFileSync(`${proxy.stateFile}.tmp`, text);
      const wall0 = Date.now();
      const t0 = performance.now();
      renameSync(`${proxy.stateFile}.tmp`, proxy.stateFile);
      const r = await probeUntil(target, to.body, t0, 10_000);
      // Where the time went, from the proxy's own log: reading and applying the file, then the sync.
      const loadedMs = logTimeOf(proxy.logFile, 'loaded state file', wall0);
      const syncedMs = logTimeOf(proxy.logFile, 'synced proxy rules', wall0);
      // An endpoint move takes the loop's fast lane, which logs its sync at debug only: then there is
      // no sync line to read, and the figure is left out rather than recorded as NaN.
      const timings: Record<string, number> = Number.isNaN(syncedMs) ? { loadedMs } : { loadedMs, syncedMs };
      const rec: RunRecord = { workload, system: 'proxy', run, metrics: r.moveMs === undefined ? {} : { moveMs: r.moveMs, ...timings, stale: r.stale } };
      if (r.moveMs === undefined) rec.error = `no new connection reached the new endpoint within 10 s (${r.probes} probes)`;
      record(rec);
      ctx.say(`  [run ${run}/${runs}] ${workload} ${rec.error ?? `moveMs=${r.moveMs?.toFixed(1)} (loaded at ${loadedMs} ms, synced at ${syncedMs} ms) stale=${r.stale} probes=${r.probes}`}`);
    }
  } catch (err) {
    record({ workload, system: 'proxy', run: 0, metrics: {}, error: (err as Error).message });
    ctx.say(`  ${workload} FAILED: ${(err as Error).message}`);
  } finally {
    await proxy?.started.stop();
  }
}

/** Probe back to back until `body` answers, then 200 ms more to catch stragglers on the old endpoint. */
async function probeUntil(target: HostPort, body: string, t0: number, timeoutMs: number): Promise<{ moveMs?: number; stale: number; probes: number }> {
  let moveMs: number | undefined;
  let stale = 0;
  let probes = 0;
  let errors = 0;
  while (performance.now() - t0 < timeoutMs && probes < 200_000) {
    probes++;
    let answer: string;
    try {
      answer = await httpOnce(target, 2000);
    } catch {
      errors++;
      if (errors > 1000) break;
      continue;
    }
    // When the answer arrived, not when the probe set out: a connection made while the proxy was
    // busy reloading waits in the listen backlog and is routed only after the reload.
    if (answer === body) moveMs ??= performance.now() - t0;
    else if (moveMs !== undefined) stale++;
    if (moveMs !== undefined && performance.now() - t0 > moveMs + 200) break;
  }
  return moveMs === undefined ? { stale, probes } : { moveMs, stale, probes };
}

/**
 * RSS of a freshly started system, idle, then holding `n` proxied connections idle. A fresh
 * process per run, so the baseline is a true idle one, not what earlier load left in the heap.
 */
export async function idleConnections(ctx: Context, system: SystemId, n: number, run: number): Promise<RunRecord> {
  const record: RunRecord = { workload: `idle-conns@${n}`, system, run, metrics: {} };
  const [sys] = await startSystems(ctx, [system]);
  if (!sys) {
    record.error = `${system} did not start`;
    return record;
  }
  let held: Awaited<ReturnType<typeof openIdle>> | undefined;
  try {
    await sleep(1000);
    const baseline = rssBytes(sys.pids);
    held = await openIdle(sys.target('http'), n, { concurrency: 200, deadlineMs: 120_000 });
    await sleep(1000);
    const loaded = rssBytes(sys.pids);
    const opened = held.sockets.length;
    record.metrics = { baselineMB: baseline / MB, loadedMB: loaded / MB, deltaMB: (loaded - baseline) / MB, kbPerConn: opened > 0 ? (loaded - baseline) / 1024 / opened : NaN, opened };
    if (held.failed > 0) record.error = `${held.failed} of ${n} connections failed (${held.firstError ?? ''}); figures are for ${opened}`;
  } catch (err) {
    record.error = (err as Error).message;
  } finally {
    for (const s of held?.sockets ?? []) s.destroy();
    await sys.stop();
  }
  return record;
}
