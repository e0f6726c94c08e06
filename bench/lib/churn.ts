import { mkdirSync, writeFileSync } from 'node:fs';
import { rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeApiServer } from '../../test/helpers/fake-apiserver.js';
import type { Context } from './context.js';
import { BACKEND_HOST, MOVED_HOST } from './plan.js';
import { cpuSeconds, rssBytes, sleep } from './proc.js';
import type { RunRecord, WorkloadInfo } from './results.js';
import { logRecords, MB, PROBE_ANSWER, probeOnce, probeUntil, scaleStateFor, startScaleProxy, writeByRename, type ScaleProxy } from './scale-proxy.js';
import { median, percentile } from './stats.js';
import type { Formatting, ScaleState } from './state-file.js';

/**
 * Endpoint churn at a fixed rate for a fixed time, with N Services × E endpoints loaded: `rate`
 * Services a second get one endpoint moved, in `writesPerSecond` batches, through the state file
 * (rewritten whole and renamed over the old one each time, as a script would) or through the API
 * server (the harness's fake one, over loopback HTTP: one MODIFIED event per slice). Once a
 * second, one batch also moves the probe Service's endpoint, and new connections (5 ms apart)
 * time how long until they reach it. Measured: the proxy's CPU over the churn, in % of one core;
 * the move latencies; RSS every second, and for `afterSeconds` after the churn stops (does the
 * memory come back?); for the file, how many objects each load passed on as changed.
 */

export interface ChurnOptions {
  services: number;
  endpoints: number;
  seconds: number;
  /** Services changed per second. */
  rate: number;
  writesPerSecond: number;
  afterSeconds: number;
}

const CHURN_METRICS: WorkloadInfo['metrics'] = [
  { key: 'cpuPct', label: 'proxy CPU during the churn', unit: '% of a core', better: 'lower' },
  { key: 'moveP50Ms', label: 'endpoint move to new connections, p50', unit: 'ms', better: 'lower' },
  { key: 'moveP99Ms', label: 'p99', unit: 'ms', better: 'lower' },
  { key: 'moves', label: 'moves timed', unit: '', better: 'none' },
  { key: 'missed', label: 'moves not seen within 5 s', unit: '', better: 'lower' },
  { key: 'changedPerLoad', label: 'objects passed on per load (median)', unit: '', better: 'lower' },
  { key: 'writesPerS', label: 'changes made per second', unit: '/s', better: 'none' },
  { key: 'rssStartMB', label: 'RSS before', unit: 'MB', better: 'lower' },
  { key: 'rssPeakMB', label: 'RSS peak', unit: 'MB', better: 'lower' },
  { key: 'rssEndMB', label: 'RSS at the end', unit: 'MB', better: 'lower' },
  { key: 'rssAfterMB', label: 'RSS after the quiet spell', unit: 'MB', better: 'lower' },
];

export function fileChurnId(n: number, endpoints: number, formatting: Formatting): string {
  return `file-churn@${n}x${endpoints}/${formatting}`;
}

export function apiChurnId(n: number, endpoints: number): string {
  return `api-churn@${n}x${endpoints}`;
}

export function fileChurnInfo(o: ChurnOptions, formatting: Formatting): WorkloadInfo {
  return {
    id: fileChurnId(o.services, o.endpoints, formatting),
    title: `${o.rate} Services' endpoints changed per second for ${o.seconds} s with ${o.services} Services × ${o.endpoints} loaded, by state file (${formatting === 'pretty' ? 'pretty-printed' : 'one line'}, rewritten whole and renamed ${o.writesPerSecond}×/s)`,
    metrics: CHURN_METRICS,
  };
}

export function apiChurnInfo(o: ChurnOptions): WorkloadInfo {
  return {
    id: apiChurnId(o.services, o.endpoints),
    title: `${o.rate} Services' endpoints changed per second for ${o.seconds} s with ${o.services} Services × ${o.endpoints} loaded, through the API server (fake, loopback HTTP watch)`,
    metrics: CHURN_METRICS.filter((m) => m.key !== 'changedPerLoad'),
  };
}

