import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { Backoff } from '../core/backoff.js';
import type { Clock, RandomSource } from '../core/clock.js';
import type { NodeInfo, ObjectProblem } from '../core/model.js';
import { problemString } from '../core/model.js';
import { PlanTotals, planService, type NotServedPort, type ServiceHealth } from '../core/plan.js';
import type { ReachPolicy } from '../core/reach.js';
import { StateCache } from '../core/state-cache.js';
import { Topic } from '../core/topic.js';
import { diffUnits, type ProxyUnit } from '../core/units.js';
import type { Logger } from '../seams/logger.js';
import type { Portal } from '../seams/portal.js';
import type { ChangeEvent, ProxierEvents, StateChange, SyncEvent, SyncSummary } from '../seams/proxier-events.js';
import type { StateSink } from '../seams/state-sink.js';
import type { UnitBatch, UnitOpen, ShutdownOptions, UnitSet, UnitStatus } from '../seams/unit-set.js';
import { BoundedFrequencyRunner } from './runner.js';

export interface ProxierOptions {
  portal: Portal;
  /** Where the sockets live: this process's (LocalUnitSet) or, later, workers'. */
  units: UnitSet;
  logger: Logger;
  clock: Clock;
  random: RandomSource;
  node: NodeInfo;
  /** `--iptables-min-sync-period`: bursts of changes merge into one sync at most this often. */
  minSyncPeriodMs: number;
  /** `--iptables-sync-period`: a full resync (portal re-check) at least this often. */
  syncPeriodMs: number;
  /** The first retry after a sync that failed (default 1 s); later ones back off up to the sync period. */
  syncRetryMs?: number;
  /** What the dialer can reach (port-forward: TCP to pods); none: everything. */
  reach?: ReachPolicy;
}

/** What /services reports for a unit: the unit set's view, with the portal that serves it. */
export type ServicePortStatus = UnitStatus & { portal: string };

/** Retries of a sync that failed: from 1 s, doubling, up to the periodic resync. */
const DEFAULT_SYNC_RETRY_MS = 1000;

/**
 * The sync loop (upstream pkg/proxy/userspace/proxier.go, reshaped): sources write objects into
 * `sink`; the cache merges changes per Service; one rate-limited runner syncs. A sync plans each
 * changed Service (core/plan.ts), hands the unit set one batch of opens, updates and closes,
 * programs the portal when its rules can have changed, and publishes one SyncEvent. Nothing is
 * programmed before `setSynced()`.
 *
 * After that, a change whose plan only moves endpoints (or affinity) of running units takes the
 * fast lane: it reaches the balancers at once, as the Go userspace proxy's OnEndpointsUpdate did,
 * without waiting for `--iptables-min-sync-period`, which only paces what touches sockets and
 * portal rules. Both lanes run one at a time.
 */
export class Proxier implements ProxierEvents {
  readonly cache: StateCache;
  readonly sink: StateSink;
  private readonly log: Logger;
  private readonly runner: BoundedFrequencyRunner;
  private readonly units: UnitSet;
  /** The units this loop asked for, per Service key: what the next plan is diffed against. */
  private readonly unitsByService = new Map<string, ProxyUnit[]>();
  private unitCount = 0;
  private readonly totals = new PlanTotals();
  private readonly noticed = new Set<string>();
  /** Services whose plan threw, with the message last logged for each. */
  private readonly broken = new Map<string, string>();
  /** Ports the dialer cannot carry, per Service key: listed in status(), never served. */
  private readonly notServed = new Map<string, NotServedPort[]>();
  private readonly changes: Topic<ChangeEvent>;
  private readonly syncs: Topic<SyncEvent>;
  private readonly retry: Backoff;
  private synced = false;
  private syncCount = 0;
  /** Set by shutdown: no sync starts, and one under way opens nothing more. */
  private stopping = false;
  /** The sync under way, if any: shutdown waits for it before closing what runs. */
  private current: Promise<void> | undefined;
  /** True until the portal has been programmed once, and again after it failed. */
  private portalNeedsSync = true;
  /** The units the portal last said it cannot program (PortalSyncResult.skipped), as logged. */
  private lastSkipped = '';
  /** When the oldest change not yet applied was queued, or undefined when none waits. */
  private pendingSince: number | undefined;
  /** Set while the last sync failed: how long until it is tried again. */
  private retryInMs: number | undefined;
  /** Syncs and fast-lane runs, one at a time: each waits for the one before. */
  private exclusive: Promise<void> = Promise.resolve();
  private fastLaneQueued = false;

