import { Backoff, type BackoffOptions } from '../core/backoff.js';
import type { Clock, RandomSource } from '../core/clock.js';
import { ProxyError } from '../core/errors.js';
import type { Endpoint } from '../core/model.js';
import type { Reading } from '../core/stats-ledger.js';
import { NodeStats, seriesKey, type WorkerReport } from '../core/worker-stats.js';
import type { Logger } from '../seams/logger.js';
import type { RunningUnitView } from '../seams/portal.js';
import type { UnitBatch, UnitBatchResult, UnitOpen, UnitProxyPort, ShutdownOptions, UnitSet, UnitStats, UnitStatus } from '../seams/unit-set.js';
import type { FromWorker, ToWorker, WorkerFigures, WorkerHandle, WorkerLauncher } from '../seams/workers.js';

export interface WorkerPoolOptions {
  /** Worker processes: 2 or more (one runs in the controller's own process, without a pool). */
  size: number;
  launcher: WorkerLauncher;
  logger: Logger;
  clock: Clock;
  random: RandomSource;
  /** How often every worker reports its counters: what a worker killed with SIGKILL can lose at most. */
  reportIntervalMs?: number;
  /**
   * How long a report, status or sticky request may go unanswered: a worker that misses it is
   * wedged (stopped, or spinning), killed and replaced.
   */
  requestTimeoutMs?: number;
  /** The floor of an apply's deadline (a share per unit the batch opens is added); missed, the worker is killed and replaced. */
  applyTimeoutMs?: number;
  /** How long the workers may take to start, and how long a sync waits for a worker to serve. */
  startTimeoutMs?: number;
  /** A worker that ran at least this long before dying is replaced at once; one that died sooner after a backoff. */
  stableMs?: number;
  restartBackoff?: Partial<BackoffOptions>;
  /** A worker began holding connections on `servicePort` for want of endpoints (hold-when-empty; --emit-events). */
  onNeedPods?: (servicePort: string) => void;
}

/**
 * Reports, status and sticky dumps: cheap requests, answered at once by a worker whose event loop
 * turns. One that stays silent this long is wedged (SIGSTOPped, or spinning), not busy: the kernel
 * still hands it its share of new connections, which hang, so it is killed and replaced.
 */
const DEFAULT_REQUEST_TIMEOUT_MS = 5000;
/**
 * An apply's deadline: this floor, plus APPLY_MS_PER_UNIT for each unit the batch opens or makes
 * anew. A wedged worker holds every sync (and so shutdown, which waits for the sync under way) for
 * this long, so it is short for the common batch (endpoint moves: nothing opened); and a healthy
 * worker must never miss it, so it grows with the binds a batch asks for: a catch-up of 10,000
 * units gets 15 s, about 8 times what opening them takes a worker on a quiet core (bench/README.md,
 * 10,000 ports listening in 1.9 s from the process's start).
 */
const DEFAULT_APPLY_TIMEOUT_MS = 5000;
const APPLY_MS_PER_UNIT = 1;
const DEFAULT_REPORT_INTERVAL_MS = 1000;
/** How long a /services answer is reused (when no sync has completed since): its connection counts are that old at most. */
const STATUS_FRESH_MS = 1000;
const DEFAULT_START_TIMEOUT_MS = 30_000;
const DEFAULT_STABLE_MS = 10_000;
/** After the grace period, how long a worker may take to report and exit before it is killed. */
const SHUTDOWN_MARGIN_MS = 5000;

interface Slot {
  index: number;
  handle: WorkerHandle | undefined;
  pid: number | undefined;
  state: WorkerFigures['state'];
  startedAt: number;
  restarts: number;
  /** The round of the current process's last report taken in (0: none): acknowledged in the next request. */
  acked: number;
  /** When the applies sent to the current process and not answered yet are due, the last one included. */
  appliesDue: number;
  appliesPending: number;
  backoff: Backoff;
  restartTimer: NodeJS.Timeout | undefined;
  /** Replies awaited, by request id; resolved with undefined when the process is gone or too slow. */
  pending: Map<number, (reply: FromWorker | undefined) => void>;
  /** Resolves when the current process has exited. */
  exited: Promise<void>;
  markExited: () => void;
}

