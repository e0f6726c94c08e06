import type { SystemId } from './plan.js';
import type { Summary } from './stats.js';

/** The shapes written to bench/results/*.json. */

export type Better = 'higher' | 'lower' | 'none';

export interface MetricDef {
  key: string;
  label: string;
  unit: string;
  better: Better;
}

/** One measured run of one workload on one system. */
export interface RunRecord {
  /** Workload id, with its size for scale workloads: `scale-start@10000`. */
  workload: string;
  system: SystemId;
  run: number;
  metrics: Record<string, number>;
  /** Samples over the run's time (RSS every second, for one), for the JSON. */
  series?: Record<string, number[]>;
  /** Set when the run failed; its metrics are then empty. */
  error?: string;
}

/** The median of a metric over the runs, with its spread. */
export interface Figure {
  workload: string;
  system: SystemId;
  metric: string;
  label: string;
  unit: string;
  better: Better;
  values: number[];
  summary: Summary;
}

/** The proxy's median over another system's, same workload and metric. */
export interface Ratio {
  workload: string;
  metric: string;
  against: SystemId;
  /** proxy / other. */
  ratio: number;
  /** Oriented so that above 1 means the proxy did better (other / proxy for lower-is-better). */
  standing: number;
  /** The same over the runs' extremes: the proxy's worst run against the other's best, and back. */
  standingLow: number;
  standingHigh: number;
}

export interface TargetResult {
  id: string;
  text: string;
  /** The measured value the target is judged on (a ratio, or an absolute figure). */
  actual: number | undefined;
  threshold: number;
  comparator: '>=' | '<=' | '<';
  unit: string;
  /** undefined when it could not be judged (a system or tool missing). */
  pass: boolean | undefined;
  note: string;
}

export interface WorkloadInfo {
  id: string;
  title: string;
  metrics: MetricDef[];
  /** Show the runs' 99th percentile beside their median (workloads of many short trials). */
  p99?: boolean;
}

export interface BenchResults {
  schema: 'kube-userspace-proxy-bench/1';
  meta: Record<string, unknown>;
  skipped: Array<{ what: string; why: string }>;
  workloads: WorkloadInfo[];
  runs: RunRecord[];
  figures: Figure[];
  ratios: Ratio[];
  targets: TargetResult[];
}
