import type { AffinityPolicy, AffinityType, Endpoint } from '../model.js';
import { DEFAULT_AFFINITY_TIMEOUT_SECONDS } from '../model.js';
import type { Clock, RandomSource } from '../clock.js';
import type { BalancerDeps, BalancerFactory, LoadBalancer } from './load-balancer.js';

/** One client's sticky choice (upstream affinityState). */
interface StickyEntry {
  endpoint: Endpoint;
  /** clock.now() of the last connection that used the entry: the timeout slides from here. */
  lastUsed: number;
}

/**
 * Round-robin over a shuffled endpoint list, with optional client-IP affinity
 * (upstream pkg/proxy/userspace/roundrobin.go). One instance per proxied service port.
 *
 * Affinity policy and endpoints are independent fields, so the Service and its slices may arrive in
 * either order without one resetting the other (upstream re-created a default TTL when endpoints
 * came first).
 */
export class RoundRobinBalancer implements LoadBalancer {
  private readonly clock: Clock;
  private readonly random: RandomSource;
  private list: readonly Endpoint[] = [];
  private index = 0;
  private affinityType: AffinityType = 'None';
  private timeoutMs = DEFAULT_AFFINITY_TIMEOUT_SECONDS * 1000;
  private readonly sticky = new Map<string, StickyEntry>();

  constructor(deps: BalancerDeps) {
    this.clock = deps.clock;
    this.random = deps.random;
  }

  /** A snapshot: a changed set replaces the array, so callers may hold on to it. */
  get endpoints(): readonly Endpoint[] {
    return this.list;
  }

  get usesClientIP(): boolean {
    return this.affinityType !== 'None';
  }

  setEndpoints(endpoints: readonly Endpoint[]): void {
    const byAddr = uniqueByAddr(endpoints);
    if (sameAddrs(this.list, byAddr)) return;
    // A fresh shuffle per change keeps many proxies from all starting on the same endpoint.
    this.list = shuffle([...byAddr.values()], this.random);
    this.index = 0;
    this.dropStickyNotIn(byAddr);
  }

  setAffinity(policy: AffinityPolicy): void {
    if (policy.type === 'None') {
      this.affinityType = 'None';
      this.sticky.clear();
      return;
    }
    this.affinityType = policy.type;
    // The API server defaults and validates the timeout; 0 is what upstream treated as "unset".
    const seconds = policy.timeoutSeconds > 0 ? policy.timeoutSeconds : DEFAULT_AFFINITY_TIMEOUT_SECONDS;
    this.timeoutMs = seconds * 1000;
  }

  nextEndpoint(clientIP: string, sessionAffinityReset: boolean): Endpoint | undefined {
    if (this.list.length === 0) return undefined;
    // Runs per connection: the None path must stay free of allocation.
    if (this.affinityType === 'None') return this.advance();
    return this.nextSticky(clientIP, sessionAffinityReset);
  }

  cleanupStaleStickySessions(): void {
    const now = this.clock.now();
    // Deleting the current key while iterating a Map is safe: iteration continues with the next.
    for (const [ip, entry] of this.sticky) {
      if (this.expired(entry, now)) this.sticky.delete(ip);
    }
  }

  release(_endpoint: Endpoint): void {
    // Round-robin keeps no per-endpoint load; the seam exists for least-connections.
  }

  private advance(): Endpoint {
    const ep = this.list[this.index] as Endpoint; // precondition: list is not empty
    this.index = (this.index + 1) % this.list.length;
    return ep;
  }

  private nextSticky(clientIP: string, reset: boolean): Endpoint {
    const now = this.clock.now();
    const entry = this.sticky.get(clientIP);
    if (entry !== undefined && !reset && !this.expired(entry, now)) {
      entry.lastUsed = now;
      return entry.endpoint;
    }
    // A reset (the sticky endpoint failed to dial) or an expired entry: pick afresh and re-stick.
    const ep = this.advance();
    if (entry === undefined) {
      this.sticky.set(clientIP, { endpoint: ep, lastUsed: now });
    } else {
      entry.endpoint = ep;
      entry.lastUsed = now;
    }
    return ep;
  }

  private expired(entry: StickyEntry, now: number): boolean {
    return now - entry.lastUsed >= this.timeoutMs;
  }

  /** Clients whose endpoint left must re-balance; the rest follow their endpoint's new object. */
  private dropStickyNotIn(current: ReadonlyMap<string, Endpoint>): void {
    for (const [ip, entry] of this.sticky) {
      const ep = current.get(entry.endpoint.addr);
      if (ep === undefined) this.sticky.delete(ip);
      else entry.endpoint = ep;
    }
  }
}

export const roundRobinFactory: BalancerFactory = (deps) => new RoundRobinBalancer(deps);

/** Endpoints keyed by addr, first occurrence wins: a duplicate must not double an endpoint's share. */
function uniqueByAddr(endpoints: readonly Endpoint[]): Map<string, Endpoint> {
  const byAddr = new Map<string, Endpoint>();
  for (const ep of endpoints) {
    if (!byAddr.has(ep.addr)) byAddr.set(ep.addr, ep);
  }
  return byAddr;
}

/** Precondition: `list` holds no duplicate addrs (setEndpoints stores it deduplicated). */
/** The same addresses, each still in front of the same pod (a reused pod IP must reach the new pod). */
function sameAddrs(list: readonly Endpoint[], next: ReadonlyMap<string, Endpoint>): boolean {
  if (list.length !== next.size) return false;
  return list.every((ep) => {
    const other = next.get(ep.addr);
    return other !== undefined && ep.targetPod?.name === other.targetPod?.name && ep.targetPod?.namespace === other.targetPod?.namespace;
  });
}

/** Fisher-Yates in place with the injected source; returns `items`. */
function shuffle<T>(items: T[], random: RandomSource): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    // min() guards a source that returns exactly 1.
    const j = Math.min(i, Math.floor(random() * (i + 1)));
    const tmp = items[i] as T;
    items[i] = items[j] as T;
    items[j] = tmp;
  }
  return items;
}
