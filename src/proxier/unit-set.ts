import type { LoadBalancer, BalancerFactory, BalancerDeps, EndpointLoad } from '../core/balancer/load-balancer.js';
import type { Clock, RandomSource } from '../core/clock.js';
import { cidrsOfFamily, hostPort, ipFamily } from '../core/address.js';
import { formatDuration } from '../core/duration.js';
import { ProxyError, errnoCode } from '../core/errors.js';
import type { Endpoint } from '../core/model.js';
import type { PortAllocator } from '../core/port-allocator.js';
import { ServicePortStats } from '../core/stats.js';
import type { ProxyUnit } from '../core/units.js';
import type { Logger } from '../seams/logger.js';
import type { AffinityShare, UnitStickyUpdates } from '../seams/affinity-share.js';
import type { ListenSpec, RunningUnitView } from '../seams/portal.js';
import type { BoundAddress, ProxySocket } from '../seams/proxy-socket.js';
import type { TcpHandOff, TcpHandOffs } from '../seams/tcp-hand-off.js';
import type { UnitBatch, UnitBatchResult, UnitOpen, UnitProxyPort, ShutdownOptions, UnitSet, UnitStats, UnitStatus } from '../seams/unit-set.js';
import { realTimers, type RunnerTimers } from './runner.js';

/** Builds the sockets of one unit; the composition root wires TCP and UDP proxy sockets here. */
export type ProxySocketFactory = (unit: ProxyUnit, balancer: LoadBalancer, stats: ServicePortStats) => ProxySocket;

export interface LocalUnitSetOptions {
  logger: Logger;
  balancerFactory: BalancerFactory;
  socketFactory: ProxySocketFactory;
  portAllocator: PortAllocator;
  clock: Clock;
  random: RandomSource;
  /** Where proxy ports are bound when the portal asks for one with no host (`--bind-address`). */
  bindAddress: string;
  /** How often the one coarse sweep runs (UDP idle sessions, expired affinity). */
  sweepIntervalMs: number;
  /** The sweep's and the shutdown grace period's timers (default: the real ones, unref'd). */
  timers?: RunnerTimers;
  /**
   * Listening sockets this process may hold (core/descriptor-budget.ts): past it a unit's listener
   * is not bound, one clear error for that unit, rather than taking the descriptors every
   * connection and the proxy's own work need. Default: no bound.
   */
  maxListeners?: number;
  /**
   * Set in a worker process (`--workers`): its siblings serve the same units, and its balancers
   * agree with theirs (core/balancer/round-robin.ts). `onStickyChange`: takeStickyUpdates() has news.
   */
  shared?: { seed: number; worker: number; onStickyChange(): void };
}

/** One listener a unit wants, and what became of it. */
interface ListenerState {
  spec: ListenSpec;
  bound?: BoundAddress;
  error?: string;
}

interface RunningUnit {
  unit: ProxyUnit;
  preferredProxyPort?: number;
  /** The proxy port another worker bound, which this one must bind too (0: none yet). */
  fixedProxyPort?: number;
  balancer: LoadBalancer;
  stats: ServicePortStats;
  socket: ProxySocket;
  listeners: ListenerState[];
  proxyPort?: number;
}

/**
 * The unit set of this process: real sockets for every unit (upstream's proxier kept them in its
 * serviceMap). A listener that cannot bind is one clear error for its unit, retried at every
 * apply; the unit's other listeners serve meanwhile. Closed units' sockets stop accepting at once,
 * and their connections run on until they end ("retired").
 */
