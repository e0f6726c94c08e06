import type { AffinityPolicy, AffinityType, BalancerAlgorithm, Endpoint, PodRef } from '../model.js';
import { DEFAULT_AFFINITY_TIMEOUT_SECONDS } from '../model.js';
import type { Clock, RandomSource } from '../clock.js';
import type { BalancerDeps, BalancerFactory, EndpointLoad, LoadBalancer, SharedBalancing, StickyUpdate } from './load-balancer.js';
import { DEFAULT_OUTLIER_POLICY, freshOutlierState, maxEjected, nextEjectionMs, type OutlierPolicy, type OutlierState } from './outlier.js';
import { hash32, orderRandom, rendezvousPick } from './shared-order.js';

/** One endpoint and what the balancer keeps for it. */
interface Slot extends OutlierState {
  /** What nextEndpoint hands out for it (see handleOf). */
  handle: Endpoint;
  /** Its balancer: a handle is only ever released to the balancer it came from. */
  owner: RoundRobinBalancer;
  /** Handed out and not yet released. */
  active: number;
  /** In the current set; a slot that left stays (unlisted) while it has connections to count. */
  listed: boolean;
}

/**
 * The handed-out endpoint: a copy of the Endpoint's data, its slot in a private field. It reads as
 * the plain data it copies (logs, equality, JSON), and release() finds the slot with one field
 * load instead of a lookup by address, on every connection. (A non-enumerable symbol property did
 * the same at ten times the cost to make: Object.defineProperty takes V8's slow path, 0.5 µs a
 * handle, a tenth of a second at 10,000 service ports of 10 endpoints.)
 */
class Handle {
  declare readonly ip: string;
  declare readonly port: number;
  declare readonly addr: string;
  declare readonly nodeName?: string;
  declare readonly targetPod?: PodRef;
  readonly #slot: Slot;

  constructor(endpoint: Endpoint, slot: Slot) {
    // Every field of an Endpoint goes along (the pod behind it, for port-forward), in its order.
    // Assigned one by one: Object.assign onto a fresh object takes V8's generic path, some
    // 0.3 µs a handle, a share of start-up at 10,000 service ports of 10 endpoints.
    const self = this as { -readonly [K in keyof Endpoint]: Endpoint[K] };
    self.ip = endpoint.ip;
    self.port = endpoint.port;
    self.addr = endpoint.addr;
    if (endpoint.nodeName !== undefined) self.nodeName = endpoint.nodeName;
    if (endpoint.targetPod !== undefined) self.targetPod = endpoint.targetPod;
    this.#slot = slot;
  }

  static slotOf(endpoint: Endpoint): Slot | undefined {
    return #slot in endpoint ? endpoint.#slot : undefined;
  }
}

function handleSlot(endpoint: Endpoint): Slot | undefined {
  return Handle.slotOf(endpoint);
}

function handleOf(endpoint: Endpoint, slot: Slot): Endpoint {
  return new Handle(endpoint, slot);
}

/** One client's sticky choice (upstream affinityState). */
interface StickyEntry {
  slot: Slot;
  /** clock.now() of the last connection that used the entry: the timeout slides from here. */
  lastUsed: number;
  /** When the endpoint was chosen (shared balancing: the newer choice wins between workers). */
  assignedAt: number;
  /** When the siblings last heard of this entry (shared balancing). */
  sharedAt: number;
}

const DEFAULT_TOUCH_SHARE_MS = 1000;

/**
 * Shared empty tables, never written to (stickyTable() and share() make a balancer's own on its
 * first entry): an empty Map or Set is some 150 bytes, times 10,000 service ports.
 */
const NO_STICKY = new Map<string, StickyEntry>();
const NO_CLIENTS = new Set<string>();

/**
 * The balancer of one proxied service port (upstream pkg/proxy/userspace/roundrobin.go, grown):
 * round-robin over a shuffled endpoint list, or least-connections with ties taken round-robin,
 * client-IP affinity on top, and passive health (outlier.ts) setting failing endpoints aside.
 * One class rather than one per algorithm, so that a Service switching algorithm keeps its
 * connection counts and its endpoints' health.
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
 * Connection counts (least-connections) and passive health are per worker.
 *
 * Per pick, without affinity and with nothing set aside: an index step and a counter increment,
 * no clock read, no allocation; per release a property load and a decrement. The endpoints handed
 * out are the balancer's copies of those it was given (equal to them, not the same objects).
 */
