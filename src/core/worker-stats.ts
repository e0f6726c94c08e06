import { DIAL_FAILURE_REASONS, Totals, type LiveStats, type Reading, type Series, type SeriesLabels } from './stats-ledger.js';
import { DIAL_LATENCY_BUCKETS, type ServicePortStats } from './stats.js';

/**
 * The node's counters when the data path runs in worker processes (`--workers`).
 *
 * Each worker follows its own units' counters as StatsLedger does (monotonic per series across a
 * unit's recreation) and reports the series that changed since the last report the controller
 * acknowledged, each with its cumulative values, as flat arrays of numbers: a report that is lost
 * (it came after the controller stopped waiting) is made good by the next, as a report sent twice
 * sets the same values twice. The controller keeps every worker's last report and sums them per
 * series at scrape time. A worker that exits (or is killed) is folded into a base that the sums
 * keep: its counters stay in the node's totals, its gauges (connections, sessions and held
 * connections open) drop to zero, as its connections did. What it counted after its last report
 * is lost.
 */

/** The flat form of a ServicePortStats: FIELD_COUNT numbers, in the order of flattenStats(). */
export type FlatStats = number[];

/**
 * The plain numbers of ServicePortStats a flat snapshot carries, in its order; the four dial
 * failures and the latency buckets follow. Every number a worker counts must be here, or the node
 * never sees it (test/worker-stats.test.ts checks each one through a report).
 */
const SCALARS = [
  'accepted', 'active', 'bytesToEndpoint', 'bytesToClient', 'dialAttempts', 'noEndpointRejects', 'dialExhausted',
  'udpSessionsActive', 'udpSessionsCreated', 'udpSessionsReclaimed', 'udpDatagrams', 'udpDatagramsDropped',
  'udpReceiveBufferDrops', 'outlierEjections', 'sourceRejects', 'held', 'heldTotal', 'holdExpired', 'dialLatencySum', 'dialLatencyCount',
] as const satisfies ReadonlyArray<keyof ServicePortStats>;

export const FIELD_COUNT = SCALARS.length + DIAL_FAILURE_REASONS.length + DIAL_LATENCY_BUCKETS.length + 1;
/** Indexes of the gauges (not counters): a worker gone takes these to zero. */
const GAUGES = (['active', 'udpSessionsActive', 'held'] as const).map((name) => SCALARS.indexOf(name));

export function flattenStats(s: ServicePortStats): FlatStats {
  const out: number[] = [];
  for (const name of SCALARS) out.push(s[name]);
  for (const r of DIAL_FAILURE_REASONS) out.push(s.dialFailures[r]);
  for (const c of s.dialLatencyCounts) out.push(c);
  return out;
}

/** Adds a flat snapshot into `t`. */
export function addFlat(t: ServicePortStats, f: readonly number[]): void {
  let i = 0;
  for (const name of SCALARS) t[name] += f[i++] ?? 0;
  for (const r of DIAL_FAILURE_REASONS) t.dialFailures[r] += f[i++] ?? 0;
  for (let b = 0; b < t.dialLatencyCounts.length; b++) t.dialLatencyCounts[b] = (t.dialLatencyCounts[b] as number) + (f[i++] ?? 0);
}

function addInto(into: number[], f: readonly number[]): void {
  for (let i = 0; i < FIELD_COUNT; i++) into[i] = (into[i] ?? 0) + (f[i] ?? 0);
}

function withoutGauges(f: readonly number[]): number[] {
  const out = f.slice();
  for (const g of GAUGES) out[g] = 0;
  return out;
}

export function seriesKey(l: SeriesLabels): string {
  return `${l.servicePort}|${l.protocol}|${l.scope}`;
}

function labelsOf(key: string): SeriesLabels {
  const [servicePort = '', protocol = '', scope = ''] = key.split('|');
  return { servicePort, protocol, scope };
}

/** One worker's counters: what changed since the last report the controller acknowledged. */
export interface WorkerReport {
  /** This report's number (1, 2, ...): the controller acknowledges it in its next request. */
  round: number;
  /** Series whose totals changed (or are new), by seriesKey(). */
  series: Array<[key: string, totals: FlatStats]>;
  /** Series the worker dropped (their service port gone and drained). */
  removed: string[];
  /** The worker's node-wide totals (every series, and what dropped ones had counted). */
  node: FlatStats;
  /** Connections and sessions open in the worker now. */
  active: number;
}

/** One stats object the reporter follows: a running unit's, or a retired one's still counting. */
interface Tracked {
  key: string;
  stats: ServicePortStats;
  /** Sum of the counters as last seen: they only grow, so any change to one changes the sum. */
  counters: number;
  active: number;
  sessions: number;
  held: number;
  /** The report that last saw it running. */
  seen: number;
}