/** What the controller keeps of a running unit: enough to bring a new worker up to date. */
interface UnitRecord {
  open: UnitOpen;
  /** The proxy port every worker binds (0: the first worker has none yet); undefined: none wanted. */
  proxyPort: number | undefined;
}

/** The reading metrics render, with the number of running units. */
export interface PoolReading {
  reading: Reading;
  running: number;
}

const needsProxyPort = (o: UnitOpen): boolean => o.listen.some((l) => l.proxyPort === true);

/**
 * The controller's unit set when the data path runs in worker processes (`--workers N`, N >= 2).
 * Every worker runs the same units on sockets of its own, bound with SO_REUSEPORT; the kernel
 * spreads connections and UDP flows over them.
 *
 * - apply() resolves when every serving worker has applied the batch, so a SyncEvent (and the
 *   network programming latency observed on it) means the whole node runs it. A batch that opens
 *   units needing proxy ports goes first to one worker (the lowest-numbered serving one), which
 *   binds them (from `--proxy-port-range`, or the kernel's pick); the others then bind exactly
 *   those ports: one proxy port per unit, as the portal needs. Other batches go to all at once.
 * - A worker that exits is replaced (at once if it had run `stableMs`, else after a backoff). The
 *   replacement is sent every running unit as one batch, then the sticky entries of a sibling;
 *   it is not waited for by syncs until it has caught up. Its predecessor's counters are kept
 *   (core/worker-stats.ts).
 * - Sticky entries a worker makes or uses are relayed to the others (ClientIP affinity holds
 *   whichever worker the kernel hands a connection to).
 */
export class WorkerPool implements UnitSet {
  private readonly log: Logger;
  private readonly slots: Slot[] = [];
  private readonly records = new Map<string, UnitRecord>();
  /** Units whose proxy port the first worker has not bound yet. */
  private readonly pendingPorts = new Set<string>();
  private readonly nodeStats = new NodeStats();
  private nextId = 0;
  private started = false;
  private stopping = false;
  private launching: { resolve: () => void; reject: (err: unknown) => void } | undefined;
  private readyWaiters: Array<() => void> = [];
  /** interrupt() was called: no apply waits for a serving worker any more. */
  private interrupted = false;
  private reportTimer: NodeJS.Timeout | undefined;
  /** The collection under way, of each kind (with the kernel's counters read first, or not): callers share it. */
  private readonly collecting = new Map<boolean, Promise<void>>();
  private lastStatus: UnitStatus[] = [];
  /** Applies completed so far: a status asked for before the last one may not show it. */
  private appliedCount = 0;
  /** The status query under way, and the last one's answer: when taken, and after which apply. */
  private statusQuery: { done: Promise<void>; applied: number } | undefined;
  private statusTaken = { at: -Infinity, applied: -1 };
  private listeners = 0;
  private listenersFailed = 0;
  private restartsTotal = 0;
  private unresponsiveTotal = 0;

  constructor(private readonly opts: WorkerPoolOptions) {
    this.log = opts.logger.child({ component: 'workers' });
    for (let index = 0; index < opts.size; index++) {
      this.slots.push({
        index,
        handle: undefined,
        pid: undefined,
        state: 'down',
        startedAt: 0,
        restarts: 0,
        acked: 0,
        appliesDue: 0,
        appliesPending: 0,
        backoff: new Backoff({ initialMs: 1000, maxMs: 30_000, jitter: 0.2, ...opts.restartBackoff }, opts.random),
        restartTimer: undefined,
        pending: new Map(),
        exited: Promise.resolve(),
        markExited: () => undefined,
      });
    }
  }