export class RoundRobinBalancer implements LoadBalancer {
  private readonly clock: Clock;
  private readonly random: RandomSource;
  private readonly outlier: OutlierPolicy;
  private readonly shared: SharedBalancing | undefined;
  private readonly touchShareMs: number;
  private list: readonly Endpoint[] = [];
  /** Parallel to `list`, whose entries are their handles. */
  private slots: Slot[] = [];
  /** Listed slots, and unlisted ones with connections (an endpoint that returns finds its counts). */
  private readonly byAddr = new Map<string, Slot>();
  private index = 0;
  private algorithm: BalancerAlgorithm = 'round-robin';
  private affinityType: AffinityType = 'None';
  private timeoutMs = DEFAULT_AFFINITY_TIMEOUT_SECONDS * 1000;
  /** Made on the first ClientIP client (NO_STICKY till then: most Services have no affinity). */
  private sticky: Map<string, StickyEntry> = NO_STICKY;
  /** Listed slots set aside now, and the earliest time one of them is due back. */
  private ejected = 0;
  private nextReturn = Infinity;
  /** Listed slots with failures in a row: while 0, a success report looks nothing up. */
  private failing = 0;
  /** Changed sets so far (shared balancing: the start of the round-robin moves with each). */
  private changes = 0;
  /** Slots whose address another pod now has (set by relist, read once by dropStickyNotIn). */
  private renewed: Set<Slot> | undefined;
  /** Client IPs whose entries the siblings have not heard of yet (shared balancing). */
  private unshared: Set<string> = NO_CLIENTS;
  /**
   * A list given while the balancer kept nothing of an earlier one (its first, at start-up), not
   * made into slots yet: that is done when the balancer is first used (a pick, a report, a sticky
   * merge, a look at its endpoints), by settle(); load() reads it as it waits. Every service port
   * gets a list at start-up and most see no connection for a while; their slots and handles were a
   * twentieth of start-up at 10,000 service ports of 10 endpoints.
   */
  private pending: readonly Endpoint[] | undefined;

  constructor(deps: BalancerDeps) {
    this.clock = deps.clock;
    this.random = deps.random;
    this.outlier = deps.outlier ?? DEFAULT_OUTLIER_POLICY;
    this.shared = deps.shared;
    this.touchShareMs = deps.shared?.touchShareMs ?? DEFAULT_TOUCH_SHARE_MS;
  }

  /** A snapshot: a changed set replaces the array, so callers may hold on to it. */
  get endpoints(): readonly Endpoint[] {
    if (this.pending !== undefined) this.settle();
    return this.list;
  }

  get usesClientIP(): boolean {
    return this.affinityType !== 'None';
  }

  setEndpoints(endpoints: readonly Endpoint[]): void {
    // Nothing to carry over (no slot listed, none counting connections): all of it can wait, the
    // list kept as given (the caller's lists are not changed once handed over: a plan's units).
    if (this.byAddr.size === 0 && endpoints.length > 0) {
      this.pending = endpoints;
      return;
    }
    this.pending = undefined;
    const items = uniqueByAddr(endpoints);
    if (sameAddrs(this.list, items)) return;
    this.apply(items);
  }

  /** The pending list made into slots (see `pending`). */
  private settle(): void {
    const items = uniqueByAddr(this.pending as readonly Endpoint[]);
    this.pending = undefined;
    this.apply(items);
  }

  /** A changed set, unique by address: a new list. */
  private apply(items: Endpoint[]): void {
    // A fresh shuffle per change keeps many proxies from all starting on the same endpoint. Workers
    // of one node shuffle a set alike (seeded by the set) and start at their own places in it.
    const shared = this.shared;
    if (shared) items.sort((x, y) => (x.addr < y.addr ? -1 : x.addr > y.addr ? 1 : 0));
    this.relist(shuffle(items, shared ? orderRandom(items, shared.seed) : this.random));
    this.list = this.slots.map((s) => s.handle);
    // Each worker starts at its own place; all of them move on by an offset that changes with every
    // change, or a set that keeps coming back (a pod whose readiness flaps) would start each worker
    // on the same endpoint every time, and low-rate traffic would go to a few endpoints for good.
    this.index = shared && this.list.length > 0 ? (shared.worker + (hash32(String(this.changes++), shared.seed) >>> 0)) % this.list.length : 0;
    this.dropStickyNotIn();
  }

  setAffinity(policy: AffinityPolicy): void {
    if (policy.type === 'None') {
      this.affinityType = 'None';
      if (this.sticky.size > 0) this.sticky.clear();
      if (this.unshared.size > 0) this.unshared.clear();
      return;
    }
    this.affinityType = policy.type;
    // The API server defaults and validates the timeout; 0 is what upstream treated as "unset".
    const seconds = policy.timeoutSeconds > 0 ? policy.timeoutSeconds : DEFAULT_AFFINITY_TIMEOUT_SECONDS;
    this.timeoutMs = seconds * 1000;
  }

