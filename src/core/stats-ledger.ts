import { ServicePortStats, type DialFailureReason } from './stats.js';

/**
 * Turns the proxier's live ServicePortStats into series that only ever grow, read at scrape time.
 *
 * A unit's stats object lives as long as its socket: closing or recreating a unit (a port
 * changed, a traffic policy split) starts a fresh one, and connections still draining on a
 * retired socket keep counting on the old one. The ledger keeps every stats object it has seen
 * until nothing can count on it any more (no connection or session open), then folds its final
 * values into its series' base. A series is named by its labels (service port, protocol, scope),
 * so it survives recreation; it is dropped once its service port is gone and drained, one
 * reading after its last change, so the final values are read once.
 */

export interface SeriesLabels {
  /** `namespace/name:port`, upstream's ServicePortName string. */
  servicePort: string;
  protocol: string;
  /** The unit's traffic scope: all, cluster or external (units.ts). */
  scope: string;
}

export const DIAL_FAILURE_REASONS: readonly DialFailureReason[] = ['refused', 'timeout', 'unreachable', 'other'];

/** Totals of one series: the counters of ServicePortStats, summed over the units it has had. */
export class Totals extends ServicePortStats {
  reset(): this {
    this.accepted = this.active = this.bytesToEndpoint = this.bytesToClient = this.dialAttempts = 0;
    for (const r of DIAL_FAILURE_REASONS) this.dialFailures[r] = 0;
    this.noEndpointRejects = this.dialExhausted = 0;
    this.udpSessionsActive = this.udpSessionsCreated = this.udpSessionsReclaimed = this.udpDatagrams = 0;
    this.udpDatagramsDropped = this.udpReceiveBufferDrops = 0;
    this.outlierEjections = this.sourceRejects = this.held = this.heldTotal = this.holdExpired = 0;
    this.dialLatencyCounts.fill(0);
    this.dialLatencySum = this.dialLatencyCount = 0;
    return this;
  }

  add(s: ServicePortStats | Totals): void {
    this.accepted += s.accepted;
    this.active += s.active;
    this.bytesToEndpoint += s.bytesToEndpoint;
    this.bytesToClient += s.bytesToClient;
    this.dialAttempts += s.dialAttempts;
    for (const r of DIAL_FAILURE_REASONS) this.dialFailures[r] += s.dialFailures[r];
    this.noEndpointRejects += s.noEndpointRejects;
    this.dialExhausted += s.dialExhausted;
    this.udpSessionsActive += s.udpSessionsActive;
    this.udpSessionsCreated += s.udpSessionsCreated;
    this.udpSessionsReclaimed += s.udpSessionsReclaimed;
    this.udpDatagrams += s.udpDatagrams;
    this.udpDatagramsDropped += s.udpDatagramsDropped;
    this.udpReceiveBufferDrops += s.udpReceiveBufferDrops;
    this.outlierEjections += s.outlierEjections;
    this.sourceRejects += s.sourceRejects;
    this.held += s.held;
    this.heldTotal += s.heldTotal;
    this.holdExpired += s.holdExpired;
    for (let i = 0; i < this.dialLatencyCounts.length; i++) this.dialLatencyCounts[i] = (this.dialLatencyCounts[i] as number) + (s.dialLatencyCounts[i] ?? 0);
    this.dialLatencySum += s.dialLatencySum;
    this.dialLatencyCount += s.dialLatencyCount;
  }
}

export interface LiveStats {
  labels: SeriesLabels;
  stats: ServicePortStats;
}

export interface Series {
  labels: SeriesLabels;
  totals: Totals;
}

/** Valid until the next read(): its objects are reused, so a scrape allocates little. */
export interface Reading {
  /** One entry per series, sorted by service port. */
  series: Series[];
  /** Every series, plus what dropped series had counted: node-wide totals that never go down. */
  node: Totals;
}

interface SeriesState {
  labels: SeriesLabels;
  /** Final values of stats objects folded in. */
  base: Totals;
  /** Stats objects that may still count. */
  tracked: Set<ServicePortStats>;
  /** Read once with nothing live or tracked: dropped at the next reading. */
  gone: boolean;
  /** This series as last read (reused). */
  current: Series;
}

export class StatsLedger {
  private readonly series = new Map<string, SeriesState>();
  private readonly owner = new Map<ServicePortStats, SeriesState>();
  /** Totals of series dropped so far. */
  private readonly dropped = new Totals();
  private readonly node = new Totals();

  /** One reading: `live` is every running unit's stats (Proxier.unitStats()). O(units). */
  read(live: Iterable<LiveStats>): Reading {
    const seen = new Set<ServicePortStats>();
    for (const { labels, stats } of live) {
      seen.add(stats);
      if (this.owner.has(stats)) continue;
      const key = `${labels.servicePort}|${labels.protocol}|${labels.scope}`;
      let state = this.series.get(key);
      if (state === undefined) {
        const copy = { ...labels };
        state = { labels: copy, base: new Totals(), tracked: new Set(), gone: false, current: { labels: copy, totals: new Totals() } };
        this.series.set(key, state);
      }
      state.tracked.add(stats);
      this.owner.set(stats, state);
    }

    const node = this.node.reset();
    node.add(this.dropped);
    const out: Series[] = [];
    for (const [key, state] of this.series) {
      for (const stats of state.tracked) {
        // Retired and drained: nothing can count on it any more.
        if (!seen.has(stats) && stats.active === 0 && stats.udpSessionsActive === 0 && stats.held === 0) {
          state.base.add(stats);
          state.tracked.delete(stats);
          this.owner.delete(stats);
        }
      }
      if (state.tracked.size === 0) {
        if (state.gone) {
          this.series.delete(key);
          this.dropped.add(state.base);
          node.add(state.base);
          continue;
        }
        state.gone = true;
      } else {
        state.gone = false;
      }
      const totals = state.current.totals.reset();
      totals.add(state.base);
      for (const stats of state.tracked) totals.add(stats);
      node.add(totals);
      out.push(state.current);
    }
    out.sort((a, b) => (a.labels.servicePort < b.labels.servicePort ? -1 : a.labels.servicePort > b.labels.servicePort ? 1 : 0));
    return { series: out, node };
  }
}