  /** Starts every worker; resolves when all serve (with no units yet). Rejects with STARTUP, leaving none behind. */
  async launch(): Promise<void> {
    const all = new Promise<void>((resolve, reject) => {
      this.launching = { resolve, reject };
    });
    for (const slot of this.slots) this.spawn(slot);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      const ms = this.opts.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
      timer = setTimeout(() => reject(new ProxyError('STARTUP', `--workers: the worker processes did not start within ${ms} ms`)), ms);
    });
    try {
      await Promise.race([all, timeout]);
    } catch (err) {
      this.stopping = true;
      for (const slot of this.slots) slot.handle?.kill('SIGKILL');
      await Promise.all(this.slots.map((s) => s.exited));
      throw err;
    } finally {
      clearTimeout(timer);
      this.launching = undefined;
    }
    this.log.info({ workers: this.opts.size, pids: this.slots.map((s) => s.pid) }, 'worker processes serving');
    // What a worker killed with SIGKILL loses at most. The kernel's counters (UDP receive-buffer
    // drops, from /proc/net/udp: a file of every UDP socket on the node) are read at scrapes only.
    this.reportTimer = setInterval(() => void this.collect(false), this.opts.reportIntervalMs ?? DEFAULT_REPORT_INTERVAL_MS);
    this.reportTimer.unref();
  }

  // --- UnitSet ------------------------------------------------------------------------------------

  async apply(batch: UnitBatch): Promise<UnitBatchResult> {
    try {
      return await this.applyToWorkers(batch);
    } finally {
      this.appliedCount++;
    }
  }

  private async applyToWorkers(batch: UnitBatch): Promise<UnitBatchResult> {
    if (this.stopping) return { listenErrors: 0, rebound: 0 };
    for (;;) {
      const lead = await this.firstServing();
      const choosing = this.pendingPorts.size > 0 || batch.open.some(needsProxyPort) || batch.recreate.some(needsProxyPort);
      if (!choosing) return this.merge(await this.dispatch(batch, undefined));
      const first = await this.sendApply(lead, this.forLead(batch));
      // The first worker died (or was killed, wedged) before it answered: the next one binds the ports.
      if (first === undefined) continue;
      if (first.t !== 'applied') return this.merge([first]);
      const fixed = withProxyPorts(batch, first.result.proxyPorts ?? []);
      return this.merge([first, ...(await this.dispatch(fixed, lead))]);
    }
  }

  views(): RunningUnitView[] {
    const out: RunningUnitView[] = [];
    for (const r of this.records.values()) out.push(r.proxyPort ? { unit: r.open.unit, proxyPort: r.proxyPort } : { unit: r.open.unit });
    return out;
  }

  status(): UnitStatus[] {
    return this.lastStatus;
  }

  stats(): UnitStats[] {
    return [];
  }

  /**
   * Asks every serving worker for its view of the units: one line per unit, active summed. Readers
   * share one query (every worker walks all its units for it): one under way, or one answered
   * within STATUS_FRESH_MS, serves when no apply has completed since it was asked.
   */
  async refresh(): Promise<void> {
    const applied = this.appliedCount;
    if (this.statusQuery !== undefined && this.statusQuery.applied === applied) return this.statusQuery.done;
    if (this.statusTaken.applied === applied && this.opts.clock.now() - this.statusTaken.at < STATUS_FRESH_MS) return;
    const query = { done: this.queryStatus(applied), applied };
    this.statusQuery = query;
    try {
      await query.done;
    } finally {
      if (this.statusQuery === query) this.statusQuery = undefined;
    }
  }

  private async queryStatus(applied: number): Promise<void> {
    const at = this.opts.clock.now();
    const serving = this.slots.filter((s) => s.state === 'ready');
    const answers = await Promise.all(serving.map(async (slot) => ({ slot, reply: await this.request(slot, (id) => ({ t: 'status', id }), this.requestTimeout()) })));
    const got = answers.filter((a): a is { slot: Slot; reply: Extract<FromWorker, { t: 'status' }> } => a.reply?.t === 'status');
    // A query asked before a later one's apply, answered after it, is older: not taken.
    if (applied < this.statusTaken.applied) return;
    this.lastStatus = mergeStatus(got.map((a) => ({ worker: a.slot.index, status: a.reply.status })));
    this.statusTaken = { at, applied };
  }

  endpoints(id: string): readonly Endpoint[] | undefined {
    return this.records.get(id)?.open.unit.endpoints;
  }

  listenerCount(): number {
    return this.listeners;
  }

  /** Listeners not bound, as the worker that applied the last batch first counts them (they run the same units). */
  failedListenerCount(): number {
    return this.listenersFailed;
  }

  activeConnections(): number {
    return this.nodeStats.active();
  }

  start(): void {
    this.started = true;
    for (const slot of this.slots) if (slot.state === 'ready' || slot.state === 'catching-up') slot.handle?.send({ t: 'start' });
  }

  /** UnitSet.interrupt: an apply waiting for a worker that serves (every one down) fails at once. */
  interrupt(): void {
    this.interrupted = true;
    for (const wake of this.readyWaiters.splice(0)) wake();
  }

  /** Every worker stops accepting and drains for up to `graceMs`; a worker that does not answer in time is killed. */
  async shutdown(graceMs: number, opts?: ShutdownOptions): Promise<{ cut: number }> {
    this.stopping = true;
    clearInterval(this.reportTimer);
    for (const slot of this.slots) clearTimeout(slot.restartTimer);
    const live = this.slots.filter((s) => s.handle !== undefined);
    // The grace period ended early: each worker cuts what it still has and answers at once; one
    // that has not answered within the margin is wedged, and killed now rather than at the end of
    // the grace period it was given (the requests' deadlines shrink to the margin).
    const endGrace = (): void => {
      for (const slot of live) slot.handle?.send({ t: 'endGrace' });
    };
    opts?.endGrace?.addEventListener('abort', endGrace, { once: true });
    if (opts?.endGrace?.aborted === true) endGrace();
    // What each had open, as last reported: a worker that dies while draining is retired (and its
    // figures cleared) before its reply is missed.
    const openBefore = new Map(live.map((slot) => [slot, this.nodeStats.slot(slot.index).active]));
    const shorten = opts?.endGrace === undefined ? undefined : { signal: opts.endGrace, ms: SHUTDOWN_MARGIN_MS };
    const replies = await Promise.all(live.map(async (slot) => {
      const handle = slot.handle;
      const reply = await this.request(slot, (id) => ({ t: 'shutdown', id, graceMs, ack: slot.acked, ...(opts?.handOver === true ? { handOver: true } : {}) }), graceMs + SHUTDOWN_MARGIN_MS, shorten);
      // Taken now, while this process is the slot's: once it has exited (it does right after this
      // reply) its last report is retired into the node's sums, and taking this one then would
      // count it twice.
      if (reply?.t === 'shutdown' && slot.handle === handle) this.takeReport(slot, reply.report);
      return { slot, reply };
    }));
    opts?.endGrace?.removeEventListener('abort', endGrace);
    let cut = 0;
    for (const { slot, reply } of replies) {
      if (reply?.t === 'shutdown') {
        cut += reply.cut;
        continue;
      }
      // Hung (or gone): what it had open is cut with it.
      cut += openBefore.get(slot) ?? 0;
      if (slot.handle !== undefined) {
        this.log.warn({ worker: slot.index, pid: slot.pid }, 'worker did not drain in time: killing it');
        slot.handle.kill('SIGKILL');
      }
    }
    await Promise.all(live.map((s) => s.exited));
    return { cut };
  }

  // --- the node's counters and the workers' figures ---------------------------------------------

  /** Asks every worker for its counters (bounded wait; a silent one counts with its last report), then sums. */
  async readStats(): Promise<PoolReading> {
    await this.collect(true);
    // Made only when a series of workers gone needs it (a worker exited since it was last read).
    let keys: Set<string> | undefined;
    const running = (key: string): boolean => {
      keys ??= new Set([...this.records.values()].map(({ open: { unit } }) => seriesKey(unit)));
      return keys.has(key);
    };
    return { reading: this.nodeStats.read(running), running: this.records.size };
  }

  /** Asks every worker for its counters: figures() is up to date then. */
  async refreshFigures(): Promise<void> {
    await this.collect(false);
  }

  /** Each worker slot, as of the last reports. */
  figures(): WorkerFigures[] {
    const now = this.opts.clock.now();
    return this.slots.map((slot) => {
      const { totals, active } = this.nodeStats.slot(slot.index);
      return {
        worker: slot.index,
        pid: slot.handle === undefined ? null : (slot.pid ?? null),
        state: slot.state,
        restarts: slot.restarts,
        uptimeSeconds: slot.handle === undefined ? 0 : Math.round((now - slot.startedAt) / 100) / 10,
        connectionsAccepted: totals.accepted,
        bytesToEndpoint: totals.bytesToEndpoint,
        bytesToClient: totals.bytesToClient,
        udpDatagrams: totals.udpDatagrams,
        udpSessionsCreated: totals.udpSessionsCreated,
        active,
      };
    });
  }

  /** Workers replaced since the start. */
  restarts(): number {
    return this.restartsTotal;
  }

  /** Workers killed since the start for missing a request's deadline (wedged); each is also a restart. */
  unresponsive(): number {
    return this.unresponsiveTotal;
  }

  /** Worker processes serving now. */
  serving(): number {
    return this.slots.filter((s) => s.state === 'ready').length;
  }

  // --- processes ------------------------------------------------------------------------------------

  private spawn(slot: Slot): void {
    slot.restartTimer = undefined;
    if (this.stopping) return;
    const handle = this.opts.launcher.launch(slot.index);
    slot.handle = handle;
    slot.pid = handle.pid;
    slot.state = 'starting';
    slot.startedAt = this.opts.clock.now();
    slot.acked = 0;
    slot.appliesDue = 0;
    slot.appliesPending = 0;
    slot.exited = new Promise<void>((resolve) => {
      slot.markExited = resolve;
    });
    handle.onMessage((m) => this.onMessage(slot, handle, m));
    handle.onExit((code, signal) => this.onExit(slot, handle, code, signal));
  }

  private onMessage(slot: Slot, handle: WorkerHandle, m: FromWorker): void {
    if (slot.handle !== handle) return;
    switch (m.t) {
      case 'ready':
        this.catchUp(slot, handle);
        return;
      case 'needPods':
        this.opts.onNeedPods?.(m.servicePort);
        return;
      case 'sticky':
        for (const other of this.slots) {
          if (other !== slot && (other.state === 'ready' || other.state === 'catching-up')) other.handle?.send(m);
        }
        return;
      default: {
        const resolve = slot.pending.get(m.id);
        if (resolve === undefined) return;
        slot.pending.delete(m.id);
        resolve(m);
      }
    }
  }

  /** A new worker: every running unit as one batch, then a sibling's sticky entries. */
  private catchUp(slot: Slot, handle: WorkerHandle): void {
    slot.state = 'catching-up';
    const batch = this.snapshot();
    void this.sendApply(slot, batch).then((reply) => {
      // Gone, or killed for missing the deadline (said then).
      if (slot.handle !== handle || slot.state === 'down') return;
      if (reply?.t !== 'applied') {
        this.log.error({ worker: slot.index, pid: slot.pid, reason: reply?.t === 'failed' ? reply.message : 'no answer' }, 'a new worker could not apply the running units: replacing it');
        handle.kill('SIGKILL');
        return;
      }
      slot.state = 'ready';
      if (this.launching === undefined) this.log.info({ worker: slot.index, pid: slot.pid, units: batch.open.length }, 'replacement worker serving');
      if (this.slots.every((s) => s.state === 'ready')) this.launching?.resolve();
      for (const wake of this.readyWaiters.splice(0)) wake();
    });
    if (this.started) handle.send({ t: 'start' });
    const sibling = this.slots.find((s) => s !== slot && s.state === 'ready');
    if (sibling === undefined) return;
    void this.request(sibling, (id) => ({ t: 'stickyDump', id }), this.requestTimeout()).then((reply) => {
      if (reply?.t === 'stickyDump' && reply.updates.length > 0 && slot.handle === handle) handle.send({ t: 'sticky', updates: reply.updates });
    });
  }

  private onExit(slot: Slot, handle: WorkerHandle, code: number | null, signal: string | null): void {
    if (slot.handle !== handle) return;
    slot.handle = undefined;
    slot.state = 'down';
    for (const resolve of slot.pending.values()) resolve(undefined);
    slot.pending.clear();
    this.nodeStats.retire(slot.index);
    slot.markExited();
    if (this.launching !== undefined) {
      this.launching.reject(new ProxyError('STARTUP', `--workers: worker ${slot.index} (pid ${slot.pid}) exited (${signal ?? `code ${code}`}) before it served; its log says why`));
      return;
    }
    if (this.stopping) return;
    const lived = this.opts.clock.now() - slot.startedAt;
    const stable = lived >= (this.opts.stableMs ?? DEFAULT_STABLE_MS);
    if (stable) slot.backoff.reset();
    const delay = stable ? 0 : slot.backoff.next();
    slot.restarts++;
    this.restartsTotal++;
    this.log.error({ worker: slot.index, pid: slot.pid, code, signal, restartInMs: delay }, 'worker exited: its connections are lost, the other workers serve on; starting a replacement');
    slot.restartTimer = setTimeout(() => this.spawn(slot), delay);
  }

  // --- requests -----------------------------------------------------------------------------------

  private requestTimeout(): number {
    return this.opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  }

  private applyDeadline(batch: UnitBatch): number {
    return (this.opts.applyTimeoutMs ?? DEFAULT_APPLY_TIMEOUT_MS) + APPLY_MS_PER_UNIT * (batch.open.length + batch.recreate.length);
  }

  /**
   * Sends a batch. A worker applies batches in order, so one queued behind another (a sync behind a
   * new worker's catch-up of every unit) is due its own deadline after the one before it is due:
   * a worker busy with a long catch-up is not taken for wedged.
   */
  private async sendApply(slot: Slot, batch: UnitBatch): Promise<FromWorker | undefined> {
    const now = this.opts.clock.now();
    const handle = slot.handle;
    slot.appliesDue = Math.max(now, slot.appliesDue) + this.applyDeadline(batch);
    slot.appliesPending++;
    try {
      return await this.request(slot, (id) => ({ t: 'apply', id, batch }), slot.appliesDue - now);
    } finally {
      // None queued any more: the next is due its own deadline from when it is sent.
      if (slot.handle === handle && --slot.appliesPending === 0) slot.appliesDue = 0;
    }
  }

  /**
   * Resolves with the reply, or undefined when the worker is gone or `timeoutMs` passed. A worker
   * that lets the deadline pass is wedged: it is killed (and replaced, as any worker that exits);
   * during shutdown, shutdown() does that itself.
   */
  private request(slot: Slot, make: (id: number) => ToWorker, timeoutMs: number, shorten?: { signal: AbortSignal; ms: number }): Promise<FromWorker | undefined> {
    const handle = slot.handle;
    if (handle === undefined) return Promise.resolve(undefined);
    const id = ++this.nextId;
    const message = make(id);
    return new Promise((resolve) => {
      const expire = (): void => {
        // Timers run before pending I/O is read: after a stall of this process (a large relist,
        // GC, throttling) the reply may be sitting in the channel. One turn of the poll phase
        // delivers it before the worker is judged.
        setImmediate(() => {
          if (!slot.pending.has(id)) return;
          slot.pending.delete(id);
          resolve(undefined);
          if (!this.stopping) this.killUnresponsive(slot, handle, message.t, timeoutMs);
        });
      };
      const due = performance.now() + timeoutMs;
      let timer = setTimeout(expire, timeoutMs);
      // `shorten`: once its signal aborts, the deadline is `ms` from then, if that is sooner.
      const hurry = (): void => {
        clearTimeout(timer);
        timer = setTimeout(expire, Math.min(shorten?.ms ?? 0, Math.max(0, due - performance.now())));
      };
      if (shorten?.signal.aborted === true) hurry();
      else shorten?.signal.addEventListener('abort', hurry, { once: true });
      slot.pending.set(id, (reply) => {
        clearTimeout(timer);
        shorten?.signal.removeEventListener('abort', hurry);
        resolve(reply);
      });
      handle.send(message);
    });
  }

  /**
   * A worker that did not answer in time: SIGKILL (it is our child, by its pid), counted and said;
   * its exit brings the replacement. Marked down at once, so that no sync picks or waits for it
   * meanwhile.
   */
  private killUnresponsive(slot: Slot, handle: WorkerHandle, request: string, deadlineMs: number): void {
    if (slot.handle !== handle || slot.state === 'down') return;
    slot.state = 'down';
    this.unresponsiveTotal++;
    this.log.error({ worker: slot.index, pid: slot.pid, request, deadlineMs }, 'worker did not answer in time (stopped or stuck): killing it; a replacement follows');
    handle.kill('SIGKILL');
  }

  /** The lowest-numbered serving worker, waiting (bounded) when none serves right now. */
  private async firstServing(): Promise<Slot> {
    const ms = this.opts.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
    const deadline = this.opts.clock.now() + ms;
    for (;;) {
      const slot = this.slots.find((s) => s.state === 'ready');
      if (slot !== undefined) return slot;
      const left = deadline - this.opts.clock.now();
      if (this.interrupted) throw new ProxyError('INTERNAL', 'stopping: no worker process serves, and none is waited for any more');
      if (left <= 0 || this.stopping) throw new ProxyError('INTERNAL', `no worker process has served for ${ms} ms (see the workers' log)`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.readyWaiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /**
   * Records the batch as what runs, then sends it to every worker but `except`. Resolves with the
   * answers of those serving; one catching up applies it in order without being waited for.
   */
  private async dispatch(batch: UnitBatch, except: Slot | undefined): Promise<FromWorker[]> {
    this.record(batch);
    const waits: Array<Promise<FromWorker | undefined>> = [];
    for (const slot of this.slots) {
      if (slot === except) continue;
      if (slot.state === 'ready') waits.push(this.sendApply(slot, batch));
      else if (slot.state === 'catching-up') void this.sendApply(slot, batch);
    }
    const replies = await Promise.all(waits);
    return replies.filter((r): r is FromWorker => r !== undefined);
  }

  private merge(replies: FromWorker[]): UnitBatchResult {
    const result: UnitBatchResult = { listenErrors: 0, rebound: 0 };
    let listeners: number | undefined;
    let listenersFailed: number | undefined;
    for (const r of replies) {
      if (r.t === 'failed') throw new ProxyError('INTERNAL', `a worker failed to apply the sync: ${r.message}`);
      if (r.t !== 'applied') continue;
      // The workers run the same units: errors are mostly the same ones, so the most any had.
      result.listenErrors = Math.max(result.listenErrors, r.result.listenErrors);
      result.rebound += r.result.rebound;
      const held = Math.max(result.proxyPortsHeld ?? 0, r.result.proxyPortsHeld ?? 0);
      if (held > 0) result.proxyPortsHeld = held;
      listeners ??= r.listeners;
      listenersFailed ??= r.listenersFailed;
    }
    if (listeners !== undefined) this.listeners = listeners;
    if (listenersFailed !== undefined) this.listenersFailed = listenersFailed;
    return result;
  }

  private record(batch: UnitBatch): void {
    for (const id of batch.close) {
      this.records.delete(id);
      this.pendingPorts.delete(id);
    }
    for (const o of [...batch.recreate, ...batch.open]) {
      const wants = needsProxyPort(o);
      this.records.set(o.unit.id, { open: o, proxyPort: wants ? (o.proxyPort ?? 0) : undefined });
      if (wants && !o.proxyPort) this.pendingPorts.add(o.unit.id);
      else this.pendingPorts.delete(o.unit.id);
    }
    for (const u of batch.update) {
      const r = this.records.get(u.id);
      if (r !== undefined) r.open = { ...r.open, unit: u };
    }
    for (const { id, port } of batch.proxyPorts ?? []) {
      const r = this.records.get(id);
      if (r === undefined) continue;
      r.proxyPort = port;
      this.pendingPorts.delete(id);
    }
  }

  /**
   * The batch for the worker that binds the proxy ports: told to choose one for every running unit
   * still without (port 0), whichever worker failed to bind it before. The worker that failed may
   * have been replaced since, and a replacement (or a sibling that leads now) was given port 0 as
   * "none yet": without this, no worker would ever choose.
   */
  private forLead(batch: UnitBatch): UnitBatch {
    const opened = new Set([...batch.open, ...batch.recreate].map((o) => o.unit.id));
    const choose = [...this.pendingPorts].filter((id) => !opened.has(id)).map((id) => ({ id, port: 0 }));
    return choose.length === 0 ? batch : { ...batch, proxyPorts: [...(batch.proxyPorts ?? []), ...choose] };
  }

  /** Every running unit, with the proxy port every worker binds. */
  private snapshot(): UnitBatch {
    const open: UnitOpen[] = [];
    for (const r of this.records.values()) open.push(r.proxyPort === undefined ? { unit: r.open.unit, listen: r.open.listen } : { unit: r.open.unit, listen: r.open.listen, proxyPort: r.proxyPort });
    return { close: [], recreate: [], open, update: [] };
  }

  /** A report of the slot's current process; one older than what was taken in already is stale. */
  private takeReport(slot: Slot, report: WorkerReport): void {
    if (report.round <= slot.acked) return;
    slot.acked = report.round;
    this.nodeStats.update(slot.index, report);
  }

  /**
   * One report from every worker that serves or catches up; concurrent callers of the same kind
   * share it. `kernel`: each worker reads the kernel's counters first (for a scrape).
   */
  private collect(kernel: boolean): Promise<void> {
    let under = this.collecting.get(kernel);
    if (under !== undefined) return under;
    under = (async () => {
      const live = this.slots.filter((s) => s.state === 'ready' || s.state === 'catching-up');
      await Promise.all(live.map(async (slot) => {
        const handle = slot.handle;
        const reply = await this.request(slot, (id) => ({ t: 'report', id, ack: slot.acked, kernel }), this.requestTimeout());
        if (reply?.t === 'report' && slot.handle === handle) this.takeReport(slot, reply.report);
      }));
    })().finally(() => {
      this.collecting.delete(kernel);
    });
    this.collecting.set(kernel, under);
    return under;
  }
}

/** The batch for the workers after the first: the proxy ports it bound, fixed. */
function withProxyPorts(batch: UnitBatch, bound: readonly UnitProxyPort[]): UnitBatch {
  const byId = new Map(bound.map((p) => [p.id, p.port]));
  const fix = (o: UnitOpen): UnitOpen => (needsProxyPort(o) ? { unit: o.unit, listen: o.listen, proxyPort: byId.get(o.unit.id) ?? 0 } : o);
  const opened = new Set([...batch.open, ...batch.recreate].map((o) => o.unit.id));
  const rebound = bound.filter((p) => !opened.has(p.id));
  const out: UnitBatch = { close: batch.close, recreate: batch.recreate.map(fix), open: batch.open.map(fix), update: batch.update };
  const proxyPorts = [...(batch.proxyPorts ?? []), ...rebound];
  if (proxyPorts.length > 0) out.proxyPorts = proxyPorts;
  return out;
}

/**
 * One line per unit over the workers: the first worker's, with connections open and held summed,
 * every worker's errors, and the endpoints any worker's passive health set aside (each worker
 * judges the connections it dials), until the latest.
 */
export function mergeStatus(views: ReadonlyArray<{ worker: number; status: readonly UnitStatus[] }>): UnitStatus[] {
  const byName = new Map<string, { status: UnitStatus; errors: Map<string, number[]>; setAside: Map<string, string> }>();
  for (const { worker, status } of views) {
    for (const s of status) {
      let m = byName.get(s.name);
      if (m === undefined) {
        m = { status: { ...s, active: 0, held: 0, errors: [] }, errors: new Map(), setAside: new Map() };
        byName.set(s.name, m);
      }
      m.status.active += s.active;
      m.status.held += s.held;
      for (const e of s.errors) m.errors.set(e, [...(m.errors.get(e) ?? []), worker]);
      for (const { endpoint, until } of s.setAside) if (until > (m.setAside.get(endpoint) ?? '')) m.setAside.set(endpoint, until);
    }
  }
  const out: UnitStatus[] = [];
  for (const { status, errors, setAside } of byName.values()) {
    // An error every worker has is the unit's; one only some have says which.
    for (const [e, workers] of errors) status.errors.push(workers.length === views.length ? e : `worker ${workers.join(', ')}: ${e}`);
    status.setAside = [...setAside].map(([endpoint, until]) => ({ endpoint, until }));
    out.push(status);
  }
  return out.sort((a, b) => a.name.localeCompare(b.name));
}
