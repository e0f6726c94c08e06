import { join } from 'node:path';
import type { Context } from './context.js';
import { openIdle } from './probe.js';
import { rssBytes, sleep } from './proc.js';
import type { RunRecord, WorkloadInfo } from './results.js';
import { MB, scaleStateFor, startScaleProxy, writeByRename, type ScaleProxy } from './scale-proxy.js';
import type { Formatting } from './state-file.js';
import { startSystems } from './systems.js';
import type { SystemId } from './plan.js';
import { mkdirSync } from 'node:fs';

export const SCALE_INFO = {
  start: (n: number, endpoints: number, formatting: Formatting): WorkloadInfo => ({
    id: scaleStartId(n, endpoints, formatting),
    title: `Start-up with ${n} Services × ${endpoints} endpoints from one state file (${formatting === 'pretty' ? 'pretty-printed as kubectl prints it' : 'compact JSON on one line'})`,
    p99: true,
    metrics: [
      { key: 'listenMs', label: 'start to every port listening', unit: 'ms', better: 'lower' },
      { key: 'tableMs', label: 'start to the socket table confirming it', unit: 'ms', better: 'lower' },
      { key: 'cpuMs', label: 'CPU time used by then', unit: 'ms', better: 'lower' },
      { key: 'loadedMs', label: 'start to state file loaded', unit: 'ms', better: 'lower' },
      { key: 'syncedMs', label: 'start to first sync done', unit: 'ms', better: 'lower' },
      { key: 'rssMB', label: 'RSS when listening', unit: 'MB', better: 'lower' },
      { key: 'rssSettledMB', label: 'RSS 1 s later', unit: 'MB', better: 'lower' },
      { key: 'fileMB', label: 'state file', unit: 'MB', better: 'none' },
      { key: 'listening', label: 'ports listening (fewer: the open-file limit)', unit: '', better: 'none' },
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

export function scaleStartId(n: number, endpoints: number, formatting: Formatting): string {
  return `scale-start@${n}x${endpoints}/${formatting}`;
}

/** How long the harness idles between writing a state file and starting the proxy on it. */
const SETTLE_MS = 500;

/** Each size and formatting's file is rendered once per bench run: every trial reads the same bytes. */
const renderedStates = new Map<string, Buffer>();

function stateBytes(n: number, endpoints: number, formatting: Formatting): Buffer {
  const key = `${n}x${endpoints}/${formatting}`;
  let bytes = renderedStates.get(key);
  if (bytes === undefined) {
    bytes = scaleStateFor(n, endpoints, formatting).bytes();
    renderedStates.set(key, bytes);
  }
  return bytes;
}

/** Start a proxy on a fresh state file of `n` Services × `endpoints`; the start-up figures of one run. */
export async function scaleStart(ctx: Context, n: number, endpoints: number, formatting: Formatting, run: number): Promise<RunRecord> {
  const record: RunRecord = { workload: scaleStartId(n, endpoints, formatting), system: 'proxy', run, metrics: {} };
  let proxy: ScaleProxy | undefined;
  try {
    const dir = join(ctx.tmp, `start-${n}x${endpoints}-${formatting}-${run}`);
    mkdirSync(dir, { recursive: true });
    const stateFile = join(dir, 'state.json');
    const bytes = stateBytes(n, endpoints, formatting);
    writeByRename(stateFile, bytes);
    // Rendering the file (tens of MB of strings) leaves this process's collector busy on its
    // helper threads for a while; a start timed then would share the cores with it.
    await sleep(SETTLE_MS);
    proxy = await startScaleProxy(ctx, { services: n, tag: `start-${n}x${endpoints}-${formatting}-${run}`, stateFile });
    await sleep(1000);
    record.metrics = { ...proxy.metrics, rssSettledMB: rssBytes([proxy.started.pid]) / MB, fileMB: bytes.length / 1e6 };
  } catch (err) {
    record.error = (err as Error).message;
  } finally {
    await proxy?.started.stop();
  }
  return record;
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