  constructor(private readonly opts: ProxierOptions) {
    this.log = opts.logger.child({ component: 'proxier' });
    this.units = opts.units;
    this.cache = new StateCache({
      onProblem: (p: ObjectProblem) => this.log.warn({ object: p.object, field: p.field, file: p.file }, problemString(p)),
    });
    const onError = (err: unknown): void => this.log.error({ err }, 'bug: a subscriber failed');
    this.changes = new Topic(onError);
    this.syncs = new Topic(onError);
    this.sink = this.makeSink();
    const retryMs = opts.syncRetryMs ?? DEFAULT_SYNC_RETRY_MS;
    this.retry = new Backoff({ initialMs: retryMs, maxMs: Math.max(retryMs, opts.syncPeriodMs), jitter: 0.2 }, opts.random);
    this.runner = new BoundedFrequencyRunner((periodic) => this.syncSafely(periodic), opts.minSyncPeriodMs, opts.syncPeriodMs);
  }

  get mode(): string {
    return this.opts.portal.mode;
  }

  get node(): NodeInfo {
    return this.opts.node;
  }

  onChange(listener: (e: ChangeEvent) => void): () => void {
    return this.changes.subscribe(listener);
  }

  onSync(listener: (e: SyncEvent) => void): () => void {
    return this.syncs.subscribe(listener);
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
    if (this.retryInMs !== undefined) this.runner.retryAfter(this.retryInMs);
    else if (this.pendingSince !== undefined) this.runner.run();
    this.units.start();
  }

  /** Ask for a sync (merged with others within the minimum sync period). */
  requestSync(): void {
    this.pendingSince ??= this.opts.clock.now();
    if (this.synced) this.runner.run();
  }

  /** Re-plan every Service from memory (kube-proxy's config resync), at the next sync. */
  resync(): void {
    this.cache.markAllDirty();
    this.requestSync();
  }

  /** Run one sync now (tests, and the first sync at start-up). */
  async syncNow(periodic = false): Promise<SyncSummary> {
    await this.runner.idle();
    let summary: SyncSummary | undefined;
    const off = this.onSync((e) => {
      summary = e.summary;
    });
    try {
      await this.syncSafely(periodic);
    } finally {
      off();
    }
    if (summary === undefined) throw new Error('the sync failed (see the log)');
    return summary;
  }

  status(): ServicePortStatus[] {
    const portal = this.opts.portal.mode;
    const running = this.units.status().map((s) => ({ ...s, portal }));
    if (this.notServed.size === 0) return running;
    const listed: ServicePortStatus[] = [...this.notServed.values()].flat().map((n) => ({
      name: n.servicePort,
      servicePort: n.servicePort,
      protocol: n.protocol,
      scope: 'all',
      portals: [],
      reachable: [],
      proxyPort: null,
      endpoints: [],
      sessionAffinity: 'None',
      active: 0,
      errors: [],
      loadBalancer: 'round-robin',
      setAside: [],
      held: 0,
      notServed: n.reason,
      portal,
    }));
    return [...running, ...listed].sort((a, b) => a.name.localeCompare(b.name));
  }

  /** Active connections and sessions over every socket, running or retired. */
  activeConnections(): number {
    return this.units.activeConnections();
  }

  /**
   * Stop syncing and accepting, let established connections finish for up to `graceMs`, then cut
   * what remains. Portal rules are left to the caller (they stay in place across a restart).
   */
  async shutdown(graceMs: number, opts?: ShutdownOptions): Promise<{ cut: number }> {
    // A sync under way could otherwise open sockets after the unit set's snapshot, never to be closed.
    await this.pause();
    return this.units.shutdown(graceMs, opts);
  }

