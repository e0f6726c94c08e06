import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { LoadBalancer, BalancerFactory } from './core/balancer/load-balancer.js';
import type { Clock, RandomSource } from './core/clock.js';
import { categorizeEndpoints, lacksLocalEndpoints } from './core/endpoints.js';
import type { Endpoint, NodeInfo, ObjectProblem, PortalAddress, ServicePort } from './core/model.js';
import { problemString } from './core/model.js';
import type { PortAllocator } from './core/port-allocator.js';
import { StateCache, type StateSink } from './core/state-cache.js';
import { ServicePortStats } from './core/stats.js';
import { translateService } from './core/translate.js';
import { diffUnits, planUnits, type ProxyUnit } from './core/units.js';
import { errnoCode } from './errors.js';
import type { BoundAddress, ProxySocket } from './io/net/proxy-socket.js';
import type { ListenSpec, Portal, RunningUnitView } from './io/portal/portal.js';
import type { Logger } from './log.js';
import { BoundedFrequencyRunner } from './runner.js';

/** Builds the sockets of one unit; main wires TCP and UDP proxy sockets here, tests may fake it. */
export type ProxySocketFactory = (unit: ProxyUnit, balancer: LoadBalancer, stats: ServicePortStats) => ProxySocket;

export interface ProxierOptions {
  portal: Portal;
  logger: Logger;
  balancerFactory: BalancerFactory;
  socketFactory: ProxySocketFactory;
  portAllocator: PortAllocator;
  clock: Clock;
  random: RandomSource;
  node: NodeInfo;
  /** `--iptables-min-sync-period`: bursts of changes merge into one sync at most this often. */
  minSyncPeriodMs: number;
  /** `--iptables-sync-period`: a full resync (portal re-check) at least this often. */
  syncPeriodMs: number;
  /** How often the one coarse sweep runs (UDP idle sessions, expired affinity). */
  sweepIntervalMs: number;
  /** Where proxy ports are bound when the portal asks for one (`--bind-address`). */
  bindAddress: string;
}

/** One listener a unit wants, and what became of it. */
interface ListenerState {
  spec: ListenSpec;
  bound?: BoundAddress;
  error?: string;
}

interface RunningUnit {
  unit: ProxyUnit;
  balancer: LoadBalancer;
  stats: ServicePortStats;
  socket: ProxySocket;
  listeners: ListenerState[];
  proxyPort?: number;
}

/** What kube-proxy's healthCheckNodePort server answers for one Service. */
export interface ServiceHealth {
  /** `ns/name`. */
  service: string;
  healthCheckNodePort: number;
  /** Ready endpoints of the Service on this node (the largest over its ports). */
  localEndpoints: number;
}

export interface SyncSummary {
  services: number;
  units: number;
  opened: number;
  closed: number;
  recreated: number;
  updated: number;
  listenErrors: number;
  portalErrors: number;
  durationMs: number;
}

/** What /services reports for a unit. */
export interface UnitStatus {
  name: string;
  servicePort: string;
  protocol: string;
  scope: string;
  portal: string;
  portals: PortalAddress[];
  reachable: string[];
  proxyPort: number | null;
  endpoints: string[];
  sessionAffinity: string;
  active: number;
  errors: string[];
}

/**
 * The proxier: keeps running sockets in line with the desired service ports (upstream
 * pkg/proxy/userspace/proxier.go). Sources write objects into `sink`; changes are merged per
 * Service and applied by one rate-limited sync. Nothing is programmed before `setSynced()`.
 */