interface SeriesState {
  /** Final values of the stats objects folded in. */
  base: FlatStats;
  objects: Set<Tracked>;
  /** As last reported. */
  flat: FlatStats;
}

function counterSum(s: ServicePortStats): number {
  const f = s.dialFailures;
  return s.accepted + s.bytesToEndpoint + s.bytesToClient + s.dialAttempts + f.refused + f.timeout + f.unreachable + f.other
    + s.noEndpointRejects + s.dialExhausted + s.udpSessionsCreated + s.udpSessionsReclaimed + s.udpDatagrams
    + s.udpDatagramsDropped + s.udpReceiveBufferDrops + s.outlierEjections + s.sourceRejects + s.heldTotal + s.holdExpired + s.dialLatencyCount;
}

const zeros = (): FlatStats => new Array<number>(FIELD_COUNT).fill(0);

/**
 * The worker's side: what changed since its last report, per series. It keeps the ledger's promises
 * (core/stats-ledger.ts: a series only grows across its unit's recreation; a retired unit's stats
 * count until its connections are gone, then fold into the series' base; a series whose service
 * port is gone is reported once more, then removed) while doing per report only a cheap check of
 * each stats object (the sum of its counters, which only grow, and its two gauges) and real work
 * for the series that changed: a report every second costs little at 10,000 service ports.
 */
export class StatsReporter {
  private readonly tracked = new Map<ServicePortStats, Tracked>();
  private readonly series = new Map<string, SeriesState>();
  /** Node-wide totals: every series as last reported, plus what removed ones had counted. */
  private readonly node: FlatStats = zeros();
  private round = 0;
  /** Series sent (values or removal) in a report not acknowledged yet: the round that last sent each. */
  private readonly unacked = new Map<string, number>();

  /**
   * `live`: every running unit's stats; `active`: connections and sessions open in the worker;
   * `acked`: the last report the controller received (default: the one before this).
   */
  report(live: Iterable<LiveStats>, active: number, acked = this.round): WorkerReport {
    const round = ++this.round;
    for (const [key, sent] of this.unacked) if (sent <= acked) this.unacked.delete(key);
    const dirty = new Set<string>();
    for (const { labels, stats } of live) {
      let t = this.tracked.get(stats);
      if (t === undefined) {
        const key = seriesKey(labels);
        t = { key, stats, counters: -1, active: -1, sessions: -1, held: -1, seen: round };
        this.tracked.set(stats, t);
        let state = this.series.get(key);
        if (state === undefined) {
          state = { base: zeros(), objects: new Set(), flat: zeros() };
          this.series.set(key, state);
        }
        state.objects.add(t);
      }
      t.seen = round;
      if (changed(t)) dirty.add(t.key);
    }
    for (const t of this.tracked.values()) {
      if (t.seen === round) continue;
      // Retired: it counts until its last connection, session or held connection is gone, then
      // folds into the base.
      if (changed(t)) dirty.add(t.key);
      if (t.stats.active === 0 && t.stats.udpSessionsActive === 0 && t.stats.held === 0) {
        const state = this.series.get(t.key) as SeriesState;
        addInto(state.base, flattenStats(t.stats));
        state.objects.delete(t);
        this.tracked.delete(t.stats);
        dirty.add(t.key);
      }
    }
    const series: WorkerReport['series'] = [];
    const removed: string[] = [];
    for (const [key, state] of this.series) {
      if (!dirty.has(key)) {
        // Its last object folded in and its final values went out in the report before: gone.
        if (state.objects.size === 0) {
          this.series.delete(key);
          removed.push(key);
        }
        continue;
      }
      const flat = state.base.slice();
      for (const t of state.objects) addInto(flat, flattenStats(t.stats));
      for (let i = 0; i < FIELD_COUNT; i++) this.node[i] = (this.node[i] as number) + (flat[i] as number) - (state.flat[i] as number);
      state.flat = flat;
      series.push([key, flat]);
    }
    // What went out in reports the controller never got, as it stands now.
    const sent = new Set([...series.map(([key]) => key), ...removed]);
    for (const key of this.unacked.keys()) {
      if (sent.has(key)) continue;
      const state = this.series.get(key);
      if (state === undefined) removed.push(key);
      else series.push([key, state.flat]);
    }
    for (const [key] of series) this.unacked.set(key, round);
    for (const key of removed) this.unacked.set(key, round);
    return { round, series, removed, node: this.node.slice(), active };
  }
}

/** Whether a stats object changed since it was last looked at; remembers what it saw. */
function changed(t: Tracked): boolean {
  const s = t.stats;
  const counters = counterSum(s);
  if (counters === t.counters && s.active === t.active && s.udpSessionsActive === t.sessions && s.held === t.held) return false;
  t.counters = counters;
  t.active = s.active;
  t.sessions = s.udpSessionsActive;
  t.held = s.held;
  return true;
}

