import { findFigure } from './figures.js';
import { SYSTEM_IDS, systemLabel } from './plan.js';
import type { BenchResults, MetricDef, TargetResult, WorkloadInfo } from './results.js';
import type { Summary } from './stats.js';

/** The terminal table (pure: results in, text out). */

export function fmtNum(v: number): string {
  if (!Number.isFinite(v)) return '-';
  const a = Math.abs(v);
  if (a >= 1000) return Math.round(v).toLocaleString('en-US');
  if (a >= 100) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 1) return v.toFixed(2);
  if (a === 0) return '0';
  return v.toPrecision(2);
}

/** median ±half the min–max range, in percent of the median; or median and p99, for workloads of many trials. */
function cell(s: Summary | undefined, p99 = false): string {
  if (!s) return '';
  if (p99 && s.n >= 2) return `${fmtNum(s.median)} (p99 ${fmtNum(s.p99)})`;
  if (s.n < 2 || s.median === 0) return fmtNum(s.median);
  return `${fmtNum(s.median)} ±${(s.spreadPct / 2).toFixed(s.spreadPct < 2 ? 1 : 0)}%`;
}

function header(m: MetricDef): string {
  const arrow = m.better === 'higher' ? ' ↑' : m.better === 'lower' ? ' ↓' : '';
  return `${m.label}${m.unit ? ` ${m.unit}` : ''}${arrow}`;
}

function pad(s: string, n: number): string {
  return s.length >= n ? `${s} ` : s + ' '.repeat(n - s.length);
}

function table(rows: string[][]): string[] {
  const widths: number[] = [];
  for (const r of rows) r.forEach((c, i) => (widths[i] = Math.max(widths[i] ?? 0, c.length + 2)));
  return rows.map((r) => `  ${r.map((c, i) => pad(c, widths[i] as number)).join('').trimEnd()}`);
}

function mark(t: TargetResult): string {
  return t.pass === undefined ? '·' : t.pass ? '✓' : '✗';
}

export function targetLine(t: TargetResult): string {
  if (t.actual === undefined) return `  ${mark(t)} ${t.text}: ${t.note}`;
  const actual = t.unit === '×' ? `${t.actual.toFixed(2)}×` : `${fmtNum(t.actual)} ${t.unit}`;
  const threshold = t.unit === '×' ? `${t.threshold}×` : `${fmtNum(t.threshold)} ${t.unit}`;
  return `  ${mark(t)} ${t.text}: ${actual} (needs ${t.comparator} ${threshold}; ${t.note})`;
}

/** A workload's title with how many runs (trials, for a workload of many) its figures are the median of. */
function titled(r: BenchResults, w: WorkloadInfo): string {
  const n = Math.max(0, ...r.figures.filter((f) => f.workload === w.id).map((f) => f.values.length));
  return `${w.title} (${n} ${w.p99 === true ? 'trial' : 'run'}${n === 1 ? '' : 's'})`;
}

export function renderTable(r: BenchResults): string {
  const out: string[] = [];
  const { workers } = (r.meta.options as { workers?: number } | undefined) ?? {};
  // Each workload says its own count: --runs, --churn-runs and the burst's runs differ.
  out.push('', 'Each figure: the median of the runs (or trials) counted beside its title, ± half the range between the slowest and the fastest run; (p99 …): the 99th percentile of the trials.');
  out.push('↑ higher is better, ↓ lower is better. Ratios are proxy ÷ other, medians of the same run.');
  for (const w of r.workloads) {
    const systems = SYSTEM_IDS.filter((s) => r.figures.some((f) => f.workload === w.id && f.system === s));
    if (systems.length === 0) continue;
    const metrics = w.metrics.filter((m) => r.figures.some((f) => f.workload === w.id && f.metric === m.key));
    if (systems.length === 1 && systems[0] === 'proxy') {
      // The proxy alone (the scale runs): one line per figure reads better than a wide row.
      out.push('', titled(r, w), ...table(metrics.map((m) => [header(m), cell(findFigure(r.figures, w.id, 'proxy', m.key), w.p99)])));
      for (const f of r.runs.filter((x) => x.workload === w.id && x.error)) out.push(`  ! run ${f.run}: ${f.error}`);
      continue;
    }
    const rows: string[][] = [['', ...metrics.map(header)]];
    for (const s of systems) rows.push([systemLabel(s, workers), ...metrics.map((m) => cell(findFigure(r.figures, w.id, s, m.key), w.p99))]);
    for (const other of ['nginx', 'haproxy'] as const) {
      if (!systems.includes('proxy') || !systems.includes(other)) continue;
      rows.push([`proxy ÷ ${other === 'nginx' ? 'nginx stream' : 'HAProxy'}`, ...metrics.map((m) => {
        const ratio = r.ratios.find((x) => x.workload === w.id && x.metric === m.key && x.against === other);
        return ratio ? `${ratio.ratio.toFixed(2)}×` : '';
      })]);
    }
    out.push('', titled(r, w), ...table(rows));
    const failed = r.runs.filter((x) => x.workload === w.id && x.error);
    for (const f of failed) out.push(`  ! run ${f.run} via ${f.system}: ${f.error}`);
  }
  if (r.skipped.length > 0) {
    out.push('', 'Skipped:');
    for (const s of r.skipped) out.push(`  - ${s.what}: ${s.why}`);
  }
  out.push('', 'Targets:');
  for (const t of r.targets) out.push(targetLine(t));
  return `${out.join('\n')}\n`;
}