  setAlgorithm(algorithm: BalancerAlgorithm): void {
    this.algorithm = algorithm;
  }

  nextEndpoint(clientIP: string, sessionAffinityReset: boolean, avoid?: Endpoint): Endpoint | undefined {
    if (this.pending !== undefined) this.settle();
    if (this.slots.length === 0) return undefined;
    if (this.ejected > 0) this.returnDue();
    // Runs per connection: the None path must stay free of allocation.
    const slot = this.affinityType === 'None' ? this.pick(avoid?.addr) : this.pickSticky(clientIP, sessionAffinityReset, avoid?.addr);
    slot.active++;
    return slot.handle;
  }

  cleanupStaleStickySessions(): void {
    const now = this.clock.now();
    // Deleting the current key while iterating a Map is safe: iteration continues with the next.
    for (const [ip, entry] of this.sticky) {
      if (this.expired(entry, now)) this.sticky.delete(ip);
    }
  }

  release(endpoint: Endpoint): void {
    // (While a list is pending nothing was handed out since the last: nothing to release.)
    const slot = this.slotOf(endpoint);
    if (slot === undefined || slot.active === 0) return;
    slot.active--;
    if (slot.active === 0 && !slot.listed) this.byAddr.delete(slot.handle.addr);
  }

  reportDial(endpoint: Endpoint, ok: boolean): boolean {
    if (this.pending !== undefined) this.settle();
    if (ok) {
      if (this.failing === 0) return false;
      const slot = this.slotOf(endpoint);
      if (slot !== undefined && slot.listed && slot.consecutiveFailures > 0) this.clearFailures(slot);
      return false;
    }
    const policy = this.outlier;
    if (policy.consecutiveFailures <= 0) return false;
    const slot = this.slotOf(endpoint);
    // Dials that were in flight when it was set aside, or when it left, change nothing.
    if (slot === undefined || !slot.listed || slot.ejectedUntil !== 0) return false;
    if (slot.consecutiveFailures++ === 0) this.failing++;
    // Past the share, it stays failing: the next failure tries again, once another is back.
    if (slot.consecutiveFailures < policy.consecutiveFailures || this.ejected >= maxEjected(policy, this.slots.length)) return false;
    const now = this.clock.now();
    const next = nextEjectionMs(policy, slot, now);
    slot.ejections = next.ejections;
    slot.ejectedUntil = now + next.ms;
    this.ejected++;
    this.nextReturn = Math.min(this.nextReturn, slot.ejectedUntil);
    this.clearFailures(slot);
    return true;
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
    if (this.pending !== undefined) this.settle();
    const now = this.clock.now();
    for (const u of updates) {
      // An endpoint this worker does not have (yet, or any more): its own endpoint set decides.
      const slot = this.byAddr.get(u.addr);
      if (slot === undefined || !slot.listed) continue;
      const lastUsed = now - u.idleMs;
      const assignedAt = now - u.assignedAgoMs;
      const entry = this.sticky.get(u.clientIP);
      if (entry === undefined) {
        if (!this.expired({ lastUsed }, now)) this.stickyTable().set(u.clientIP, { slot, lastUsed, assignedAt, sharedAt: now });
        continue;
      }
      if (entry.slot !== slot) {
        // Two workers chose differently (a reset after a failed dial, or an endpoint set that
        // changed between their picks): the later choice wins on both.
        if (assignedAt <= entry.assignedAt) continue;
        entry.slot = slot;
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

  load(): EndpointLoad[] {
    // A first list not used yet: nothing handed out, nothing set aside; read as it waits.
    if (this.pending !== undefined) return uniqueByAddr(this.pending).map((e) => ({ addr: e.addr, active: 0, setAsideMs: 0 }));
    const now = this.ejected > 0 ? this.clock.now() : 0;
    return this.slots.map((s) => ({ addr: s.handle.addr, active: s.active, setAsideMs: s.ejectedUntil > now ? s.ejectedUntil - now : 0 }));
  }

  /**
   * The slot of an endpoint handed out by this balancer, by one property load; any other object
   * of the same address (a caller's own copy) is looked up by address.
   */
  private slotOf(endpoint: Endpoint): Slot | undefined {
    const slot = handleSlot(endpoint);
    return slot !== undefined && slot.owner === this ? slot : this.byAddr.get(endpoint.addr);
  }

  /**
   * A fresh endpoint for a connection: precondition, the list is not empty. `avoid`: the address
   * of an endpoint that just failed, taken only when no other is usable.
   */
  private pick(avoid?: string): Slot {
    // Every endpoint set aside: all are used, no Service is emptied by passive health.
    const all = this.ejected === 0 || this.ejected >= this.slots.length;
    return this.algorithm === 'least-connections' ? this.leastConnections(all, avoid) : this.roundRobin(all, avoid);
  }

  private roundRobin(all: boolean, avoid: string | undefined): Slot {
    const n = this.slots.length;
    let avoided: Slot | undefined;
    for (let k = 0; k < n; k++) {
      const slot = this.slots[this.index] as Slot;
      this.index = this.index + 1 === n ? 0 : this.index + 1;
      if (!all && slot.ejectedUntil !== 0) continue;
      if (avoid !== undefined && slot.handle.addr === avoid) {
        avoided = slot;
        continue;
      }
      return slot;
    }
    return avoided ?? (this.slots[0] as Slot); // slots[0] not reached: some slot is usable when not all are set aside
  }

  /**
   * The usable endpoint with the fewest connections, looking from the round-robin index on, so
   * that ties go round-robin. An endpoint with none ends the look: nothing can beat it.
   */
  private leastConnections(all: boolean, avoid: string | undefined): Slot {
    const n = this.slots.length;
    let best: Slot | undefined;
    let bestAt = 0;
    let avoided: Slot | undefined;
    for (let k = 0, at = this.index; k < n; k++, at = at + 1 === n ? 0 : at + 1) {
      const slot = this.slots[at] as Slot;
      if (!all && slot.ejectedUntil !== 0) continue;
      if (avoid !== undefined && slot.handle.addr === avoid) {
        avoided = slot;
        continue;
      }
      if (best === undefined || slot.active < best.active) {
        best = slot;
        bestAt = at;
        if (slot.active === 0) break;
      }
    }
    if (best === undefined) return avoided ?? (this.slots[0] as Slot);
    this.index = bestAt + 1 === n ? 0 : bestAt + 1;
    return best;
  }

  private pickSticky(clientIP: string, reset: boolean, avoid?: string): Slot {
    const now = this.clock.now();
    const entry = this.sticky.get(clientIP);
    if (entry !== undefined && !reset && !this.expired(entry, now) && this.usable(entry.slot)) {
      entry.lastUsed = now;
      if (this.shared !== undefined && now - entry.sharedAt >= this.touchShareMs) this.share(clientIP, entry, now);
      return entry.slot;
    }
    // A reset (the sticky endpoint failed to dial), an expired entry, or an endpoint set aside:
    // pick afresh and re-stick. Workers pick a new client's endpoint alike (a reset walks on down
    // the client's ranking), unless that one is set aside here.
    const slot = this.freshPick(clientIP, avoid ?? (reset ? entry?.slot.handle.addr : undefined));
    if (entry === undefined) {
      const made = { slot, lastUsed: now, assignedAt: now, sharedAt: now };
      this.stickyTable().set(clientIP, made);
      if (this.shared !== undefined) this.share(clientIP, made, now);
    } else {
      entry.slot = slot;
      entry.lastUsed = now;
      entry.assignedAt = now;
      if (this.shared !== undefined) this.share(clientIP, entry, now);
    }
    return slot;
  }

  private freshPick(clientIP: string, avoid: string | undefined): Slot {
    if (this.shared === undefined) return this.pick(avoid);
    const ranked = this.slotOf(rendezvousPick(clientIP, this.list, this.shared.seed, avoid));
    return ranked !== undefined && this.usable(ranked) ? ranked : this.pick(avoid);
  }

  /** Queue an entry for the siblings; the first one queued tells the worker there is news. */
  private share(clientIP: string, entry: StickyEntry, now: number): void {
    entry.sharedAt = now;
    const wasEmpty = this.unshared.size === 0;
    if (this.unshared === NO_CLIENTS) this.unshared = new Set();
    this.unshared.add(clientIP);
    if (wasEmpty) this.shared?.onStickyChange();
  }

  private stickyTable(): Map<string, StickyEntry> {
    if (this.sticky === NO_STICKY) this.sticky = new Map();
    return this.sticky;
  }

  private usable(slot: Slot): boolean {
    return slot.ejectedUntil === 0 || this.ejected >= this.slots.length;
  }

  /** Takes back the endpoints whose time is up; reads the clock only while some are set aside. */
  private returnDue(): void {
    const now = this.clock.now();
    if (now < this.nextReturn) return;
    this.nextReturn = Infinity;
    for (const slot of this.slots) {
      if (slot.ejectedUntil === 0) continue;
      if (slot.ejectedUntil <= now) {
        slot.ejectedUntil = 0;
        slot.returnedAt = now;
        this.ejected--;
      } else {
        this.nextReturn = Math.min(this.nextReturn, slot.ejectedUntil);
      }
    }
  }

  private clearFailures(slot: Slot): void {
    slot.consecutiveFailures = 0;
    this.failing--;
  }

  private expired(entry: Pick<StickyEntry, 'lastUsed'>, now: number): boolean {
    return now - entry.lastUsed >= this.timeoutMs;
  }

  /**
   * The slots of the new list, in its order: an endpoint that stays keeps its counts and health
   * (with a handle of the new object's data; handles out earlier still find it); one that left
   * keeps counting its connections until they are released, and is forgotten then; its health is
   * forgotten at once. An address now another pod's (a pod IP reused) is a new endpoint: its
   * health and its sticky clients are forgotten too (`renewed`, for dropStickyNotIn).
   */
  private relist(endpoints: readonly Endpoint[]): void {
    // A first list (every port's at start-up) has no slot to unlist.
    if (this.byAddr.size > 0) {
      const current = new Set(endpoints.map((e) => e.addr));
      for (const [addr, slot] of this.byAddr) {
        if (current.has(addr)) continue;
        slot.listed = false;
        Object.assign(slot, freshOutlierState());
        if (slot.active === 0) this.byAddr.delete(addr);
      }
    }
    this.slots = endpoints.map((endpoint) => {
      let slot = this.byAddr.get(endpoint.addr);
      if (slot === undefined) {
        // Spelled out rather than spread from freshOutlierState(): one shape, made at once.
        slot = { handle: endpoint, owner: this, active: 0, listed: true, consecutiveFailures: 0, ejectedUntil: 0, ejections: 0, returnedAt: -Infinity };
        this.byAddr.set(endpoint.addr, slot);
      } else if (slot.handle.targetPod?.name !== endpoint.targetPod?.name || slot.handle.targetPod?.namespace !== endpoint.targetPod?.namespace) {
        Object.assign(slot, freshOutlierState());
        (this.renewed ??= new Set()).add(slot);
      }
      slot.handle = handleOf(endpoint, slot);
      slot.listed = true;
      return slot;
    });
    this.ejected = 0;
    this.failing = 0;
    this.nextReturn = Infinity;
    for (const slot of this.slots) {
      if (slot.consecutiveFailures > 0) this.failing++;
      if (slot.ejectedUntil !== 0) {
        this.ejected++;
        this.nextReturn = Math.min(this.nextReturn, slot.ejectedUntil);
      }
    }
  }

  /** Clients whose endpoint left must re-balance; the rest keep their slot (and its new handle). */
  private dropStickyNotIn(): void {
    const renewed = this.renewed;
    this.renewed = undefined;
    for (const [ip, entry] of this.sticky) {
      if (!entry.slot.listed || renewed?.has(entry.slot) === true) this.sticky.delete(ip);
    }
  }
}

export const roundRobinFactory: BalancerFactory = (deps) => new RoundRobinBalancer(deps);

function toUpdate(clientIP: string, entry: StickyEntry, now: number): StickyUpdate {
  return { clientIP, addr: entry.slot.handle.addr, idleMs: now - entry.lastUsed, assignedAgoMs: now - entry.assignedAt };
}

/**
 * The endpoints without repeated addrs, first occurrence wins, in a new array (shuffled in place
 * later): a duplicate must not double an endpoint's share. A few endpoints are compared pairwise,
 * which allocates no table (every port's list passes here at start-up).
 */
function uniqueByAddr(endpoints: readonly Endpoint[]): Endpoint[] {
  const out: Endpoint[] = [];
  if (endpoints.length > 16) {
    const seen = new Set<string>();
    for (const ep of endpoints) {
      if (seen.has(ep.addr)) continue;
      seen.add(ep.addr);
      out.push(ep);
    }
    return out;
  }
  next: for (const ep of endpoints) {
    for (const kept of out) if (kept.addr === ep.addr) continue next;
    out.push(ep);
  }
  return out;
}

/**
 * The same addresses, each still in front of the same pod (a reused pod IP must reach the new pod).
 * Precondition: neither list holds a repeated addr (setEndpoints stores them deduplicated).
 */
function sameAddrs(list: readonly Endpoint[], next: readonly Endpoint[]): boolean {
  if (list.length !== next.length) return false;
  if (list.length === 0) return true;
  const byAddr = new Map(next.map((ep) => [ep.addr, ep]));
  return list.every((ep) => {
    const other = byAddr.get(ep.addr);
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