interface WorkerCounters {
  series: Map<string, FlatStats>;
  node: FlatStats;
  active: number;
}

/** A worker slot's figures: its current process's counters plus every earlier process's of that slot. */
export interface SlotTotals {
  totals: Totals;
  active: number;
}

/** The controller's side: every worker's last report, summed per series. */
export class NodeStats {
  private readonly workers = new Map<number, WorkerCounters>();
  /** Series totals of workers gone, per series key; `gone`: read once with no worker reporting it and not running. */
  private readonly retired = new Map<string, { flat: FlatStats; gone: boolean }>();
  /** Node totals of workers gone. */
  private readonly retiredNode: FlatStats = new Array<number>(FIELD_COUNT).fill(0);
  /** Per slot: node totals of that slot's earlier processes. */
  private readonly slotBase = new Map<number, FlatStats>();

  /** A report from the process now in `slot`. */
  update(slot: number, report: WorkerReport): void {
    let w = this.workers.get(slot);
    if (w === undefined) {
      w = { series: new Map(), node: [], active: 0 };
      this.workers.set(slot, w);
    }
    for (const [key, flat] of report.series) w.series.set(key, flat);
    for (const key of report.removed) {
      // Drained in this worker: its counts stay in the series while another worker still serves
      // or drains it (a counter must not go down), as a dead worker's do.
      const flat = w.series.get(key);
      if (flat === undefined) continue;
      w.series.delete(key);
      this.keep(key, flat);
    }
    w.node = report.node;
    w.active = report.active;
  }

  /** The process in `slot` is gone: keep what it counted (its last report), not what it had open. */
  retire(slot: number): void {
    const w = this.workers.get(slot);
    if (w === undefined) return;
    this.workers.delete(slot);
    for (const [key, flat] of w.series) this.keep(key, flat);
    const node = withoutGauges(w.node);
    addInto(this.retiredNode, node);
    const base = this.slotBase.get(slot) ?? new Array<number>(FIELD_COUNT).fill(0);
    addInto(base, node);
    this.slotBase.set(slot, base);
  }

  /** A series' counters a worker no longer reports (it exited, or drained the series): kept. */
  private keep(key: string, flat: FlatStats): void {
    let r = this.retired.get(key);
    if (r === undefined) {
      r = { flat: new Array<number>(FIELD_COUNT).fill(0), gone: false };
      this.retired.set(key, r);
    }
    addInto(r.flat, withoutGauges(flat));
  }

  /** Connections and sessions open over every worker, as last reported. */
  active(): number {
    let n = 0;
    for (const w of this.workers.values()) n += w.active;
    return n;
  }

  /**
   * The node's series and totals: every worker's last report plus what workers gone had counted.
   * `running`: whether a series (by seriesKey) belongs to a unit the controller runs now. A series
   * no worker reports is kept while it runs (every worker may be down at once, waiting for its
   * replacement), and otherwise dropped one reading later; without `running`, as if none ran.
   */
  read(running?: (key: string) => boolean): Reading {
    const sums = new Map<string, Totals>();
    const total = (key: string): Totals => {
      let t = sums.get(key);
      if (t === undefined) {
        t = new Totals();
        sums.set(key, t);
      }
      return t;
    };
    const node = new Totals();
    addFlat(node, this.retiredNode);
    for (const w of this.workers.values()) {
      addFlat(node, w.node);
      for (const [key, flat] of w.series) addFlat(total(key), flat);
    }
    for (const [key, r] of this.retired) {
      if (!sums.has(key) && running?.(key) !== true) {
        // No worker serves this series any more: drop it one reading later, so its last values are
        // read once (they stay in the node's totals).
        if (r.gone) {
          this.retired.delete(key);
          continue;
        }
        r.gone = true;
      } else {
        r.gone = false;
      }
      addFlat(total(key), r.flat);
    }
    const series: Series[] = [...sums].map(([key, totals]) => ({ labels: labelsOf(key), totals }));
    series.sort((a, b) => (a.labels.servicePort < b.labels.servicePort ? -1 : a.labels.servicePort > b.labels.servicePort ? 1 : 0));
    return { series, node };
  }

  /** One slot's node-wide totals over its processes so far, and what its current one has open. */
  slot(slot: number): SlotTotals {
    const totals = new Totals();
    const base = this.slotBase.get(slot);
    if (base !== undefined) addFlat(totals, base);
    const w = this.workers.get(slot);
    if (w !== undefined) addFlat(totals, w.node);
    return { totals, active: w?.active ?? 0 };
  }
}
