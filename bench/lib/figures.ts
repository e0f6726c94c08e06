import type { SystemId } from './plan.js';
import type { Figure, Ratio, RunRecord, WorkloadInfo } from './results.js';
import { summarize, type Summary } from './stats.js';

/** Runs -> one figure per workload, system and metric (pure). */
export function figuresOf(runs: readonly RunRecord[], workloads: readonly WorkloadInfo[]): Figure[] {
  const out: Figure[] = [];
  for (const w of workloads) {
    const systems = [...new Set(runs.filter((r) => r.workload === w.id).map((r) => r.system))];
    for (const system of systems) {
      for (const m of w.metrics) {
        const values = runs.filter((r) => r.workload === w.id && r.system === system && Number.isFinite(r.metrics[m.key])).map((r) => r.metrics[m.key] as number);
        if (values.length === 0) continue;
        out.push({ workload: w.id, system, metric: m.key, label: m.label, unit: m.unit, better: m.better, values, summary: summarize(values) });
      }
    }
  }
  return out;
}

export function findFigure(figures: readonly Figure[], workload: string, system: SystemId, metric: string): Summary | undefined {
  return figures.find((f) => f.workload === workload && f.system === system && f.metric === metric)?.summary;
}

/** The proxy against each other system, per workload and comparable metric (pure). */
export function ratiosOf(figures: readonly Figure[], against: readonly SystemId[] = ['nginx', 'haproxy']): Ratio[] {
  const out: Ratio[] = [];
  for (const p of figures.filter((f) => f.system === 'proxy' && f.better !== 'none')) {
    for (const other of against) {
      const o = findFigure(figures, p.workload, other, p.metric);
      if (!o) continue;
      const a = p.summary;
      const ratio = a.median / o.median;
      if (!Number.isFinite(ratio) || ratio === 0) continue;
      const higher = p.better === 'higher';
      out.push({
        workload: p.workload,
        metric: p.metric,
        against: other,
        ratio,
        standing: higher ? ratio : 1 / ratio,
        standingLow: higher ? a.min / o.max : o.min / a.max,
        standingHigh: higher ? a.max / o.min : o.max / a.min,
      });
    }
  }
  return out;
}