/** One churn: `apply` hands the proxy one batch, the Services changed in `state` (and the probe's, when `probeMoved`). */
async function churn(ctx: Context, proxy: ScaleProxy, state: ScaleState, o: ChurnOptions, apply: (batch: readonly number[], probeMoved: boolean) => void | Promise<void>): Promise<{ metrics: Record<string, number>; series: Record<string, number[]> }> {
  const pid = proxy.started.pid;
  const rss: number[] = [];
  const sample = (): void => void rss.push(rssBytes([pid]) / MB);
  sample();
  const rssStartMB = rss[0] as number;
  const sampler = setInterval(sample, 1000);
  const moves: Array<number | undefined> = [];
  const probes: Array<Promise<void>> = [];
  const ticks = Math.round(o.seconds * o.writesPerSecond);
  const perTick = o.rate / o.writesPerSecond;
  let next = 1;
  let due = 0;
  let changed = 0;
  let probing = false;
  let probeAt: string = BACKEND_HOST;
  const cpu0 = cpuSeconds([pid]);
  const t0 = performance.now();
  try {
    for (let tick = 0; tick < ticks; tick++) {
      const wait = t0 + (tick * 1000) / o.writesPerSecond - performance.now();
      if (wait > 0) await sleep(wait);
      due += perTick;
      const batch: number[] = [];
      while (due >= 1) {
        batch.push(next);
        next = next + 1 >= o.services ? 1 : next + 1;
        due--;
      }
      state.churn(batch);
      changed += batch.length;
      // Once a second a move of the probe rides along, unless the last one is still being looked for.
      const move = tick % o.writesPerSecond === o.writesPerSecond - 1 && !probing;
      if (move) {
        probeAt = probeAt === BACKEND_HOST ? MOVED_HOST : BACKEND_HOST;
        state.moveProbe(probeAt);
      }
      await apply(batch, move);
      if (move) {
        probing = true;
        const at = performance.now();
        probes.push(
          probeUntil(PROBE_ANSWER[probeAt] as string, at, 5000, { spacingMs: 5, tailMs: 0 }).then((r) => {
            moves.push(r.moveMs);
            if (r.moveMs === undefined) ctx.say(`    a move was not seen within 5 s: ${r.probes} probes, ${r.errors} failed${r.firstError ? ` (${r.firstError})` : ''}`);
            probing = false;
          }),
        );
      }
    }
    await Promise.all(probes);
  } finally {
    clearInterval(sampler);
  }
  const seconds = (performance.now() - t0) / 1000;
  const cpuPct = ((cpuSeconds([pid]) - cpu0) / seconds) * 100;
  sample();
  const rssEndMB = rss[rss.length - 1] as number;
  const rssPeakMB = Math.max(...rss);
  const during = rss.length;
  for (let s = 0; s < o.afterSeconds; s++) {
    await sleep(1000);
    sample();
  }
  const seen = moves.filter((m): m is number => m !== undefined);
  ctx.say(`    churn: ${changed} changes in ${seconds.toFixed(1)} s, proxy CPU ${cpuPct.toFixed(1)}%, moves p50 ${median(seen).toFixed(1)} ms p99 ${percentile(seen, 99).toFixed(1)} ms (${seen.length} timed, ${moves.length - seen.length} missed), RSS ${rssStartMB.toFixed(0)} → peak ${rssPeakMB.toFixed(0)} → end ${rssEndMB.toFixed(0)} → after ${o.afterSeconds} s ${(rss[rss.length - 1] as number).toFixed(0)} MB`);
  return {
    metrics: {
      cpuPct,
      moveP50Ms: median(seen),
      moveP99Ms: percentile(seen, 99),
      moves: seen.length,
      missed: moves.length - seen.length,
      writesPerS: changed / seconds,
      rssStartMB,
      rssPeakMB,
      rssEndMB,
      rssAfterMB: rss[rss.length - 1] as number,
    },
    series: { rssMB: rss.map((v) => Math.round(v)), rssChurnSamples: [during], moveMs: moves.map((m) => (m === undefined ? -1 : Math.round(m * 10) / 10)) },
  };
}

