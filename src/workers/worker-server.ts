import { StatsReporter, type WorkerReport } from '../core/worker-stats.js';
import type { AffinityShare } from '../seams/affinity-share.js';
import type { Logger } from '../seams/logger.js';
import type { UnitSet } from '../seams/unit-set.js';
import type { FromWorker, ToWorker, WorkerChannel } from '../seams/workers.js';

export interface WorkerServerOptions {
  channel: WorkerChannel;
  /** This worker's units: real sockets bound with SO_REUSEPORT. */
  units: UnitSet & AffinityShare;
  logger: Logger;
  /**
   * Counters the kernel keeps (UDP receive-buffer drops), brought up to date before a report the
   * controller asks them for (a scrape's, and the last one at shutdown); the periodic reports skip it.
   */
  refreshCounters?: () => Promise<void>;
  /** Ends the process once the shutdown reply is out. */
  exit(code: number): void;
  /** How long sticky news may wait to be batched before it goes to the siblings (default 10 ms). */
  stickyFlushMs?: number;
}

const DEFAULT_STICKY_FLUSH_MS = 10;

/**
 * The worker's end of the channel: applies what the controller sends to its own unit set and
 * answers. Batches and sticky merges are handled one at a time, in the order they came (a merge
 * must find the units the batch before it opened); reports and status are answered at once.
 */
export class WorkerServer {
  private readonly log: Logger;
  private queue: Promise<void> = Promise.resolve();
  private reports: Promise<void> = Promise.resolve();
  private readonly reporter = new StatsReporter();
  private stickyTimer: NodeJS.Timeout | undefined;
  private stopping = false;
  /** Aborted by the controller's endGrace: the drain under way ends now. */
  private readonly endGrace = new AbortController();

  constructor(private readonly opts: WorkerServerOptions) {
    this.log = opts.logger.child({ component: 'worker' });
    opts.channel.onMessage((m) => this.receive(m));
  }

  /** The controller may send now. */
  ready(): void {
    this.opts.channel.send({ t: 'ready' });
  }

  /** A balancer has sticky news: send it to the siblings shortly, batched. */
  stickyChanged(): void {
    if (this.stickyTimer !== undefined || this.stopping) return;
    this.stickyTimer = setTimeout(() => {
      this.stickyTimer = undefined;
      const updates = this.opts.units.takeStickyUpdates();
      if (updates.length > 0) this.send({ t: 'sticky', updates });
    }, this.opts.stickyFlushMs ?? DEFAULT_STICKY_FLUSH_MS);
  }

  private receive(m: ToWorker): void {
    switch (m.t) {
      case 'report':
        // One at a time, each sent before the next is taken: a report is what changed since the last acknowledged.
        this.reports = this.reports.then(() => this.run(m.id, async () => ({ t: 'report', id: m.id, report: await this.report(m.ack, m.kernel) })));
        return;
      case 'status':
        this.answer(m.id, async () => ({ t: 'status', id: m.id, status: this.opts.units.status() }));
        return;
      case 'stickyDump':
        this.answer(m.id, async () => ({ t: 'stickyDump', id: m.id, updates: this.opts.units.stickyEntries() }));
        return;
      case 'apply':
        this.inOrder(m.id, async () => {
          const result = await this.opts.units.apply(m.batch);
          return { t: 'applied', id: m.id, result, listeners: this.opts.units.listenerCount(), listenersFailed: this.opts.units.failedListenerCount() };
        });
        return;
      case 'sticky':
        this.inOrder(undefined, async () => {
          this.opts.units.mergeSticky(m.updates);
          return undefined;
        });
        return;
      case 'start':
        this.inOrder(undefined, async () => {
          this.opts.units.start();
          return undefined;
        });
        return;
      case 'shutdown':
        this.inOrder(m.id, async () => this.shutdown(m.id, m.graceMs, m.ack, m.handOver === true));
        return;
      case 'endGrace':
        // Not in order: the shutdown it ends is the request under way.
        this.endGrace.abort();
        return;
    }
  }

  private async report(ack: number, kernel: boolean): Promise<WorkerReport> {
    if (kernel) await this.opts.refreshCounters?.();
    const live = this.opts.units.stats().map(({ unit, stats }) => ({ labels: { servicePort: unit.servicePort, protocol: unit.protocol, scope: unit.scope }, stats }));
    return this.reporter.report(live, this.opts.units.activeConnections(), ack);
  }

  private async shutdown(id: number, graceMs: number, ack: number, handOver: boolean): Promise<undefined> {
    this.stopping = true;
    if (this.stickyTimer !== undefined) clearTimeout(this.stickyTimer);
    const { cut } = await this.opts.units.shutdown(graceMs, { endGrace: this.endGrace.signal, ...(handOver ? { handOver } : {}) });
    // The connections have ended: their bytes are counted now, and reported before the process goes.
    const report = await this.report(ack, true);
    this.log.info({ cut }, 'worker drained');
    this.opts.channel.send({ t: 'shutdown', id, cut, report }, () => this.opts.exit(0));
    return undefined;
  }

  private inOrder(id: number | undefined, handle: () => Promise<FromWorker | undefined>): void {
    this.queue = this.queue.then(() => this.run(id, handle));
  }

  private answer(id: number, handle: () => Promise<FromWorker>): void {
    void this.run(id, handle);
  }

  /** Never rejects: a failure is logged and, for a request, answered as such. */
  private async run(id: number | undefined, handle: () => Promise<FromWorker | undefined>): Promise<void> {
    try {
      const reply = await handle();
      if (reply !== undefined) this.send(reply);
    } catch (err) {
      this.log.error({ err }, 'bug: handling a message from the controller failed');
      if (id !== undefined) this.send({ t: 'failed', id, message: err instanceof Error ? err.message : String(err) });
    }
  }

  private send(m: FromWorker): void {
    this.opts.channel.send(m);
  }
}