export class LocalUnitSet implements UnitSet, AffinityShare, TcpHandOffs {
  private readonly log: Logger;
  private readonly units = new Map<string, RunningUnit>();
  /** Sockets closed by an apply whose connections still run: tracked for shutdown. */
  private readonly retired = new Set<ProxySocket>();
  private stopping = false;
  private sweepTimer: unknown;
  /** The UDP units: their idle sessions are swept at every tick, the rest about once a second. */
  private readonly udpUnits = new Set<RunningUnit>();
  private lastSweepAffinity = 0;
  /** Listeners bound and listeners failing now, over every running unit (kept, not counted). */
  private bound = 0;
  private failing = 0;
  /**
   * The error of a listener refused past the descriptor budget, made once per limit: only its
   * code and message are read, and far past the limit every further unit of a sync is refused,
   * where an Error's stack capture cost some 5 µs each (125 ms of a CPU profile for the 24,000
   * refused of a 30,000-Service start under a 12,000 open-file limit, thirteenth session).
   */
  private refused: { max: number; err: NodeJS.ErrnoException } | undefined;
  /** Proxy ports bound during the apply under way: its result tells the other workers. */
  private boundProxyPorts: UnitProxyPort[] = [];
  /** Proxy ports the apply under way freed, quarantined until the next. */
  private heldProxyPorts = 0;
  /** Units whose balancers have sticky entries to share (shared balancing). */
  private readonly stickyNews = new Set<string>();

  private readonly timers: RunnerTimers;

  constructor(private readonly opts: LocalUnitSetOptions) {
    this.log = opts.logger.child({ component: 'unit-set' });
    this.timers = opts.timers ?? realTimers;
  }

  async apply(batch: UnitBatch): Promise<UnitBatchResult> {
    // The portal has been synced after the batch before (the loop syncs it after every batch that
    // closes a unit): the ports that batch freed point nowhere now.
    this.opts.portAllocator.releaseQuarantined();
    // Each unit's preferred port is kept for it before any unit allocates one.
    for (const o of [...batch.recreate, ...batch.open]) if (o.preferredProxyPort !== undefined) this.opts.portAllocator.reserve(o.preferredProxyPort);
    this.boundProxyPorts = [];
    this.heldProxyPorts = 0;
    let listenErrors = 0;
    const failedListeners = (id: string): number => this.units.get(id)?.listeners.filter((l) => l.error).length ?? 0;
    for (const id of batch.close) this.closeUnit(id);
    for (const o of batch.recreate) {
      // New sockets, the same balancer: sticky clients keep their endpoints, and connections still
      // running on the retired socket keep counting where the new ones are picked (least-connections),
      // as upstream's userspace proxy kept a service port's balancer state across its changes.
      const balancer = this.units.get(o.unit.id)?.balancer;
      this.closeUnit(o.unit.id);
      await this.openUnit(o, balancer);
      listenErrors += failedListeners(o.unit.id);
    }
    for (const o of batch.open) {
      await this.openUnit(o);
      listenErrors += failedListeners(o.unit.id);
    }
    for (const u of batch.update) this.updateUnit(u);
    for (const { id, port } of batch.proxyPorts ?? []) {
      const ru = this.units.get(id);
      if (ru === undefined || ru.proxyPort !== undefined) continue;
      // 0: no worker has one; this one chooses (at the retry below).
      if (port === 0) delete ru.fixedProxyPort;
      else ru.fixedProxyPort = port;
    }
    const retried = batch.retryFailedListeners === false ? { failed: 0, bound: 0 } : await this.retryListeners(batch);
    const result: UnitBatchResult = { listenErrors: listenErrors + retried.failed, rebound: retried.bound };
    if (this.boundProxyPorts.length > 0) result.proxyPorts = this.boundProxyPorts;
    if (this.heldProxyPorts > 0) result.proxyPortsHeld = this.heldProxyPorts;
    this.boundProxyPorts = [];
    return result;
  }

  views(): RunningUnitView[] {
    return [...this.units.values()].map((ru) => (ru.proxyPort === undefined ? { unit: ru.unit } : { unit: ru.unit, proxyPort: ru.proxyPort }));
  }

  status(): UnitStatus[] {
    const out: UnitStatus[] = [];
    for (const ru of this.units.values()) out.push(unitStatus(ru));
    return out.sort((a, b) => a.name.localeCompare(b.name));
  }

  stats(): UnitStats[] {
    return [...this.units.values()].map((ru) => ({ unit: ru.unit, stats: ru.stats, active: ru.socket.active() }));
  }

  async refresh(): Promise<void> {
    // status() and activeConnections() read this process's sockets: always up to date.
  }

