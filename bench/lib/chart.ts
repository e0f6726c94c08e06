import { fmtNum } from './report.js';
import type { BenchResults, Ratio } from './results.js';
import { systemLabel } from './plan.js';
import { TARGETS } from './targets.js';

/**
 * The results as one SVG (pure: results in, text out): for each comparison, one bar per figure
 * showing where the proxy stands on a log scale centred on parity. Right of the centre line the
 * proxy does better, left it does worse, whatever the metric's direction. Whiskers span the runs'
 * extremes; a black tick marks the target where there is one.
 */

const W = 980;
const LABEL_X = 16;
const BAR_X0 = 360;
const BAR_X1 = 820;
const VALUE_X = 832;
const ROW = 22;
const MIN_STANDING = 1 / 8;
const MAX_STANDING = 8;

function x(standing: number): number {
  const s = Math.min(MAX_STANDING, Math.max(MIN_STANDING, standing));
  const t = (Math.log2(s) - Math.log2(MIN_STANDING)) / (Math.log2(MAX_STANDING) - Math.log2(MIN_STANDING));
  return BAR_X0 + t * (BAR_X1 - BAR_X0);
}

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

interface Row {
  label: string;
  standing: number;
  low?: number;
  high?: number;
  /** Standing the target asks for, if any. */
  target?: number;
  value: string;
}

/** Ratio targets as standings: ≥0.9× throughput stays 0.9; ≤1.5× latency becomes 1/1.5. */
function targetStanding(workload: string, metric: string): number | undefined {
  const t = TARGETS.find((x) => x.kind === 'ratio' && x.workload === workload && x.metric === metric);
  if (!t || t.kind !== 'ratio') return undefined;
  return t.comparator === '>=' ? t.threshold : 1 / t.threshold;
}

/** What the chart shows per workload (the table and the JSON have every metric). */
const CHARTED: Readonly<Record<string, { name: string; metrics: readonly string[] }>> = {
  'tcp-bulk': { name: 'TCP bulk, upload', metrics: ['gbps', 'cpuPerOp'] },
  'tcp-bulk-down': { name: 'TCP bulk, download', metrics: ['gbps', 'cpuPerOp'] },
  'http-keepalive': { name: 'keep-alive HTTP', metrics: ['rps', 'p99Ms', 'cpuPerOp'] },
  'http-close': { name: 'short connections', metrics: ['cps', 'p99Ms', 'cpuPerOp'] },
  'udp-pingpong': { name: 'UDP ping-pong', metrics: ['avgUs', 'p99Us', 'cpuPerOp'] },
  dns: { name: 'DNS over UDP', metrics: ['qps', 'avgLatencyMs', 'cpuPerOp'] },
  'idle-conns': { name: 'idle connections', metrics: ['deltaMB'] },
};

function ratioRows(r: BenchResults, against: 'nginx' | 'haproxy'): Row[] {
  const rows: Row[] = [];
  for (const w of r.workloads) {
    const charted = CHARTED[w.id.replace(/@.*$/, '')];
    if (!charted) continue;
    for (const key of charted.metrics) {
      const m = w.metrics.find((x) => x.key === key);
      const ratio: Ratio | undefined = r.ratios.find((x) => x.workload === w.id && x.metric === key && x.against === against);
      if (!m || !ratio) continue;
      const target = targetStanding(w.id, key);
      rows.push({
        label: `${charted.name}: ${m.label}`,
        standing: ratio.standing,
        low: ratio.standingLow,
        high: ratio.standingHigh,
        ...(target === undefined ? {} : { target }),
        value: `${ratio.ratio.toFixed(2)}× ${m.better === 'higher' ? '(↑ better)' : '(↓ better)'}`,
      });
    }
  }
  return rows;
}

const BUDGET_LABELS: Readonly<Record<string, string>> = {
  'start-10k': '10,000 ports: start to listening',
  'rss-10k': '10,000 ports: RSS',
  'move-10k': '10,000 ports: endpoint move',
  'idle-9000': '9,000 idle connections: RSS added',
};

function budgetRows(r: BenchResults): Row[] {
  return r.targets
    .filter((t) => t.unit !== '×' && t.unit !== '%' && t.actual !== undefined && t.actual > 0)
    .map((t) => ({ label: BUDGET_LABELS[t.id] ?? t.id, standing: t.threshold / (t.actual as number), target: 1, value: `${fmtNum(t.actual as number)} of ${fmtNum(t.threshold)} ${t.unit}` }));
}

