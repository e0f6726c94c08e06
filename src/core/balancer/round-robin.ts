import type { AffinityPolicy, AffinityType, Endpoint } from '../model.js';
import { DEFAULT_AFFINITY_TIMEOUT_SECONDS } from '../model.js';
import type { Clock, RandomSource } from '../clock.js';
import type { BalancerDeps, BalancerFactory, LoadBalancer, SharedBalancing, StickyUpdate } from './load-balancer.js';
import { orderRandom, rendezvousPick } from './shared-order.js';

/** One client's sticky choice (upstream affinityState). */
interface StickyEntry {
  endpoint: Endpoint;
  /** clock.now() of the last connection that used the entry: the timeout slides from here. */
  lastUsed: number;
  /** When the endpoint was chosen (shared balancing: the newer choice wins between workers). */
  assignedAt: number;
  /** When the siblings last heard of this entry (shared balancing). */
  sharedAt: number;
}

const DEFAULT_TOUCH_SHARE_MS = 1000;

/**
 * Round-robin over a shuffled endpoint list, with optional client-IP affinity
 * (upstream pkg/proxy/userspace/roundrobin.go). One instance per proxied service port.
 *
 * Affinity policy and endpoints are independent fields, so the Service and its slices may arrive in
 * either order without one resetting the other (upstream re-created a default TTL when endpoints
 * came first).
 *
 * With `shared` (several workers, one balancer each) the balancers agree without talking per
 * connection: every worker shuffles a given endpoint set into the same order and starts its
 * round-robin `worker` places in, so the first connections of N workers go to N different
 * endpoints (when there are that many); a new ClientIP client's endpoint is its rendezvous pick,
 * which every worker computes alike; and entries made, moved or in use are handed out
 * (takeStickyUpdates) for the siblings to merge, so a client keeps its endpoint across workers even
 * when the endpoint set changed after its first pick, and expires on the node's last use of it.
 */
export class RoundRobinBalancer implements LoadBalancer {
  private readonly clock: Clock;
  private readonly random: RandomSource;
  private readonly shared: SharedBalancing | undefined;
  private readonly touchShareMs: number;
  private list: readonly Endpoint[] = [];
  private index = 0;
  private affinityType: AffinityType = 'None';
  private timeoutMs = DEFAULT_AFFINITY_TIMEOUT_SECONDS * 1000;
  private readonly sticky = new Map<string, StickyEntry>();
  /** Client IPs whose entries the siblings have not heard of yet (shared balancing). */
  private readonly unshared = new Set<string>();

  constructor(deps: BalancerDeps) {
    this.clock = deps.clock;
    this.random = deps.random;
    this.shared = deps.shared;
    this.touchShareMs = deps.shared?.touchShareMs ?? DEFAULT_TOUCH_SHARE_MS;
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
    // A fresh shuffle per change keeps many proxies from all starting on the same endpoint. Workers
    // of one node shuffle a set alike (seeded by the set) and start at their own places in it.
    const shared = this.shared;
    const items = [...byAddr.values()];
    if (shared) items.sort((x, y) => (x.addr < y.addr ? -1 : x.addr > y.addr ? 1 : 0));
    this.list = shuffle(items, shared ? orderRandom(items, shared.seed) : this.random);
    this.index = shared && this.list.length > 0 ? shared.worker % this.list.length : 0;
    this.dropStickyNotIn(byAddr);
  }