  takeStickyUpdates(): UnitStickyUpdates[] {
    const out: UnitStickyUpdates[] = [];
    for (const id of this.stickyNews) {
      const updates = this.units.get(id)?.balancer.takeStickyUpdates?.() ?? [];
      if (updates.length > 0) out.push({ unit: id, updates });
    }
    this.stickyNews.clear();
    return out;
  }

  mergeSticky(batches: readonly UnitStickyUpdates[]): void {
    for (const { unit, updates } of batches) this.units.get(unit)?.balancer.mergeSticky?.(updates);
  }

  stickyEntries(): UnitStickyUpdates[] {
    const out: UnitStickyUpdates[] = [];
    for (const ru of this.units.values()) {
      const updates = ru.balancer.stickyEntries?.() ?? [];
      if (updates.length > 0) out.push({ unit: ru.unit.id, updates });
    }
    return out;
  }

  /**
   * TcpHandOffs: the running unit's TCP proxy socket, whether or not its listeners are bound (a
   * unit whose every listener failed runs on, its errors in /services, and is served this way).
   */
  tcpHandOff(id: string): TcpHandOff | undefined {
    if (this.stopping) return undefined;
    const socket = this.units.get(id)?.socket;
    return socket !== undefined && socket.protocol === 'TCP' && isHandOff(socket) ? socket : undefined;
  }

  endpoints(id: string): readonly Endpoint[] | undefined {
    return this.units.get(id)?.balancer.endpoints;
  }

  listenerCount(): number {
    return this.bound;
  }

  failedListenerCount(): number {
    return this.failing;
  }

  activeConnections(): number {
    let n = 0;
    for (const ru of this.units.values()) n += ru.socket.active();
    for (const s of this.retired) n += s.active();
    return n;
  }

  start(): void {
    if (this.sweepTimer !== undefined || this.stopping) return;
    // Re-armed first: a sweep that throws does not end the sweeping.
    const tick = (): void => {
      this.sweepTimer = this.timers.setTimeout(tick, this.opts.sweepIntervalMs);
      this.sweep();
    };
    this.sweepTimer = this.timers.setTimeout(tick, this.opts.sweepIntervalMs);
  }

  async shutdown(graceMs: number, opts?: ShutdownOptions): Promise<{ cut: number }> {
    this.stopping = true;
    // Handed over, UDP sessions live on until they idle out: the sweep goes on until the end.
    const handOver = opts?.handOver === true;
    if (!handOver && this.sweepTimer !== undefined) this.timers.clearTimeout(this.sweepTimer);
    const sockets = [...[...this.units.values()].map((u) => u.socket), ...this.retired];
    await Promise.allSettled(sockets.map((s) => s.close(handOver ? { handOver } : undefined)));
    const drained = Promise.allSettled(sockets.map((s) => s.drained()));
    let timer: unknown;
    const graceOver = new Promise<'grace'>((resolve) => {
      timer = this.timers.setTimeout(() => resolve('grace'), graceMs);
      const endGrace = opts?.endGrace;
      if (endGrace?.aborted === true) resolve('grace');
      else endGrace?.addEventListener('abort', () => resolve('grace'), { once: true });
    });
    const outcome = await Promise.race([drained.then(() => 'drained' as const), graceOver]);
    this.timers.clearTimeout(timer);
    if (this.sweepTimer !== undefined) this.timers.clearTimeout(this.sweepTimer);
    let cut = 0;
    if (outcome === 'grace') {
      for (const s of sockets) {
        cut += s.active();
        s.destroyAll();
      }
    }
    this.units.clear();
    this.retired.clear();
    return { cut };
  }

