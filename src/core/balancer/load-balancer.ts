import type { AffinityPolicy, Endpoint } from '../model.js';
import type { Clock, RandomSource } from '../clock.js';

/**
 * The balancer seam (upstream pkg/proxy/userspace/loadbalancer.go). One instance serves one
 * proxied service port; round-robin with client-IP affinity is the default, least-connections
 * is expected to come later behind the same interface.
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
  /**
   * The endpoint for a new connection from `clientIP`, or undefined when there is none.
   * `sessionAffinityReset` is true on a retry after a failed dial: the client's sticky entry is
   * dropped and a fresh endpoint picked.
   */
  nextEndpoint(clientIP: string, sessionAffinityReset: boolean): Endpoint | undefined;
  /** Drop expired affinity entries. Called from one coarse sweep, never per client. */
  cleanupStaleStickySessions(): void;
  /** A connection to `endpoint` ended: a seam for least-connections; round-robin ignores it. */
  release(endpoint: Endpoint): void;
}

export interface BalancerDeps {
  clock: Clock;
  random: RandomSource;
}

export type BalancerFactory = (deps: BalancerDeps) => LoadBalancer;
