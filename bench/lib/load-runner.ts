import type { Backends } from './backends.js';
import type { Context } from './context.js';
import { SERVICES, systemLabel } from './plan.js';
import { cpuSeconds, sleep } from './proc.js';
import type { MetricDef, RunRecord, WorkloadInfo } from './results.js';
import type { System } from './systems.js';
import { missingLine } from './tools.js';
import type { LoadWorkload } from './workloads.js';

/** The metrics every load run gets besides the workload's own, for systems with processes. */
export function cpuMetrics(w: LoadWorkload): MetricDef[] {
  return [
    { key: 'cpuPct', label: 'system CPU', unit: '% of a core', better: 'none' },
    { key: 'cpuPerOp', label: w.perOp.label, unit: w.perOp.unit, better: 'lower' },
  ];
}

export function loadWorkloadInfo(w: LoadWorkload): WorkloadInfo {
  return { id: w.id, title: w.title, metrics: [...w.metrics, ...cpuMetrics(w)] };
}

function fmt(v: number): string {
  return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2);
}

/** Rotate so that no system always runs first (or right after the same neighbour) in a round. */
function rotate<T>(items: readonly T[], by: number): T[] {
  const k = items.length === 0 ? 0 : by % items.length;
  return [...items.slice(k), ...items.slice(0, k)];
}

async function measure(ctx: Context, w: LoadWorkload, sys: System, durationS: number, run: number): Promise<RunRecord> {
  const record: RunRecord = { workload: w.id, system: sys.id, run, metrics: {} };
  const cpu0 = cpuSeconds(sys.pids);
  const t0 = performance.now();
  try {
    record.metrics = await w.run(ctx, sys.target(w.service), durationS);
  } catch (err) {
    record.error = (err as Error).message;
    return record;
  }
  const wallS = (performance.now() - t0) / 1000;
  if (sys.pids.length > 0) {
    const cpu = cpuSeconds(sys.pids) - cpu0;
    record.metrics.cpuPct = (cpu / wallS) * 100;
    const ops = w.opsPerSecond(record.metrics) * durationS;
    if (ops > 0) record.metrics.cpuPerOp = (cpu / ops) * w.perOp.scale;
  }
  return record;
}

/**
 * Every workload on every system that can carry it, `runs` times. Runs are interleaved (run 1 of
 * every system, then run 2, ...) with the order rotated each round, so a slow patch on a shared
 * machine lands on all systems rather than on one.
 */
export async function runLoadWorkloads(ctx: Context, systems: readonly System[], backends: Backends, workloads: readonly LoadWorkload[], record: (r: RunRecord) => void): Promise<LoadWorkload[]> {
  const ready: Array<{ w: LoadWorkload; systems: System[] }> = [];
  for (const w of workloads) {
    const missing = missingLine(ctx.tools, w.tools);
    if (missing) {
      ctx.skip(w.title, missing);
      continue;
    }
    if (!backends.up.has(w.service)) {
      ctx.skip(w.title, `its backend (${w.service}) is not running`);
      continue;
    }
    const protocol = SERVICES[w.service].protocol;
    const able = systems.filter((s) => s.protocols.has(protocol));
    for (const s of systems) {
      const name = systemLabel(s.id, ctx.options.workers);
      if (!able.includes(s)) ctx.skip(`${w.title} via ${name}`, `${name} does not proxy ${protocol}`);
    }
    ready.push({ w, systems: able });
  }
  const { runs, durationS, warmupS } = ctx.options;
  if (warmupS > 0) {
    ctx.say(`warm-up: ${warmupS}s per workload and system (not recorded)`);
    for (const { w, systems: able } of ready) {
      for (const s of able) {
        const r = await measure(ctx, w, s, warmupS, 0);
        if (r.error) ctx.say(`  warm-up ${w.id} via ${s.id} failed: ${r.error}`);
      }
    }
  }
  for (let run = 1; run <= runs; run++) {
    for (const { w, systems: able } of ready) {
      for (const s of rotate(able, run - 1)) {
        const r = await measure(ctx, w, s, durationS, run);
        record(r);
        const shown = r.error ? `FAILED: ${r.error}` : Object.entries(r.metrics).map(([k, v]) => `${k}=${fmt(v)}`).join(' ');
        ctx.say(`  [run ${run}/${runs}] ${w.id.padEnd(15)} ${s.id.padEnd(8)} ${shown}`);
        await sleep(200);
      }
    }
  }
  return ready.map((r) => r.w);
}