export class Proxier {
  readonly cache: StateCache;
  readonly sink: StateSink;
  private readonly log: Logger;
  private readonly runner: BoundedFrequencyRunner;
  private readonly units = new Map<string, RunningUnit>();
  /** Unit ids per Service key, to diff one Service at a time. */
  private readonly unitsByService = new Map<string, string[]>();
  /** Sockets closed by a sync whose TCP connections still run: tracked for shutdown. */
  private readonly retired = new Set<ProxySocket>();
  private readonly noticed = new Set<string>();
  /** Services with a healthCheckNodePort, and how many ready endpoints this node has for them. */
  private readonly health = new Map<string, ServiceHealth>();
  /** Per Service, its ports that lack local endpoints (see lacksLocalEndpoints), and the totals. */
  private readonly noLocal = new Map<string, { internal: number; external: number }>();
  private readonly noLocalTotals = { internal: 0, external: 0 };
  private synced = false;
  /** Set by shutdown: no sync starts, and one under way opens nothing more. */
  private stopping = false;
  /** The sync under way, if any: shutdown waits for it before closing what runs. */
  private current: Promise<void> | undefined;
  /** True until the portal has been programmed once, and again after it failed. */
  private portalNeedsSync = true;
  private sweepTimer: NodeJS.Timeout | undefined;
  private lastSweepAffinity = 0;
  lastSync: SyncSummary | undefined;
  /** Set by a sync that ran; read by health checks. */
  lastSyncAt: number | undefined;
  /** When the oldest change not yet applied was queued, or undefined when none waits. */
  pendingSince: number | undefined;
  readonly onSync: Array<(s: SyncSummary) => void> = [];

  constructor(private readonly opts: ProxierOptions) {
    this.log = opts.logger.child({ component: 'proxier' });
    this.cache = new StateCache({
      onProblem: (p: ObjectProblem) => this.log.warn({ object: p.object, field: p.field, file: p.file }, problemString(p)),
    });
    this.sink = this.makeSink();
    this.runner = new BoundedFrequencyRunner((periodic) => this.syncSafely(periodic), opts.minSyncPeriodMs, opts.syncPeriodMs);
  }

  get mode(): string {
    return this.opts.portal.mode;
  }

  get node(): NodeInfo {
    return this.opts.node;
  }

  /**
   * The first full lists have arrived: program them now (resolves after that first sync), and from
   * then on program changes through the rate-limited runner.
   */
  async setSynced(): Promise<void> {
    if (this.synced) return;
    this.synced = true;
    await this.syncSafely(false);
    this.runner.start();
    if (this.pendingSince !== undefined) this.runner.run();
    this.startSweep();
  }

  /** Ask for a sync (merged with others within the minimum sync period). */
  requestSync(): void {
    this.pendingSince ??= this.opts.clock.now();
    if (this.synced) this.runner.run();
  }

  /** Run one sync now (tests, and the first sync at start-up). */
  async syncNow(periodic = false): Promise<SyncSummary> {
    await this.runner.idle();
    await this.syncSafely(periodic);
    return this.lastSync as SyncSummary;
  }

  status(): UnitStatus[] {
    const out: UnitStatus[] = [];
    for (const ru of this.units.values()) out.push(this.unitStatus(ru));
    return out.sort((a, b) => a.name.localeCompare(b.name));
  }

  /** Sockets listening now (portal addresses and proxy ports): descriptors held for good. */
  listenerCount(): number {
    let n = 0;
    for (const ru of this.units.values()) for (const l of ru.listeners) if (l.bound) n++;
    return n;
  }

  /** Stats of every running unit, for metrics. */
  unitStats(): Array<{ unit: ProxyUnit; stats: ServicePortStats; active: number }> {
    return [...this.units.values()].map((ru) => ({ unit: ru.unit, stats: ru.stats, active: ru.socket.active() }));
  }

  /** Active connections and sessions over every socket, running or retired. */
  activeConnections(): number {
    let n = 0;
    for (const ru of this.units.values()) n += ru.socket.active();
    for (const s of this.retired) n += s.active();
    return n;
  }