  /**
   * No sync from now on, and the one under way finished: nothing this process does touches the
   * portal any more (a successor that abandons a hand-over, before the old process re-syncs its
   * rules). Serving goes on until shutdown().
   */
  async pause(): Promise<void> {
    this.stopping = true;
    this.runner.stop();
    // A sync waiting for workers (every one down, restarting) would hold this up to 30 s.
    this.units.interrupt?.();
    await this.current;
    await this.exclusive;
  }

  private makeSink(): StateSink {
    const cache = this.cache;
    const apply = (change: StateChange, changed: number): void => {
      if (changed > 0) {
        if (this.synced) this.queueFastLane();
        else this.requestSync();
      }
      this.changes.publish({ change, changed, initialized: this.syncCount > 0 });
    };
    return {
      upsertService: (object: V1Service) => apply({ kind: 'upsertService', object }, cache.upsertService(object)),
      deleteService: (namespace: string, name: string) => apply({ kind: 'deleteService', namespace, name }, cache.deleteService(namespace, name)),
      upsertEndpointSlice: (object: V1EndpointSlice) => apply({ kind: 'upsertEndpointSlice', object }, cache.upsertEndpointSlice(object)),
      deleteEndpointSlice: (namespace: string, name: string) => apply({ kind: 'deleteEndpointSlice', namespace, name }, cache.deleteEndpointSlice(namespace, name)),
      replaceServices: (objects: readonly V1Service[]) => apply({ kind: 'replaceServices', objects }, cache.replaceServices(objects)),
      replaceEndpointSlices: (objects: readonly V1EndpointSlice[]) => apply({ kind: 'replaceEndpointSlices', objects }, cache.replaceEndpointSlices(objects)),
      setNode: (node: NodeInfo) => {
        this.opts.node.zone = node.zone;
        apply({ kind: 'setNode', node }, cache.setNode(node));
      },
    };
  }

  private async syncSafely(periodic: boolean): Promise<void> {
    if (this.stopping) return;
    const run = this.lock(() => this.sync(periodic)).then(
      () => {
        this.retry.reset();
        this.retryInMs = undefined;
      },
      (err: unknown) => {
        // Interrupted by pause(): nothing is to sync any more.
        if (this.stopping) return;
        // A bug, not input: keep its stack, keep serving what runs, and try again soon (the
        // changes it took were handed back to the cache), backing off while it keeps failing.
        const delay = this.retry.next();
        this.retryInMs = delay;
        this.log.error({ err, retryInMs: delay }, 'sync failed');
        this.runner.retryAfter(delay);
      },
    );
    this.current = run;
    await run;
    if (this.current === run) this.current = undefined;
  }

  /** Runs `fn` once every sync and fast-lane run queued before it has finished. */
  private lock(fn: () => Promise<void>): Promise<void> {
    const run = this.exclusive.then(fn);
    this.exclusive = run.catch(() => undefined);
    return run;
  }

  /**
   * The changes of one burst (a source delivers a read's objects in one go) take the fast lane
   * together, once the burst's synchronous calls are done.
   */
  private queueFastLane(): void {
    if (this.fastLaneQueued || this.stopping) return;
    this.fastLaneQueued = true;
    queueMicrotask(() => {
      this.fastLaneQueued = false;
      void this.lock(() => this.fastLane()).catch((err: unknown) => {
        // A bug: the full sync, which retries with backoff, takes the changes over.
        this.log.error({ err }, 'fast lane failed; the next sync applies the changes');
        this.requestSync();
      });
    });
  }

  private async fastLane(): Promise<void> {
    if (this.stopping) return;
    const started = this.opts.clock.now();
    const taken = this.cache.takeDirty();
    if (taken.size === 0) return;
    try {
      await this.apply(taken, false, started, 'endpoints');
    } catch (err) {
      this.cache.markDirty(taken);
      throw err;
    }
  }

  private async sync(periodic: boolean): Promise<void> {
    const started = this.opts.clock.now();
    this.pendingSince = undefined;
    const taken = this.cache.takeDirty();
    try {
      await this.apply(taken, periodic, started);
    } catch (err) {
      this.cache.markDirty(taken);
      this.pendingSince ??= started;
      throw err;
    }
  }

