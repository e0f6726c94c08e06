import { needPodsEvent, splitServicePortKey } from '../../core/need-pods-event.js';
import { RateLimiter } from '../../core/rate-limiter.js';
import type { Logger } from '../../seams/logger.js';

/** The one API call the recorder makes (HttpKubeApi.post). */
export interface EventPoster {
  post(path: string, body: unknown, signal: AbortSignal): Promise<unknown>;
}

export interface EventRecorderOptions {
  api: EventPoster;
  logger: Logger;
  /** This node's name. */
  node: string;
  /** The Service's uid from what the proxy watches, when it has it. */
  serviceUid?: (namespace: string, name: string) => string | undefined;
  /** Wall time, for the Event's timestamps. */
  now?: () => number;
  /** A Service gets at most one Event this often, however short its hold episodes (default 10 s). */
  minIntervalMs?: number;
  /** Events being posted at once; past it one is dropped with a warning (default 16). */
  maxInFlight?: number;
}

/**
 * Posts `NeedPods` Events (--emit-events). Fire and forget: the data path calls needPods() and
 * goes on; a failure is a rate-limited warning, never retried (the next hold episode posts again).
 * Bounded twice, so that a flood of short holds cannot become a flood of API calls: per Service by
 * a minimum interval, and overall by the number of posts in flight.
 */
export class EventRecorder {
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly minIntervalMs: number;
  private readonly maxInFlight: number;
  private readonly lastPosted = new Map<string, number>();
  private inFlight = 0;
  private readonly warnings: RateLimiter;
  private readonly abort = new AbortController();

  constructor(private readonly opts: EventRecorderOptions) {
    this.log = opts.logger.child({ component: 'events' });
    this.now = opts.now ?? Date.now;
    this.minIntervalMs = opts.minIntervalMs ?? 10_000;
    this.maxInFlight = opts.maxInFlight ?? 16;
    this.warnings = new RateLimiter(10_000, this.now);
  }

  /** A hold episode began on `servicePort` (`ns/name:port`). */
  needPods(servicePort: string): void {
    const sp = splitServicePortKey(servicePort);
    if (sp === undefined || this.abort.signal.aborted) return;
    const service = `${sp.namespace}/${sp.name}`;
    const now = this.now();
    const last = this.lastPosted.get(service);
    if (last !== undefined && now - last < this.minIntervalMs) return;
    if (this.inFlight >= this.maxInFlight) {
      this.warn({ service }, 'too many Events being posted: NeedPods dropped');
      return;
    }
    this.lastPosted.set(service, now);
    this.forgetOld(now);
    const uid = this.opts.serviceUid?.(sp.namespace, sp.name);
    const body = needPodsEvent({ ...sp, ...(uid ? { uid } : {}), node: this.opts.node, time: new Date(now).toISOString() });
    this.inFlight++;
    this.opts.api.post(`/api/v1/namespaces/${encodeURIComponent(sp.namespace)}/events`, body, this.abort.signal).then(
      () => {
        this.inFlight--;
        this.log.debug({ service, servicePort }, 'posted NeedPods Event');
      },
      (err: unknown) => {
        this.inFlight--;
        if (!this.abort.signal.aborted) this.warn({ err, service }, 'cannot post a NeedPods Event (RBAC: create on events?)');
      },
    );
  }

  /** Abandons posts in flight (shutdown). */
  stop(): void {
    this.abort.abort(new Error('stopped'));
  }

  /** The interval map keeps only Services posted for recently. */
  private forgetOld(now: number): void {
    if (this.lastPosted.size < 1024) return;
    for (const [service, at] of this.lastPosted) if (now - at >= this.minIntervalMs) this.lastPosted.delete(service);
  }

  private warn(bindings: object, msg: string): void {
    const held = this.warnings.take();
    if (held !== undefined) this.log.warn({ ...bindings, suppressed: held }, msg);
  }
}