  /** `reuse`: the balancer of the unit this one replaces (a recreate). */
  private async openUnit({ unit, listen, preferredProxyPort, proxyPort }: UnitOpen, reuse?: LoadBalancer): Promise<void> {
    if (this.stopping) return;
    // Only after a batch that failed half-way can a unit be opened twice: never leak the first.
    this.closeUnit(unit.id);
    const deps: BalancerDeps = { clock: this.opts.clock, random: this.opts.random };
    const shared = this.opts.shared;
    if (shared !== undefined) {
      deps.shared = {
        seed: shared.seed,
        worker: shared.worker,
        onStickyChange: () => {
          this.stickyNews.add(unit.id);
          shared.onStickyChange();
        },
      };
    }
    const balancer = reuse ?? this.opts.balancerFactory(deps);
    balancer.setAffinity(unit.affinity);
    balancer.setAlgorithm(unit.loadBalancer ?? 'round-robin');
    balancer.setEndpoints(unit.endpoints);
    const stats = new ServicePortStats();
    const socket = this.opts.socketFactory(unit, balancer, stats);
    const listeners = listen.map((spec) => ({ spec }));
    const ru: RunningUnit = { unit, balancer, stats, socket, listeners };
    if (preferredProxyPort !== undefined) ru.preferredProxyPort = preferredProxyPort;
    if (proxyPort !== undefined) ru.fixedProxyPort = proxyPort;
    this.units.set(unit.id, ru);
    if (unit.protocol === 'UDP') this.udpUnits.add(ru);
    for (const l of listeners) await this.bindListener(ru, l);
    if (this.log.isLevelEnabled('debug')) this.log.debug({ service: unit.id, endpoints: unit.endpoints.map((e) => e.addr) }, 'opened service port');
  }

  private updateUnit(unit: ProxyUnit): void {
    const ru = this.units.get(unit.id);
    if (!ru) return;
    ru.unit = unit;
    ru.balancer.setAffinity(unit.affinity);
    ru.balancer.setAlgorithm(unit.loadBalancer ?? 'round-robin');
    ru.balancer.setEndpoints(unit.endpoints);
    // After the balancer: connections held for want of endpoints go on to the new ones.
    ru.socket.update(unit);
  }

  private closeUnit(id: string): void {
    const ru = this.units.get(id);
    if (!ru) return;
    this.units.delete(id);
    this.udpUnits.delete(ru);
    for (const l of ru.listeners) {
      if (l.bound) this.bound--;
      if (l.error !== undefined) this.failing--;
    }
    // Not to another unit of this batch: the portal still sends this one's traffic there.
    if (ru.proxyPort !== undefined && this.opts.portAllocator.quarantine(ru.proxyPort)) this.heldProxyPorts++;
    const socket = ru.socket;
    this.retired.add(socket);
    // Closing stops accepting; established TCP connections run on until they end.
    void socket.close().then(
      () => socket.drained(),
      (err: unknown) => this.log.warn({ err, service: id }, 'closing service port failed'),
    ).finally(() => this.retired.delete(socket));
  }

  private refusal(max: number): NodeJS.ErrnoException {
    if (this.refused?.max !== max) this.refused = { max, err: outOfDescriptors(max) };
    return this.refused.err;
  }

  /** Bind one listener; on failure record a clear error for that unit (retried at the next apply). */
  private async bindListener(ru: RunningUnit, l: ListenerState): Promise<void> {
    const { spec } = l;
    const max = this.opts.maxListeners ?? Infinity;
    if (this.bound >= max) {
      this.setListenError(ru, l, listenErrorMessage(this.refusal(max), spec), 'EMFILE');
      return;
    }
    try {
      if (spec.proxyPort) {
        // A unit has one proxy port number: a further proxy-port listener (its other IP family)
        // binds that same number, so the portal's rules for both families point at one port.
        l.bound = ru.proxyPort === undefined
          ? await this.bindProxyPort(ru, spec.host)
          : await ru.socket.listen({ host: spec.host || this.opts.bindAddress, port: ru.proxyPort, nat: true });
      } else {
        const sources = sourcesOf(spec);
        l.bound = await ru.socket.listen(sources === undefined ? { host: spec.host, port: spec.port } : { host: spec.host, port: spec.port, sources });
      }
      this.bound++;
      if (l.error !== undefined) this.failing--;
      l.error = undefined;
    } catch (err) {
      this.setListenError(ru, l, listenErrorMessage(err, spec), errnoCode(err) ?? String(err));
    }
  }

  /** Records why a listener is not bound; says so once per unit and reason. */
  private setListenError(ru: RunningUnit, l: ListenerState, message: string, code: string): void {
    if (l.error === message) return;
    if (l.error === undefined) this.failing++;
    this.log.error({ service: ru.unit.id, err: code }, `${ru.unit.id}: ${message}`);
    l.error = message;
  }