  /**
   * Plans `dirty`, applies the batch, programs the portal when it can have changed, publishes the
   * SyncEvent. In the fast lane (`lane` 'endpoints') a Service that needs a socket opened, closed
   * or made anew is handed back to the runner, and the portal is left alone.
   */
  private async apply(dirty: ReadonlySet<string>, periodic: boolean, started: number, lane: 'full' | 'endpoints' = 'full'): Promise<void> {
    const summary: SyncSummary = { services: 0, units: 0, opened: 0, closed: 0, recreated: 0, updated: 0, listenErrors: 0, portalErrors: 0, durationMs: 0 };
    const batch: UnitBatch = { close: [], recreate: [], open: [], update: [] };
    const planned = new Map<string, ProxyUnit[]>();
    const deferred: string[] = [];
    const unplanned: string[] = [];
    for (const key of dirty) {
      // A Service whose plan failed waits for the full lane, which retries it with backoff.
      if (lane === 'endpoints' && this.broken.has(key)) {
        deferred.push(key);
        continue;
      }
      const desired = this.plan(key);
      if (desired === undefined) {
        unplanned.push(key);
        continue;
      }
      const diff = diffUnits(this.unitsByService.get(key) ?? [], desired);
      if (lane === 'endpoints' && diff.close.length + diff.open.length + diff.recreate.length > 0) {
        deferred.push(key);
        continue;
      }
      for (const u of diff.close) batch.close.push(u.id);
      for (const { to } of diff.recreate) batch.recreate.push(this.unitOpen(to));
      for (const u of diff.open) batch.open.push(this.unitOpen(u));
      for (const { to } of diff.update) batch.update.push(to);
      planned.set(key, desired);
    }
    if (deferred.length > 0) {
      this.cache.markDirty(deferred);
      this.requestSync();
    }
    if (lane === 'endpoints') {
      // Everything handed back: the runner's sync publishes. A Service planned with nothing to
      // update is still applied by this run: its health-check count, no-local counts and queued
      // changes are published now, not at the next periodic sync.
      if (planned.size === 0) return;
      batch.retryFailedListeners = false;
    }
    summary.closed = batch.close.length;
    summary.recreated = batch.recreate.length;
    summary.opened = batch.open.length;
    summary.updated = batch.update.length;
    let prepareErrors: string[] = [];
    if (this.opts.portal.prepare && lane === 'full') {
      prepareErrors = (await this.opts.portal.prepare([...planned.values()].flat())).errors;
      for (const e of prepareErrors) this.log.error({ portal: this.opts.portal.mode }, e);
    }
    if (this.stopping) {
      this.cache.markDirty(dirty);
      return;
    }
    // Whatever opens, closes or recreates a socket changes what the portal must program: note it
    // before anything can throw, so that a retry programs the portal even if this run does not.
    if (batch.open.length + batch.close.length + batch.recreate.length > 0) this.portalNeedsSync = true;
    const applied = lane === 'endpoints' && batch.update.length === 0 ? { listenErrors: 0, rebound: 0 } : await this.units.apply(batch);
    for (const [key, desired] of planned) this.record(key, desired);
    summary.listenErrors = applied.listenErrors;
    // Rules and addresses depend on units' portals and proxy ports, not on their endpoints: an
    // endpoint change (the common event) leaves the portal alone. The first sync, the periodic one,
    // and any after a portal failure always program it.
    const portalChanged = summary.opened + summary.closed + summary.recreated + applied.rebound > 0;
    let portalErrors: string[] = [];
    if (lane === 'full' && (portalChanged || periodic || this.portalNeedsSync)) {
      const result = await this.opts.portal.sync(this.units.views(), periodic);
      portalErrors = result.errors;
      for (const e of portalErrors) this.log.error({ portal: this.opts.portal.mode }, e);
      this.portalNeedsSync = portalErrors.length > 0;
      // Said when the list changes, not at every sync: nothing but the Services' change alters it.
      const skipped = result.skipped ?? [];
      const said = skipped.join('\n');
      if (said !== this.lastSkipped) for (const e of skipped) this.log.warn({ portal: this.opts.portal.mode }, `${e}; the Service's other portals are in force`);
      this.lastSkipped = said;
    }
    // Ports this batch freed were held from the units still without one (the portal pointed them
    // at the closed units until just now): the next sync binds them, soon rather than periodically.
    if ((applied.proxyPortsHeld ?? 0) > 0 && applied.listenErrors > 0) this.runner.run();
    summary.portalErrors = prepareErrors.length + portalErrors.length;
    summary.services = this.unitsByService.size;
    summary.units = this.unitCount;
    const finished = this.opts.clock.now();
    summary.durationMs = Math.round((finished - started) * 100) / 100;
    const changedSomething = summary.opened + summary.closed + summary.recreated + summary.updated + summary.listenErrors + summary.portalErrors > 0;
    // A resync that changed nothing is routine, and endpoint moves can come many a second: say
    // those only at debug.
    if ((changedSomething && lane === 'full') || this.syncCount === 0) this.log.info({ ...summary, periodic }, 'synced proxy rules');
    else if (this.log.isLevelEnabled('debug')) this.log.debug({ ...summary, periodic, lane }, 'synced proxy rules');
    const first = this.syncCount === 0;
    this.syncCount++;
    // Changes that arrived during the run do not make it incomplete (kube-proxy's Updated() clears
    // the pending mark too): under steady churn health must not turn 503 while every sync works.
    const complete = deferred.length === 0 && unplanned.length === 0 && !this.portalNeedsSync;
    this.syncs.publish({
      summary,
      periodic,
      first,
      complete,
      leftFor: [...deferred, ...unplanned],
      startedAt: started,
      finishedAt: finished,
      serviceHealth: this.totals.serviceHealth(),
      noLocalEndpoints: this.totals.noLocalEndpoints(),
      listeners: this.units.listenerCount(),
      listenersFailed: this.units.failedListenerCount(),
    });
  }

