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
  workload: string;
  metrics: string[];
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
  { kind: 'absolute', id: 'start-10k', text: '10,000 service ports listening within 2 s of start', workload: 'scale-start@10000', metrics: ['listenMs'], comparator: '<=', threshold: 2000, unit: 'ms' },
  { kind: 'absolute', id: 'rss-10k', text: 'RSS with 10,000 service ports under 300 MB', workload: 'scale-start@10000', metrics: ['rssMB', 'rssSettledMB'], comparator: '<', threshold: 300, unit: 'MB' },
  { kind: 'absolute', id: 'move-10k', text: 'endpoint move at 10,000 service ports reaches new connections within 100 ms', workload: 'endpoint-move@10000', metrics: ['moveMs'], comparator: '<=', threshold: 100, unit: 'ms' },
  { kind: 'absolute', id: 'iptables-first-10k', text: 'iptables portal: first sync of 10,000 ClusterIP Services under 1 s', workload: 'iptables-scale@10000', metrics: ['firstSyncMs'], comparator: '<', threshold: 1000, unit: 'ms' },
  { kind: 'absolute', id: 'iptables-add-10k', text: 'iptables portal: adding one Service at 10,000 under 100 ms', workload: 'iptables-scale@10000', metrics: ['addOneMs'], comparator: '<', threshold: 100, unit: 'ms' },
  // "No growth", with room for the noise of a shared machine: 1.25× the round trip with no Service.
  { kind: 'growth', id: 'iptables-rtt-10k', text: 'iptables portal: unrelated round trip p50 at 10,000 ClusterIP Services ≤ 1.25× with none', workload: 'iptables-scale@10000', baseline: 'iptables-scale@0', metric: 'rtP50Ms', threshold: 1.25 },
  { kind: 'growth', id: 'iptables-rtt-np-10k', text: 'iptables portal: unrelated round trip p50 at 10,000 NodePort Services ≤ 1.25× with none', workload: 'iptables-scale-nodeport@10000', baseline: 'iptables-scale-nodeport@0', metric: 'rtP50Ms', threshold: 1.25 },
  { kind: 'absolute', id: 'idle-9000', text: '9,000 idle proxied connections under 150 MB above the idle baseline', workload: 'idle-conns@9000', metrics: ['deltaMB'], comparator: '<', threshold: 150, unit: 'MB' },
];

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
        const fs = t.metrics.map((m) => findFigure(figures, t.workload, 'proxy', m)).filter((f) => f !== undefined);
        if (fs.length === 0) return { id: t.id, text: t.text, actual: undefined, threshold: t.threshold, comparator: t.comparator, unit: t.unit, pass: undefined, note: `not measured (${t.workload} not run)` };
        const actual = Math.max(...fs.map((f) => f.median));
        const worst = Math.max(...fs.map((f) => f.max));
        return { id: t.id, text: t.text, actual, threshold: t.threshold, comparator: t.comparator, unit: t.unit, pass: holds(actual, t.comparator, t.threshold), note: `worst run ${worst.toFixed(1)} ${t.unit}` };
      }
    }
  });
}
