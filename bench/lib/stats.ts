/** Summaries of repeated runs: the median is the figure, min and max show the spread. */
export interface Summary {
  n: number;
  median: number;
  min: number;
  max: number;
  /** (max - min) / median, in percent: how far apart the runs were. */
  spreadPct: number;
  /** The 99th percentile, nearest rank: the largest value of fewer than 100 runs. */
  p99: number;
}

export function median(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

export function summarize(values: readonly number[]): Summary {
  const finite = values.filter((v) => Number.isFinite(v));
  const m = median(finite);
  const min = finite.length ? Math.min(...finite) : NaN;
  const max = finite.length ? Math.max(...finite) : NaN;
  const spreadPct = m !== 0 && Number.isFinite(m) ? ((max - min) / Math.abs(m)) * 100 : 0;
  return { n: finite.length, median: m, min, max, spreadPct, p99: percentile(finite, 99) };
}

/** The p-th percentile (0..100) of samples, nearest rank. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const rank = Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1));
  return s[rank] as number;
}
