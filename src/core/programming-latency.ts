import type { V1EndpointSlice } from '@kubernetes/client-node';
import type { Clock } from './clock.js';
import { namespacedName, objectKey, sliceServiceKey } from './object-key.js';
import { TRIGGER_TIME_ANNOTATION } from './translate.js';

/**
 * Network programming latency, kube-proxy's network_programming_duration_seconds: from the
 * moment a change happened in the cluster (the EndpointSlice controller's
 * `endpoints.kubernetes.io/last-change-trigger-time` annotation) to the end of the sync that made
 * new connections use it. Also, from the moment the change reached this proxy.
 *
 * No hook in the proxier is needed: a sync takes every change queued before it started, so a
 * change that reached the loop before a finished sync started is programmed by it. Metrics feed
 * it the loop's change and sync events.
 *
 * As kube-proxy: a slice counts when its trigger time is new (the controller rewrites the
 * annotation with every change it makes, so an unchanged annotation is a re-list or a resync,
 * not a change), and trigger times from before this tracker started are ignored (the first list
 * would report the age of the cluster).
 */

export interface ProgrammedChange {
  /** `namespace/name` of the Service. */
  service: string;
  /** Seconds from the trigger time to programmed: network_programming_duration_seconds. */
  sinceTriggerSeconds: number;
  /** Seconds from the change reaching the proxy to programmed. */
  sinceArrivalSeconds: number;
}

export interface ProgrammingLatencyOptions {
  /** Monotonic milliseconds: the proxier's clock (sync durations are measured on it). */
  clock: Clock;
  /** Wall-clock milliseconds since the epoch: trigger times are wall-clock. */
  wallNow: () => number;
  observe: (change: ProgrammedChange) => void;
  /** Pending changes kept at most (oldest dropped): a bound while nothing syncs. Default 100,000. */
  maxPending?: number;
}

interface Pending {
  service: string;
  triggerMs: number;
  arrived: number;
}

export class ProgrammingLatencyTracker {
  private readonly startedWall: number;
  /** Slice key -> the trigger-time annotation last seen on it. */
  private readonly seen = new Map<string, string>();
  private pending: Pending[] = [];
  private readonly maxPending: number;

  constructor(private readonly opts: ProgrammingLatencyOptions) {
    this.startedWall = opts.wallNow();
    this.maxPending = opts.maxPending ?? 100_000;
  }

  /** Changes waiting for a sync. */
  get pendingCount(): number {
    return this.pending.length;
  }

  /** An EndpointSlice was stored or updated. */
  upserted(slice: V1EndpointSlice): void {
    this.note(slice);
  }

  deleted(namespace: string, name: string): void {
    this.seen.delete(namespacedName(namespace, name));
  }

  /** A full list of EndpointSlices: the ones it lacks are gone. */
  replaced(slices: readonly V1EndpointSlice[]): void {
    const listed = new Set(slices.map(sliceKey));
    for (const key of [...this.seen.keys()]) if (!listed.has(key)) this.seen.delete(key);
    for (const o of slices) this.note(o);
  }

  /**
   * A sync finished: everything that arrived before it started is programmed, except the changes
   * of the Services it left to a later run (`leftFor`). `startedAt` is on the tracker's clock (the
   * sync loop's).
   */
  synced(sync: { startedAt: number; leftFor?: readonly string[] }): void {
    if (this.pending.length === 0) return;
    const now = this.opts.clock.now();
    const wall = this.opts.wallNow();
    const started = sync.startedAt;
    const left = new Set(sync.leftFor);
    const still: Pending[] = [];
    for (const p of this.pending) {
      // Arrived after the run took its changes, or its Service was left to a later run.
      if (p.arrived > started || left.has(p.service)) {
        still.push(p);
        continue;
      }
      this.opts.observe({ service: p.service, sinceTriggerSeconds: Math.max(0, wall - p.triggerMs) / 1000, sinceArrivalSeconds: (now - p.arrived) / 1000 });
    }
    this.pending = still;
  }

  private note(slice: V1EndpointSlice): void {
    const text = slice.metadata?.annotations?.[TRIGGER_TIME_ANNOTATION];
    if (typeof text !== 'string') return;
    const key = sliceKey(slice);
    if (this.seen.get(key) === text) return;
    this.seen.set(key, text);
    const triggerMs = Date.parse(text);
    if (Number.isNaN(triggerMs) || triggerMs < this.startedWall) return;
    const service = sliceServiceKey(slice);
    this.pending.push({ service, triggerMs, arrived: this.opts.clock.now() });
    if (this.pending.length > this.maxPending) this.pending.splice(0, this.pending.length - this.maxPending);
  }
}

const sliceKey = objectKey;
