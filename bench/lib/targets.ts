import { findFigure } from './figures.js';
import type { Figure, TargetResult } from './results.js';

/**
 * The figures the proxy is to reach (the benchmark issue), judged on medians of the same run.
 * Ratios are against nginx's stream proxy; the scale targets are absolute budgets.
 */
interface RatioTarget {
  kind: 'ratio';
  id: string;
  text: string;
  workload: string;
  metric: string;
  comparator: '>=' | '<=';
  threshold: number;
}

interface AbsoluteTarget {
  kind: 'absolute';
  id: string;
  text: string;
  /** With a trailing `/`, every workload whose id starts so (all formattings and write modes of a size): the worst counts. */
  workload: string;
  metrics: string[];
  /** Over the runs: their median, or their 99th percentile (trials of an endpoint move). */
  stat?: 'median' | 'p99';
  comparator: '<=' | '<';
  threshold: number;
  unit: string;
}

interface NoWorseTarget {
  kind: 'no-worse';
  id: string;
  text: string;
  workload: string;
  metric: string;
  unit: string;
}

/** A figure of one workload against the same figure of another (a larger size against none). */
interface GrowthTarget {
  kind: 'growth';
  id: string;
  text: string;
  workload: string;
  baseline: string;
  metric: string;
  threshold: number;
}

type Target = RatioTarget | AbsoluteTarget | NoWorseTarget | GrowthTarget;

export const TARGETS: readonly Target[] = [
  { kind: 'ratio', id: 'tcp-bulk', text: 'TCP bulk throughput ≥ 1× nginx stream', workload: 'tcp-bulk', metric: 'gbps', comparator: '>=', threshold: 1 },
  { kind: 'ratio', id: 'keepalive-rps', text: 'keep-alive requests/s ≥ 0.9× nginx stream', workload: 'http-keepalive', metric: 'rps', comparator: '>=', threshold: 0.9 },
  { kind: 'ratio', id: 'keepalive-p99', text: 'keep-alive p99 latency ≤ 1.5× nginx stream', workload: 'http-keepalive', metric: 'p99Ms', comparator: '<=', threshold: 1.5 },
  { kind: 'ratio', id: 'close-cps', text: 'short connections/s ≥ 0.9× nginx stream', workload: 'http-close', metric: 'cps', comparator: '>=', threshold: 0.9 },
  { kind: 'ratio', id: 'dns-qps', text: 'DNS queries/s ≥ 1× nginx stream', workload: 'dns', metric: 'qps', comparator: '>=', threshold: 1 },
  { kind: 'no-worse', id: 'dns-loss', text: 'DNS loss no more than nginx stream', workload: 'dns', metric: 'lostPct', unit: '%' },
  { kind: 'ratio', id: 'udp-p99', text: 'UDP ping-pong p99 ≤ 1× nginx stream', workload: 'udp-pingpong', metric: 'p99Us', comparator: '<=', threshold: 1 },
  // The scale issue's goals, for 10 endpoints per Service.
  { kind: 'absolute', id: 'start-10k', text: '10,000 Services × 10 endpoints listening within 1 s of start (either formatting)', workload: 'scale-start@10000x10/', metrics: ['listenMs'], comparator: '<', threshold: 1000, unit: 'ms' },
  { kind: 'absolute', id: 'rss-10k', text: 'RSS with 10,000 Services × 10 endpoints under 300 MB', workload: 'scale-start@10000x10/', metrics: ['rssMB', 'rssSettledMB'], comparator: '<', threshold: 300, unit: 'MB' },
  { kind: 'absolute', id: 'start-30k', text: '30,000 Services × 10 endpoints listening within 3 s of start (either formatting)', workload: 'scale-start@30000x10/', metrics: ['listenMs'], comparator: '<', threshold: 3000, unit: 'ms' },
  { kind: 'absolute', id: 'rss-30k', text: 'RSS with 30,000 Services × 10 endpoints under 1 GB', workload: 'scale-start@30000x10/', metrics: ['rssMB', 'rssSettledMB'], comparator: '<', threshold: 1024, unit: 'MB' },
  { kind: 'absolute', id: 'move-10k', text: 'endpoint move in a file of 10,000 Services × 10, written whole (either formatting, renamed or in place), reaches new connections within 100 ms, p99', workload: 'endpoint-move@10000x10/', metrics: ['moveMs'], stat: 'p99', comparator: '<', threshold: 100, unit: 'ms' },
  { kind: 'absolute', id: 'file-churn-cpu', text: 'file churn, 100 Services/s at 10 writes/s: proxy under 50% of a core', workload: 'file-churn@10000x10/', metrics: ['cpuPct'], comparator: '<', threshold: 50, unit: '%' },
  { kind: 'absolute', id: 'file-churn-move', text: 'file churn: a moved endpoint reaches new connections within 200 ms, p99', workload: 'file-churn@10000x10/', metrics: ['moveP99Ms'], comparator: '<', threshold: 200, unit: 'ms' },
  { kind: 'absolute', id: 'api-churn-move', text: 'API churn, 100 Services/s: a moved endpoint reaches new connections within 100 ms, p99', workload: 'api-churn@10000x10', metrics: ['moveP99Ms'], comparator: '<', threshold: 100, unit: 'ms' },
  { kind: 'absolute', id: 'burst-1000', text: 'a burst of 1,000 new connections: connect p99 under 50 ms', workload: 'conn-burst@1000', metrics: ['connectP99Ms'], comparator: '<', threshold: 50, unit: 'ms' },
  { kind: 'absolute', id: 'iptables-first-10k', text: 'iptables portal: first sync of 10,000 ClusterIP Services under 1 s', workload: 'iptables-scale@10000', metrics: ['firstSyncMs'], comparator: '<', threshold: 1000, unit: 'ms' },
  { kind: 'absolute', id: 'iptables-add-10k', text: 'iptables portal: adding one Service at 10,000 under 100 ms', workload: 'iptables-scale@10000', metrics: ['addOneMs'], comparator: '<', threshold: 100, unit: 'ms' },
  // "No growth", with room for the noise of a shared machine: 1.25× the round trip with no Service.
  { kind: 'growth', id: 'iptables-rtt-10k', text: 'iptables portal: unrelated round trip p50 at 10,000 ClusterIP Services ≤ 1.25× with none', workload: 'iptables-scale@10000', baseline: 'iptables-scale@0', metric: 'rtP50Ms', threshold: 1.25 },
  { kind: 'growth', id: 'iptables-rtt-np-10k', text: 'iptables portal: unrelated round trip p50 at 10,000 NodePort Services ≤ 1.25× with none', workload: 'iptables-scale-nodeport@10000', baseline: 'iptables-scale-nodeport@0', metric: 'rtP50Ms', threshold: 1.25 },
  { kind: 'absolute', id: 'idle-9000', text: '9,000 idle proxied connections under 150 MB above the idle baseline', workload: 'idle-conns@9000', metrics: ['deltaMB'], comparator: '<', threshold: 150, unit: 'MB' },
];