function panel(title: string, rows: Row[], top: number): { svg: string; height: number } {
  if (rows.length === 0) return { svg: '', height: 0 };
  const parts: string[] = [`<text x="${LABEL_X}" y="${top + 16}" class="h">${esc(title)}</text>`];
  const y0 = top + 26;
  const height = 26 + rows.length * ROW + 26;
  for (const g of [1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8]) {
    const gx = x(g).toFixed(1);
    parts.push(`<line x1="${gx}" y1="${y0}" x2="${gx}" y2="${y0 + rows.length * ROW}" class="${g === 1 ? 'parity' : 'grid'}"/>`);
    parts.push(`<text x="${gx}" y="${y0 + rows.length * ROW + 14}" class="tick">${g < 1 ? `1/${1 / g}` : g}×</text>`);
  }
  rows.forEach((row, i) => {
    const cy = y0 + i * ROW + ROW / 2;
    const good = row.standing >= (row.target ?? 1);
    const xs = x(1);
    const xe = x(row.standing);
    parts.push(`<text x="${LABEL_X}" y="${cy + 4}" class="l">${esc(row.label)}</text>`);
    parts.push(`<rect x="${Math.min(xs, xe).toFixed(1)}" y="${cy - 7}" width="${Math.max(1, Math.abs(xe - xs)).toFixed(1)}" height="14" class="${good ? 'good' : 'bad'}"/>`);
    if (row.low !== undefined && row.high !== undefined) {
      parts.push(`<line x1="${x(row.low).toFixed(1)}" y1="${cy}" x2="${x(row.high).toFixed(1)}" y2="${cy}" class="whisker"/>`);
    }
    if (row.target !== undefined) {
      const tx = x(row.target).toFixed(1);
      parts.push(`<line x1="${tx}" y1="${cy - 10}" x2="${tx}" y2="${cy + 10}" class="target"/>`);
    }
    parts.push(`<text x="${VALUE_X}" y="${cy + 4}" class="v">${esc(row.value)}</text>`);
  });
  return { svg: parts.join('\n'), height };
}

export function renderChart(r: BenchResults): string {
  const panels: Array<{ svg: string; height: number }> = [];
  let y = 80;
  const workers = (r.meta.options as { workers?: number } | undefined)?.workers ?? 1;
  for (const [title, rows] of [
    [`${systemLabel('proxy', workers)} vs ${systemLabel('nginx', workers)}, same run: right of 1× = the proxy does better`, ratioRows(r, 'nginx')],
    [`${systemLabel('proxy', workers)} vs ${systemLabel('haproxy', workers)}, same run`, ratioRows(r, 'haproxy')],
    ['Scale budgets: right of 1× = within budget', budgetRows(r)],
  ] as const) {
    const p = panel(title, [...rows], y);
    if (p.height === 0) continue;
    panels.push(p);
    y += p.height + 8;
  }
  const meta = r.meta as { date?: string; label?: string; conditions?: string; options?: { runs?: number } };
  const subtitle = [meta.date, meta.label].filter(Boolean).join(' · ');
  const legend = `bars: medians of ${meta.options?.runs ?? 'several'} runs · whiskers: the runs' extremes · black tick: the target · green: meets it (or ≥ 1× where there is none)`;
  const height = y + 24;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${height}" viewBox="0 0 ${W} ${height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">
<style>
  .t { font-size: 17px; font-weight: bold; }
  .s { font-size: 11px; fill: #555; }
  .h { font-size: 13px; font-weight: bold; }
  .l { font-size: 12px; }
  .v { font-size: 12px; fill: #333; }
  .tick { font-size: 10px; fill: #777; text-anchor: middle; }
  .grid { stroke: #e3e3e3; }
  .parity { stroke: #888; stroke-width: 1.5; }
  .good { fill: #4f9a5a; }
  .bad { fill: #c8553d; }
  .whisker { stroke: #222; stroke-width: 1.2; }
  .target { stroke: #000; stroke-width: 2.5; }
</style>
<rect width="100%" height="100%" fill="#fff"/>
<text x="${LABEL_X}" y="26" class="t">kube-userspace-proxy benchmark: where the proxy stands (log scale)</text>
<text x="${LABEL_X}" y="42" class="s">${esc(subtitle)}</text>
<text x="${LABEL_X}" y="56" class="s">${esc(meta.conditions ?? '')}</text>
<text x="${LABEL_X}" y="70" class="s">${esc(legend)}</text>
${panels.map((p) => p.svg).join('\n')}
</svg>
`;
}