  private async bindProxyPort(ru: RunningUnit, host: string): Promise<BoundAddress> {
    if (ru.fixedProxyPort !== undefined) return this.bindFixedProxyPort(ru, host, ru.fixedProxyPort);
    // The port the portal's rules pointed at last, if free: conntrack entries of ongoing flows point there.
    const preferred = ru.preferredProxyPort;
    for (let attempt = 0; ; attempt++) {
      const port = attempt === 0 && preferred !== undefined && this.opts.portAllocator.claim(preferred) ? preferred : this.opts.portAllocator.allocateNext();
      try {
        const bound = await ru.socket.listen({ host: host || this.opts.bindAddress, port, nat: true });
        ru.proxyPort = bound.port;
        this.boundProxyPorts.push({ id: ru.unit.id, port: bound.port });
        return bound;
      } catch (err) {
        const inUse = errnoCode(err) === 'EADDRINUSE';
        // Whatever kept the preferred port from binding, an allocated one may still bind.
        if (port !== 0 && (inUse || port === preferred) && attempt < 16) {
          if (inUse) this.opts.portAllocator.markInUse(port);
          else this.opts.portAllocator.release(port);
          continue;
        }
        if (port !== 0) this.opts.portAllocator.release(port);
        throw err;
      }
    }
  }

  /**
   * The port a sibling worker bound for this unit, and no other: the portal sends the whole node's
   * traffic for the unit there. Marked taken in this worker's allocator too, so that, should this
   * worker bind the next new units, it does not hand the port out again.
   */
  private async bindFixedProxyPort(ru: RunningUnit, host: string, port: number): Promise<BoundAddress> {
    if (port === 0) throw new ProxyError('STARTUP', 'no proxy port yet: the first worker could not bind one (see its error)');
    this.opts.portAllocator.markInUse(port);
    try {
      const bound = await ru.socket.listen({ host: host || this.opts.bindAddress, port, nat: true });
      ru.proxyPort = bound.port;
      return bound;
    } catch (err) {
      this.opts.portAllocator.release(port);
      throw err;
    }
  }

  /** Binds again what failed before this batch: how many still fail, and how many are bound now. */
  private async retryListeners(batch: UnitBatch): Promise<{ failed: number; bound: number }> {
    // Nothing failed anywhere (the usual case): no walk over every unit, which at 10,000 service
    // ports is 12 ms of the first sync's end (the batch's Set and the walk, cold code).
    if (this.failing === 0) return { failed: 0, bound: 0 };
    const fresh = new Set([...batch.open, ...batch.recreate].map((o) => o.unit.id));
    let failed = 0;
    let bound = 0;
    for (const ru of this.units.values()) {
      if (fresh.has(ru.unit.id)) continue;
      for (const l of ru.listeners) {
        if (!l.error) continue;
        await this.bindListener(ru, l);
        if (l.error) failed++;
        else bound++;
      }
    }
    return { failed, bound };
  }

  /**
   * The one coarse timer: idle UDP sessions every tick (a fraction of --udp-timeout); TCP holds,
   * --tcp-idle-timeout, keepalive for clients that lived 1-2 s and expired affinity about once a
   * second, which their durations (seconds) allow. At 10,000 TCP service ports a tick over every
   * unit cost ~1% of a core while idle.
   */
  private sweep(): void {
    // The sockets stamp activity with performance.now(): the sweep reads the same clock.
    const now = performance.now();
    const slow = now - this.lastSweepAffinity >= 1000;
    if (!slow) {
      for (const ru of this.udpUnits) ru.socket.sweep(now);
      return;
    }
    this.lastSweepAffinity = now;
    for (const ru of this.units.values()) {
      ru.socket.sweep(now);
      if (ru.unit.affinity.type === 'ClientIP') ru.balancer.cleanupStaleStickySessions();
    }
    // Closed units' connections run on until they end: --tcp-idle-timeout applies to them too.
    for (const socket of this.retired) socket.sweep(now);
  }
}