  /**
   * Stop accepting everywhere, let established connections finish for up to `graceMs`, then cut
   * what remains. Portal rules are left to the caller (they stay in place across a restart).
   */
  async shutdown(graceMs: number): Promise<{ cut: number }> {
    this.stopping = true;
    this.runner.stop();
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    // A sync under way could otherwise open sockets after the snapshot below, never to be closed.
    await this.current;
    const sockets = [...[...this.units.values()].map((u) => u.socket), ...this.retired];
    await Promise.allSettled(sockets.map((s) => s.close()));
    const drained = Promise.allSettled(sockets.map((s) => s.drained()));
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<'grace'>((resolve) => {
      timer = setTimeout(() => resolve('grace'), graceMs);
    });
    const outcome = await Promise.race([drained.then(() => 'drained' as const), graceOver]);
    clearTimeout(timer);
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

  private makeSink(): StateSink {
    const cache = this.cache;
    const changed = (): void => this.requestSync();
    return {
      upsertService: (o: V1Service) => { cache.upsertService(o); changed(); },
      deleteService: (ns: string, name: string) => { cache.deleteService(ns, name); changed(); },
      upsertEndpointSlice: (o: V1EndpointSlice) => { cache.upsertEndpointSlice(o); changed(); },
      deleteEndpointSlice: (ns: string, name: string) => { cache.deleteEndpointSlice(ns, name); changed(); },
      replaceServices: (objs: V1Service[]) => { cache.replaceServices(objs); changed(); },
      replaceEndpointSlices: (objs: V1EndpointSlice[]) => { cache.replaceEndpointSlices(objs); changed(); },
      setNode: (node: NodeInfo) => { cache.setNode(node); this.opts.node.zone = node.zone; changed(); },
    } as StateSink;
  }

  private async syncSafely(periodic: boolean): Promise<void> {
    if (this.stopping) return;
    const run = this.sync(periodic).catch((err: unknown) => {
      // A bug, not input: keep its stack, keep serving what runs, try again next period.
      this.log.error({ err }, 'sync failed');
    });
    this.current = run;
    await run;
    if (this.current === run) this.current = undefined;
  }

  private async sync(periodic: boolean): Promise<void> {
    const started = this.opts.clock.now();
    this.pendingSince = undefined;
    const summary: SyncSummary = { services: 0, units: 0, opened: 0, closed: 0, recreated: 0, updated: 0, listenErrors: 0, portalErrors: 0, durationMs: 0 };
    const dirty: Array<{ key: string; desired: ProxyUnit[] }> = [];
    for (const key of this.cache.takeDirty()) {
      try {
        dirty.push({ key, desired: this.desiredUnits(key) });
      } catch (err) {
        // A bug in translation must not cost the other Services their changes: this one keeps
        // what runs for it and is tried again at the next sync.
        this.log.error({ err, service: key }, 'translating the Service failed; keeping what runs for it');
        this.cache.markDirty([key]);
      }
    }
    let prepareErrors: string[] = [];
    if (this.opts.portal.prepare) {
      prepareErrors = (await this.opts.portal.prepare(dirty.flatMap((d) => d.desired))).errors;
      for (const e of prepareErrors) this.log.error({ portal: this.opts.portal.mode }, e);
    }
    for (const { key, desired } of dirty) await this.syncService(key, desired, summary);
    const retried = await this.retryListeners();
    summary.listenErrors += retried.failed;
    // Rules and addresses depend on units' portals and proxy ports, not on their endpoints: an
    // endpoint change (the common event) leaves the portal alone. The first sync, the periodic one,
    // and any after a portal failure always program it.
    const portalChanged = summary.opened + summary.closed + summary.recreated + retried.bound > 0;
    let portalErrors: string[] = [];
    if (portalChanged || periodic || this.portalNeedsSync) {
      const views: RunningUnitView[] = [...this.units.values()].map((ru) => (ru.proxyPort === undefined ? { unit: ru.unit } : { unit: ru.unit, proxyPort: ru.proxyPort }));
      portalErrors = (await this.opts.portal.sync(views, periodic)).errors;
      for (const e of portalErrors) this.log.error({ portal: this.opts.portal.mode }, e);
      this.portalNeedsSync = portalErrors.length > 0;
    }
    summary.portalErrors = prepareErrors.length + portalErrors.length;
    summary.services = this.unitsByService.size;
    summary.units = this.units.size;
    summary.durationMs = Math.round((this.opts.clock.now() - started) * 100) / 100;
    this.lastSync = summary;
    this.lastSyncAt = this.opts.clock.now();
    const changedSomething = summary.opened + summary.closed + summary.recreated + summary.updated + summary.listenErrors + summary.portalErrors > 0;
    if (changedSomething || !periodic) this.log.info({ ...summary, periodic }, 'synced proxy rules');
    for (const cb of this.onSync) cb(summary);
  }

  /** Services with a healthCheckNodePort, as of the last sync. */
  serviceHealth(): ServiceHealth[] {
    return [...this.health.values()];
  }

  /** Service ports whose Local traffic policy finds no endpoint on this node, as of the last sync. */
  noLocalEndpoints(): { internal: number; external: number } {
    return { ...this.noLocalTotals };
  }

  private setNoLocal(key: string, counts: { internal: number; external: number } | undefined): void {
    const old = this.noLocal.get(key);
    if (old) {
      this.noLocalTotals.internal -= old.internal;
      this.noLocalTotals.external -= old.external;
      this.noLocal.delete(key);
    }
    if (counts && counts.internal + counts.external > 0) {
      this.noLocalTotals.internal += counts.internal;
      this.noLocalTotals.external += counts.external;
      this.noLocal.set(key, counts);
    }
  }

  private desiredUnits(key: string): ProxyUnit[] {
    this.health.delete(key);
    this.setNoLocal(key, undefined);
    const svc = this.cache.service(key);
    if (!svc) return [];
    const result = translateService(svc, this.cache.slicesFor(key));
    if (result.skipped) {
      this.noticeOnce(`${key}|skip|${result.skipped}`, { service: key }, `skipping Service ${key}: ${result.skipped}`);
      return [];
    }
    for (const n of result.notices) this.noticeOnce(`${key}|${n}`, { service: key }, `Service ${key}: ${n}`);
    const noLocal = { internal: 0, external: 0 };
    const units = result.ports.flatMap((sp: ServicePort) => {
      const sets = categorizeEndpoints(sp, this.opts.node);
      const lacks = lacksLocalEndpoints(sp, sets);
      if (lacks.internal) noLocal.internal++;
      if (lacks.external) noLocal.external++;
      if (sp.healthCheckNodePort > 0) {
        const prev = this.health.get(key)?.localEndpoints ?? 0;
        this.health.set(key, { service: key, healthCheckNodePort: sp.healthCheckNodePort, localEndpoints: Math.max(prev, sets.localReadyEndpoints) });
      }
      return planUnits(sp, sets);
    });
    this.setNoLocal(key, noLocal);
    return units;
  }

  private async syncService(key: string, desired: ProxyUnit[], summary: SyncSummary): Promise<void> {
    const runningIds = this.unitsByService.get(key) ?? [];
    const running = runningIds.map((id) => this.units.get(id)?.unit).filter((u): u is ProxyUnit => u !== undefined);
    const diff = diffUnits(running, desired);
    for (const u of diff.close) this.closeUnit(u.id);
    for (const { from, to } of diff.recreate) {
      this.closeUnit(from.id);
      await this.openUnit(to);
    }
    for (const u of diff.open) await this.openUnit(u);
    for (const { to } of diff.update) this.updateUnit(to);
    summary.closed += diff.close.length;
    summary.recreated += diff.recreate.length;
    summary.opened += diff.open.length;
    summary.updated += diff.update.length;
    if (desired.length > 0) this.unitsByService.set(key, desired.map((u) => u.id));
    else this.unitsByService.delete(key);
    for (const u of [...diff.open, ...diff.recreate.map((r) => r.to)]) {
      summary.listenErrors += this.units.get(u.id)?.listeners.filter((l) => l.error).length ?? 0;
    }
  }

  private async openUnit(unit: ProxyUnit): Promise<void> {
    if (this.stopping) return;
    const balancer = this.opts.balancerFactory({ clock: this.opts.clock, random: this.opts.random });
    balancer.setAffinity(unit.affinity);
    balancer.setEndpoints(unit.endpoints);
    const stats = new ServicePortStats();
    const socket = this.opts.socketFactory(unit, balancer, stats);
    const listeners = this.opts.portal.listenSpecs(unit).map((spec) => ({ spec }));
    const ru: RunningUnit = { unit, balancer, stats, socket, listeners };
    this.units.set(unit.id, ru);
    for (const l of listeners) await this.bindListener(ru, l);
    if (this.log.isLevelEnabled('debug')) this.log.debug({ service: unit.id, endpoints: unit.endpoints.map((e) => e.addr) }, 'opened service port');
  }

  private updateUnit(unit: ProxyUnit): void {
    const ru = this.units.get(unit.id);
    if (!ru) return;
    ru.unit = unit;
    ru.balancer.setAffinity(unit.affinity);
    ru.balancer.setEndpoints(unit.endpoints);
  }

  private closeUnit(id: string): void {
    const ru = this.units.get(id);
    if (!ru) return;
    this.units.delete(id);
    if (ru.proxyPort !== undefined) this.opts.portAllocator.release(ru.proxyPort);
    const socket = ru.socket;
    this.retired.add(socket);
    // Closing stops accepting; established TCP connections run on until they end.
    void socket.close().then(
      () => socket.drained(),
      (err: unknown) => this.log.warn({ err, service: id }, 'closing service port failed'),
    ).finally(() => this.retired.delete(socket));
  }

  /** Bind one listener; on failure record a clear error for that service port and retry next sync. */
  private async bindListener(ru: RunningUnit, l: ListenerState): Promise<void> {
    const { spec } = l;
    try {
      if (spec.proxyPort) {
        // A unit has one proxy port number: a further proxy-port listener (its other IP family)
        // binds that same number, so the portal's rules for both families point at one port.
        l.bound = ru.proxyPort === undefined
          ? await this.bindProxyPort(ru, spec.host)
          : await ru.socket.listen({ host: spec.host || this.opts.bindAddress, port: ru.proxyPort });
      } else {
        l.bound = await ru.socket.listen({ host: spec.host, port: spec.port });
      }
      l.error = undefined;
    } catch (err) {
      const message = listenErrorMessage(err, spec);
      if (l.error !== message) this.log.error({ service: ru.unit.id, err: errnoCode(err) ?? String(err) }, `${ru.unit.id}: ${message}`);
      l.error = message;
    }
  }

  private async bindProxyPort(ru: RunningUnit, host: string): Promise<BoundAddress> {
    // The port its rules pointed at last, if free: conntrack entries of ongoing flows point there.
    const preferred = this.opts.portal.preferredProxyPort?.(ru.unit);
    for (let attempt = 0; ; attempt++) {
      const port = attempt === 0 && preferred !== undefined && this.opts.portAllocator.claim(preferred) ? preferred : this.opts.portAllocator.allocateNext();
      try {
        const bound = await ru.socket.listen({ host: host || this.opts.bindAddress, port });
        ru.proxyPort = bound.port;
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

  /** Binds again what failed before: how many still fail, and how many are bound now. */
  private async retryListeners(): Promise<{ failed: number; bound: number }> {
    let failed = 0;
    let bound = 0;
    for (const ru of this.units.values()) {
      for (const l of ru.listeners) {
        if (!l.error) continue;
        await this.bindListener(ru, l);
        if (l.error) failed++;
        else bound++;
      }
    }
    return { failed, bound };
  }

  private startSweep(): void {
    this.sweepTimer = setInterval(() => this.sweep(), this.opts.sweepIntervalMs);
    this.sweepTimer.unref();
  }

  /** The one coarse timer: idle UDP sessions every tick, expired affinity about once a second. */
  private sweep(): void {
    const now = performance.now();
    const affinity = now - this.lastSweepAffinity >= 1000;
    if (affinity) this.lastSweepAffinity = now;
    for (const ru of this.units.values()) {
      ru.socket.sweep(now);
      if (affinity && ru.unit.affinity.type === 'ClientIP') ru.balancer.cleanupStaleStickySessions();
    }
  }

  private unitStatus(ru: RunningUnit): UnitStatus {
    return {
      name: ru.unit.id,
      servicePort: ru.unit.servicePort,
      protocol: ru.unit.protocol,
      scope: ru.unit.scope,
      portal: this.opts.portal.mode,
      portals: ru.unit.portals,
      reachable: ru.listeners.filter((l) => l.bound && !l.spec.proxyPort).map((l) => hostPort(l.bound as BoundAddress)),
      proxyPort: ru.proxyPort ?? null,
      endpoints: ru.balancer.endpoints.map((e: Endpoint) => e.addr),
      sessionAffinity: ru.unit.affinity.type,
      active: ru.socket.active(),
      errors: ru.listeners.filter((l) => l.error).map((l) => l.error as string),
    };
  }

  private noticeOnce(key: string, bindings: object, msg: string): void {
    if (this.noticed.has(key)) return;
    this.noticed.add(key);
    this.log.warn(bindings, msg);
  }
}

export function hostPort(a: { host: string; port: number }): string {
  return a.host.includes(':') ? `[${a.host}]:${a.port}` : `${a.host}:${a.port}`;
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
    default:
      if (err instanceof Error && (err as { code?: string }).code === 'PORT_RANGE_EXHAUSTED') return `cannot listen on ${where}: ${err.message}`;
      return `cannot listen on ${where}: ${err instanceof Error ? err.message : String(err)}`;
  }
}
