import type { AffinityPolicy, BalancerAlgorithm, Endpoint } from '../model.js';
import type { Clock, RandomSource } from '../clock.js';
import type { OutlierPolicy } from './outlier.js';

/** One endpoint as /services shows it. */
export interface EndpointLoad {
  addr: string;
  /** Connections (TCP) or sessions (UDP) handed this endpoint and not yet released. */
  active: number;
  /** Set aside by passive health for this many more milliseconds; 0 when in use. */
  setAsideMs: number;
}

/**
 * The balancer seam (upstream pkg/proxy/userspace/loadbalancer.go). One instance serves one
 * proxied service port: round-robin or least-connections among the usable endpoints, client-IP
 * affinity on top, and passive health deciding which endpoints are usable.
 *
 * The promise callers keep: every endpoint nextEndpoint hands out is handed back by release
 * exactly once, so per-endpoint connection counts stay exact.
 */
export interface LoadBalancer {
  /** The current endpoint set, in the order the balancer hands them out. */
  readonly endpoints: readonly Endpoint[];
  /**
   * Whether a pick depends on the client's IP (ClientIP affinity). When false, a caller may pass ''
   * and spare finding the address out (for TCP a getpeername() per connection).
   */
  readonly usesClientIP: boolean;
  /**
   * Replace the endpoint set. When the set (compared by `addr`, ignoring order) is unchanged nothing
   * moves; when it changed the list is reshuffled and the index reset, and affinity entries whose
   * endpoint left are dropped.
   */
  setEndpoints(endpoints: readonly Endpoint[]): void;
  /** Apply the Service's affinity policy; the new timeout applies to existing entries too. */
  setAffinity(policy: AffinityPolicy): void;
  /** Round-robin or least-connections from the next pick on; connection counts carry over. */
  setAlgorithm(algorithm: BalancerAlgorithm): void;
  /**
   * The endpoint for a new connection from `clientIP`, or undefined when there is none.
   * `sessionAffinityReset` is true on a retry after a failed dial: the client's sticky entry is
   * dropped and a fresh endpoint picked; `avoid`, the endpoint that failed, is not picked again
   * while another is usable (least-connections would take it back first: it holds nothing).
   */
  nextEndpoint(clientIP: string, sessionAffinityReset: boolean, avoid?: Endpoint): Endpoint | undefined;
  /** Drop expired affinity entries. Called from one coarse sweep, never per client. */
  cleanupStaleStickySessions(): void;
  /** A connection to `endpoint` ended (or its dial failed): its count goes down. */
  release(endpoint: Endpoint): void;
  /**
   * What a connection learnt of `endpoint`: `ok` once it answered (a first byte, or an orderly
   * close), not ok when the dial was refused, timed out or reset before any byte. Feeds passive
   * health; returns true when this report set the endpoint aside (the caller counts ejections).
   * A failure that is the proxy's own (out of descriptors) is not reported.
   */
  reportDial(endpoint: Endpoint, ok: boolean): boolean;
  /**
   * Per endpoint, in list order: connection counts and what is set aside (/services). Reading it
   * does not make a first list, not used yet, into the balancer's own (its given order then).
   */
  load(): EndpointLoad[];
  /**
   * Sticky entries made, moved or still in use since the last call, for the sibling workers
   * (only with `BalancerDeps.shared`; empty otherwise).
   */
  takeStickyUpdates?(): StickyUpdate[];
  /** Entries a sibling worker made or used: adopted unless this balancer holds a newer choice. */
  mergeSticky?(updates: readonly StickyUpdate[]): void;
  /** Every live sticky entry: what a new sibling worker starts from. */
  stickyEntries?(): StickyUpdate[];
}

/**
 * One client's sticky entry as it travels between workers. Times are ages, not instants: each
 * process has its own monotonic clock.
 */
export interface StickyUpdate {
  clientIP: string;
  /** The endpoint's `addr`. */
  addr: string;
  /** Since the entry was last used. */
  idleMs: number;
  /** Since the endpoint was chosen for this client: the newer choice wins between workers. */
  assignedAgoMs: number;
}

/**
 * Set when several worker processes serve one service port, each with a balancer of its own
 * (`--workers`): what they must agree on without a round trip per connection.
 */
export interface SharedBalancing {
  /** The node's seed: the same in every worker of one run. */
  seed: number;
  /** This worker's index: its round-robin starts this many places into the shared order. */
  worker: number;
  /** Sticky entries changed that the siblings should hear of: takeStickyUpdates() has them. */
  onStickyChange(): void;
  /** An entry in use is told to the siblings at most this often (default 1000 ms). */
  touchShareMs?: number;
}

export interface BalancerDeps {
  clock: Clock;
  random: RandomSource;
  shared?: SharedBalancing;
  /** Passive health; default DEFAULT_OUTLIER_POLICY. */
  outlier?: OutlierPolicy;
}

export type BalancerFactory = (deps: BalancerDeps) => LoadBalancer;