/** The socket factory's TCP sockets take hand-offs (io/net/tcp-proxy.ts); a test's fake may not. */
function isHandOff(socket: ProxySocket): socket is ProxySocket & TcpHandOff {
  return typeof (socket as Partial<TcpHandOff>).adopt === 'function';
}

function unitStatus(ru: RunningUnit): UnitStatus {
  const load = ru.balancer.load();
  return {
    name: ru.unit.id,
    servicePort: ru.unit.servicePort,
    protocol: ru.unit.protocol,
    scope: ru.unit.scope,
    portals: ru.unit.portals,
    reachable: ru.listeners.filter((l) => l.bound && !l.spec.proxyPort).map((l) => hostPort(l.bound as BoundAddress)),
    proxyPort: ru.proxyPort ?? null,
    // From load(), which reads a balancer's first list without making it into slots (GET
    // /services must not undo the start-up's saving at 10,000 ports).
    endpoints: load.map((l) => l.addr),
    sessionAffinity: ru.unit.affinity.type,
    loadBalancer: ru.unit.loadBalancer ?? 'round-robin',
    setAside: setAside(load),
    ...(ru.unit.holdWhenEmptyMs === undefined ? {} : { holdWhenEmpty: formatDuration(ru.unit.holdWhenEmptyMs) }),
    ...(ru.unit.proxyProtocol === undefined ? {} : { proxyProtocol: ru.unit.proxyProtocol }),
    held: ru.stats.held,
    active: ru.socket.active(),
    errors: ru.listeners.filter((l) => l.error).map((l) => l.error as string),
    ...(ru.unit.unreachable ? { unreachable: ru.unit.unreachable } : {}),
  };
}

function setAside(load: readonly EndpointLoad[]): UnitStatus['setAside'] {
  const out: UnitStatus['setAside'] = [];
  const now = Date.now();
  for (const l of load) if (l.setAsideMs > 0) out.push({ endpoint: l.addr, until: new Date(now + l.setAsideMs).toISOString() });
  return out;
}

/**
 * The clients a listener on the portal's own address may serve: a load balancer's source ranges of
 * the address's family, when every portal it serves has them (an address that is also another kind
 * of portal serves all; as kube-proxy, a portal with no range of its family takes every source).
 */
function sourcesOf(spec: ListenSpec): string[] | undefined {
  if (spec.portals.length === 0 || spec.portals.some((p) => p.sourceRanges === undefined)) return undefined;
  const ranges = cidrsOfFamily(spec.portals.flatMap((p) => p.sourceRanges ?? []), ipFamily(spec.host));
  return ranges.length === 0 ? undefined : [...new Set(ranges.map((c) => c.text))];
}

function listenErrorMessage(err: unknown, spec: ListenSpec): string {
  const where = spec.proxyPort ? `a proxy port on ${spec.host || '*'}` : hostPort(spec);
  switch (errnoCode(err)) {
    case 'EACCES':
      return `cannot listen on ${where}: permission denied; ports below 1024 need privilege (run as root, grant CAP_NET_BIND_SERVICE, or lower it with: sysctl net.ipv4.ip_unprivileged_port_start=${spec.port})`;
    case 'EADDRINUSE':
      return `cannot listen on ${where}: the address is in use by another process`;
    case 'EADDRNOTAVAIL':
      return `cannot listen on ${where}: the address is not local to this node`;
    case 'EMFILE':
    case 'ENFILE':
      return `not served: cannot listen on ${where}: out of open files (${err instanceof Error ? err.message : String(err)}); raise the open-file limit (ulimit -n, LimitNOFILE= under systemd, the container runtime's nofile)`;
    default:
      return `cannot listen on ${where}: ${err instanceof Error ? err.message : String(err)}`;
  }
}

/** The error a listener gets when binding it would eat into the descriptors set aside. */
function outOfDescriptors(max: number): NodeJS.ErrnoException {
  const err: NodeJS.ErrnoException = new Error(`${max} listening sockets are all this process may hold; the rest of its open-file limit is kept for connections and its own work`);
  err.code = 'EMFILE';
  return err;
}