  setAffinity(policy: AffinityPolicy): void {
    if (policy.type === 'None') {
      this.affinityType = 'None';
      this.sticky.clear();
      this.unshared.clear();
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

  takeStickyUpdates(): StickyUpdate[] {
    if (this.unshared.size === 0) return [];
    const now = this.clock.now();
    const out: StickyUpdate[] = [];
    for (const ip of this.unshared) {
      const entry = this.sticky.get(ip);
      if (entry === undefined) continue;
      entry.sharedAt = now;
      out.push(toUpdate(ip, entry, now));
    }
    this.unshared.clear();
    return out;
  }

  mergeSticky(updates: readonly StickyUpdate[]): void {
    if (this.affinityType === 'None' || updates.length === 0) return;
    const now = this.clock.now();
    for (const u of updates) {
      // An endpoint this worker does not have (yet, or any more): its own endpoint set decides.
      const ep = this.list.find((e) => e.addr === u.addr);
      if (ep === undefined) continue;
      const lastUsed = now - u.idleMs;
      const assignedAt = now - u.assignedAgoMs;
      const entry = this.sticky.get(u.clientIP);
      if (entry === undefined) {
        if (!this.expired({ lastUsed }, now)) this.sticky.set(u.clientIP, { endpoint: ep, lastUsed, assignedAt, sharedAt: now });
        continue;
      }
      if (entry.endpoint.addr !== ep.addr) {
        // Two workers chose differently (a reset after a failed dial, or an endpoint set that
        // changed between their picks): the later choice wins on both.
        if (assignedAt <= entry.assignedAt) continue;
        entry.endpoint = ep;
        entry.assignedAt = assignedAt;
      }
      if (lastUsed > entry.lastUsed) entry.lastUsed = lastUsed;
    }
  }

  stickyEntries(): StickyUpdate[] {
    const now = this.clock.now();
    const out: StickyUpdate[] = [];
    for (const [ip, entry] of this.sticky) if (!this.expired(entry, now)) out.push(toUpdate(ip, entry, now));
    return out;
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
      if (this.shared !== undefined && now - entry.sharedAt >= this.touchShareMs) this.share(clientIP, entry, now);
      return entry.endpoint;
    }
    // A reset (the sticky endpoint failed to dial) or an expired entry: pick afresh and re-stick.
    // Workers pick a new client's endpoint alike; a reset walks on down the client's ranking.
    const ep = this.shared === undefined ? this.advance() : rendezvousPick(clientIP, this.list, this.shared.seed, reset ? entry?.endpoint.addr : undefined);
    if (entry === undefined) {
      const made = { endpoint: ep, lastUsed: now, assignedAt: now, sharedAt: now };
      this.sticky.set(clientIP, made);
      if (this.shared !== undefined) this.share(clientIP, made, now);
    } else {
      entry.endpoint = ep;
      entry.lastUsed = now;
      entry.assignedAt = now;
      if (this.shared !== undefined) this.share(clientIP, entry, now);
    }
    return ep;
  }

  /** Queue an entry for the siblings; the first one queued tells the worker there is news. */
  private share(clientIP: string, entry: StickyEntry, now: number): void {
    entry.sharedAt = now;
    const wasEmpty = this.unshared.size === 0;
    this.unshared.add(clientIP);
    if (wasEmpty) this.shared?.onStickyChange();
  }

  private expired(entry: Pick<StickyEntry, 'lastUsed'>, now: number): boolean {
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

function toUpdate(clientIP: string, entry: StickyEntry, now: number): StickyUpdate {
  return { clientIP, addr: entry.endpoint.addr, idleMs: now - entry.lastUsed, assignedAgoMs: now - entry.assignedAt };
}

/** Endpoints keyed by addr, first occurrence wins: a duplicate must not double an endpoint's share. */
function uniqueByAddr(endpoints: readonly Endpoint[]): Map<string, Endpoint> {
  const byAddr = new Map<string, Endpoint>();
  for (const ep of endpoints) {
    if (!byAddr.has(ep.addr)) byAddr.set(ep.addr, ep);
  }
  return byAddr;
}

/** Precondition: `list` holds no duplicate addrs (setEndpoints stores it deduplicated). */
function sameAddrs(list: readonly Endpoint[], next: ReadonlyMap<string, Endpoint>): boolean {
  if (list.length !== next.size) return false;
  return list.every((ep) => next.has(ep.addr));
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