  private unitOpen(unit: ProxyUnit): UnitOpen {
    const open: UnitOpen = { unit, listen: this.opts.portal.listenSpecs(unit) };
    const preferred = this.opts.portal.preferredProxyPort?.(unit);
    if (preferred !== undefined) open.preferredProxyPort = preferred;
    return open;
  }

  /** The units a Service wants now, or undefined when planning it failed (a bug: logged, retried later). */
  private plan(key: string): ProxyUnit[] | undefined {
    try {
      const units = this.planOrThrow(key);
      this.broken.delete(key);
      return units;
    } catch (err) {
      // One Service's bug must not cost the others their changes: it keeps what runs for it and
      // is tried again by the runner, with backoff. Said once per Service and message.
      const message = err instanceof Error ? err.message : String(err);
      if (this.broken.get(key) !== message) this.log.error({ err, service: key }, 'planning the Service failed; keeping what runs for it');
      this.broken.set(key, message);
      this.cache.markDirty([key]);
      this.runner.retryAfter(this.retry.next());
      return undefined;
    }
  }

  private planOrThrow(key: string): ProxyUnit[] {
    const plan = planService(key, this.cache.service(key), this.cache.slicesFor(key), this.opts.node, this.opts.reach);
    if (plan.notServed) this.notServed.set(key, plan.notServed);
    else this.notServed.delete(key);
    if (plan.skipped !== undefined) this.noticeOnce(`${key}|skip|${plan.skipped}`, { service: key }, `skipping Service ${key}: ${plan.skipped}`);
    for (const n of plan.notices) this.noticeOnce(`${key}|${n}`, { service: key }, `Service ${key}: ${n}`);
    this.totals.set(key, this.cache.service(key) === undefined ? undefined : plan);
    return plan.units;
  }

  private record(key: string, desired: ProxyUnit[]): void {
    this.unitCount += desired.length - (this.unitsByService.get(key)?.length ?? 0);
    if (desired.length > 0) this.unitsByService.set(key, desired);
    else this.unitsByService.delete(key);
  }

  private noticeOnce(key: string, bindings: object, msg: string): void {
    if (this.noticed.has(key)) return;
    this.noticed.add(key);
    this.log.warn(bindings, msg);
  }
}

export type { ServiceHealth };