export async function fileChurn(ctx: Context, o: ChurnOptions, formatting: Formatting, run: number): Promise<RunRecord> {
  const workload = fileChurnId(o.services, o.endpoints, formatting);
  const record: RunRecord = { workload, system: 'proxy', run, metrics: {} };
  const tag = `file-churn-${o.services}x${o.endpoints}-${formatting}-${run}`;
  let proxy: ScaleProxy | undefined;
  try {
    const dir = join(ctx.tmp, tag);
    mkdirSync(dir, { recursive: true });
    const stateFile = join(dir, 'state.json');
    const state = scaleStateFor(o.services, o.endpoints, formatting);
    writeByRename(stateFile, state.bytes());
    proxy = await startScaleProxy(ctx, { services: o.services, tag, stateFile });
    await settle();
    const since = Date.now();
    // Written off the event loop: a synchronous 40 MB write would hold up the probes' answers,
    // and the probe figures would be the harness's, not the proxy's.
    const r = await churn(ctx, proxy, state, o, async () => {
      await writeFile(`${stateFile}.tmp`, state.bytes());
      await rename(`${stateFile}.tmp`, stateFile);
    });
    const loads = logRecords(proxy.logFile, 'loaded state file', since).map((l) => (typeof l.changed === 'number' ? l.changed : NaN));
    record.metrics = { ...r.metrics, changedPerLoad: median(loads.filter(Number.isFinite)), loads: loads.length };
    record.series = r.series;
  } catch (err) {
    record.error = (err as Error).message;
  } finally {
    await proxy?.started.stop();
  }
  return record;
}

export async function apiChurn(ctx: Context, o: ChurnOptions, run: number): Promise<RunRecord> {
  const workload = apiChurnId(o.services, o.endpoints);
  const record: RunRecord = { workload, system: 'proxy', run, metrics: {} };
  const tag = `api-churn-${o.services}x${o.endpoints}-${run}`;
  let proxy: ScaleProxy | undefined;
  let api: FakeApiServer | undefined;
  try {
    const dir = join(ctx.tmp, tag);
    mkdirSync(dir, { recursive: true });
    api = await FakeApiServer.start();
    const server = api;
    const state = scaleStateFor(o.services, o.endpoints, 'compact');
    for (let i = 0; i < o.services; i++) {
      server.apply('services', state.serviceObject(i));
      server.apply('endpointslices', state.sliceObject(i));
    }
    const kubeconfig = join(dir, 'kubeconfig');
    writeFileSync(kubeconfig, server.kubeconfigYaml());
    proxy = await startScaleProxy(ctx, { services: o.services, tag, kubeconfig });
    await settle();
    // One MODIFIED event per changed slice, as the API sends them.
    const r = await churn(ctx, proxy, state, o, (batch, probeMoved) => {
      for (const i of batch) server.apply('endpointslices', state.sliceObject(i));
      if (probeMoved) server.apply('endpointslices', state.sliceObject(0));
    });
    record.metrics = r.metrics;
    record.series = r.series;
  } catch (err) {
    record.error = (err as Error).message;
  } finally {
    await proxy?.started.stop();
    await api?.close();
  }
  return record;
}

async function settle(): Promise<void> {
  const first = await probeOnce(5000);
  if (first !== 'A') throw new Error(`the probe Service answered "${first}" before any move, expected "A"`);
  // Past the file source's background indexing of its first read (3 s after it).
  await sleep(4000);
}