/** A target's workload ending in `/` names every workload whose id starts so; otherwise one. */
function matches(workload: string, pattern: string): boolean {
  return pattern.endsWith('/') ? workload.startsWith(pattern) : workload === pattern;
}

function holds(actual: number, comparator: '>=' | '<=' | '<', threshold: number): boolean {
  if (comparator === '>=') return actual >= threshold;
  if (comparator === '<=') return actual <= threshold;
  return actual < threshold;
}

/** Judge every target on the figures of one run (pure). */
export function judgeTargets(figures: readonly Figure[]): TargetResult[] {
  return TARGETS.map((t): TargetResult => {
    switch (t.kind) {
      case 'ratio': {
        const p = findFigure(figures, t.workload, 'proxy', t.metric);
        const n = findFigure(figures, t.workload, 'nginx', t.metric);
        if (!p || !n) return { id: t.id, text: t.text, actual: undefined, threshold: t.threshold, comparator: t.comparator, unit: '×', pass: undefined, note: 'not measured (proxy or nginx stream missing)' };
        const actual = p.median / n.median;
        // The extremes: could the runs' spread alone flip the verdict?
        const lo = p.min / n.max;
        const hi = p.max / n.min;
        const flips = holds(lo, t.comparator, t.threshold) !== holds(hi, t.comparator, t.threshold);
        return { id: t.id, text: t.text, actual, threshold: t.threshold, comparator: t.comparator, unit: '×', pass: holds(actual, t.comparator, t.threshold), note: `runs range ${lo.toFixed(2)}–${hi.toFixed(2)}×${flips ? '; within the spread of the runs' : ''}` };
      }
      case 'no-worse': {
        const p = findFigure(figures, t.workload, 'proxy', t.metric);
        const n = findFigure(figures, t.workload, 'nginx', t.metric);
        if (!p || !n) return { id: t.id, text: t.text, actual: undefined, threshold: NaN, comparator: '<=', unit: t.unit, pass: undefined, note: 'not measured (proxy or nginx stream missing)' };
        return { id: t.id, text: t.text, actual: p.median, threshold: n.median, comparator: '<=', unit: t.unit, pass: p.median <= n.median, note: `nginx stream: ${n.median.toFixed(3)}${t.unit} (max ${n.max.toFixed(3)}); proxy max ${p.max.toFixed(3)}${t.unit}` };
      }
      case 'growth': {
        const w = findFigure(figures, t.workload, 'proxy', t.metric);
        const b = findFigure(figures, t.baseline, 'proxy', t.metric);
        if (!w || !b) return { id: t.id, text: t.text, actual: undefined, threshold: t.threshold, comparator: '<=', unit: '×', pass: undefined, note: `not measured (${t.workload} or ${t.baseline} not run)` };
        const actual = w.median / b.median;
        return { id: t.id, text: t.text, actual, threshold: t.threshold, comparator: '<=', unit: '×', pass: actual <= t.threshold, note: `${w.median.toPrecision(3)} against ${b.median.toPrecision(3)}; runs range ${(w.min / b.max).toFixed(2)}–${(w.max / b.min).toFixed(2)}×` };
      }
      case 'absolute': {
        const fs = figures.filter((f) => f.system === 'proxy' && matches(f.workload, t.workload) && t.metrics.includes(f.metric));
        if (fs.length === 0) return { id: t.id, text: t.text, actual: undefined, threshold: t.threshold, comparator: t.comparator, unit: t.unit, pass: undefined, note: `not measured (${t.workload}… not run)` };
        const stat = t.stat ?? 'median';
        const worstFigure = fs.reduce((a, b) => (b.summary[stat] > a.summary[stat] ? b : a));
        const actual = worstFigure.summary[stat];
        const worst = Math.max(...fs.map((f) => f.summary.max));
        const which = fs.length > 1 ? `; worst of ${fs.length}: ${worstFigure.workload} ${worstFigure.metric}` : '';
        return { id: t.id, text: t.text, actual, threshold: t.threshold, comparator: t.comparator, unit: t.unit, pass: holds(actual, t.comparator, t.threshold), note: `${stat}; worst run ${worst.toFixed(1)} ${t.unit}${which}` };
      }
    }
  });
}
