import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { NodeInfo } from '../core/model.js';
import type { NoLocalCounts, ServiceHealth } from '../core/plan.js';

/**
 * What the sync loop publishes (STYLE habit 16): one typed event per change that reaches it and
 * one per sync. Health, metrics, the health-check node ports and the open-file check subscribe;
 * nothing reaches into the loop.
 */

/** One call a source made on the sink, as data. */
export type StateChange =
  | { kind: 'upsertService'; object: V1Service }
  | { kind: 'deleteService'; namespace: string; name: string }
  | { kind: 'replaceServices'; objects: readonly V1Service[] }
  | { kind: 'upsertEndpointSlice'; object: V1EndpointSlice }
  | { kind: 'deleteEndpointSlice'; namespace: string; name: string }
  | { kind: 'replaceEndpointSlices'; objects: readonly V1EndpointSlice[] }
  | { kind: 'setNode'; node: NodeInfo };

export interface ChangeEvent {
  change: StateChange;
  /**
   * Objects whose stored version this change altered: 0 when it brought nothing new (a re-list,
   * a resync, an invalid object whose last good version stays). A sync is queued only when > 0.
   */
  changed: number;
  /** A sync has run before this change (kube-proxy's "initialized"): a sync is now due for it. */
  initialized: boolean;
}

export interface SyncSummary {
  /** Services and units running after the sync. */
  services: number;
  units: number;
  opened: number;
  closed: number;
  recreated: number;
  updated: number;
  /** Listeners that could not be bound (each is retried at the next sync). */
  listenErrors: number;
  /** Portals that could not be programmed. */
  portalErrors: number;
  durationMs: number;
}

export interface SyncEvent {
  summary: SyncSummary;
  /** The periodic resync (`--iptables-sync-period`), not one asked for by a change. */
  periodic: boolean;
  /** The first sync since start. */
  first: boolean;
  /**
   * Every change queued before it is applied now, portal included: nothing is left for a later sync.
   * A fast-lane run that handed Services back to the runner, or one that ran while the portal still
   * needs programming after a failure, is not complete. Health counts only complete syncs as updates.
   */
  complete: boolean;
  /** Services (`ns/name`) whose changes this run left to a later one (handed back to the runner, or not planned). */
  leftFor?: readonly string[];
  /** When it started and finished, on the loop's clock (monotonic milliseconds). */
  startedAt: number;
  finishedAt: number;
  /** Services with a healthCheckNodePort, with their local endpoints, as of this sync. */
  serviceHealth: readonly ServiceHealth[];
  noLocalEndpoints: NoLocalCounts;
  /** Sockets listening now (portal addresses and proxy ports): descriptors held for good. */
  listeners: number;
  /** Listeners wanted but not bound (address in use, privilege, out of descriptors, ...). */
  listenersFailed: number;
}

/** Where to subscribe; each returns the function that unsubscribes. */
export interface ProxierEvents {
  onChange(listener: (e: ChangeEvent) => void): () => void;
  onSync(listener: (e: SyncEvent) => void): () => void;
}
