import type { KubernetesObject } from '@kubernetes/client-node';
import type { RandomSource } from '../../core/clock.js';
import { errnoCode } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';
import { isRecord, KubeApiError, statusError, type KubeApi, type WatchEvent } from './api-client.js';
import { Backoff, type BackoffOptions } from '../../core/backoff.js';

/**
 * List, then watch from the list's resourceVersion, for one resource (client-go's Reflector):
 *
 * - A watch that ends (the server's timeoutSeconds, a dropped connection) is resumed from the
 *   last resourceVersion seen, BOOKMARKs included, without a new list.
 * - `410 Gone` (an ERROR event or an HTTP status: the resourceVersion was compacted away) is
 *   answered with a new list, which replaces everything handed out before: deletions missed
 *   while disconnected are applied that way.
 * - Any other failure (refused, timed out, 5xx, garbage) waits a capped exponential backoff with
 *   jitter and tries again. Nothing is dropped meanwhile: the handlers keep what they had, so the
 *   proxy keeps serving the last good state.
 *
 * Lists are consistent reads (no resourceVersion) in pages of `pageSize`.
 */

export interface ReflectorHandlers<T> {
  /** A complete list: exactly these objects exist now. */
  replace(items: T[]): void;
  /** ADDED or MODIFIED. */
  upsert(obj: T): void;
  /** DELETED: the object as it was last. */
  remove(obj: T): void;
}

export interface ReflectorOptions<T> {
  /** For logs, e.g. `services`. */
  name: string;
  api: KubeApi;
  /** The collection's path, e.g. `/api/v1/services`. */
  path: string;
  labelSelector?: string;
  fieldSelector?: string;
  handlers: ReflectorHandlers<T>;
  logger: Logger;
  backoff?: Partial<BackoffOptions>;
  random?: RandomSource;
  /** Items per list page; default 500, as client-go's pager. */
  pageSize?: number;
  /** The watch's timeoutSeconds; default 5 to 10 minutes, random per watch (client-go). */
  watchTimeoutSeconds?: () => number;
  /** A watch may stay silent this long past its timeoutSeconds before it is taken for dead; default 30 s. */
  watchGraceMs?: number;
  /** The namespace the path is scoped to, when it is: named in a 403's line. */
  namespace?: string;
  /** What a 403 means and how to mend it, said after the line naming the verb, resource and namespace. */
  forbiddenHint?: string;
  /**
   * A 403 on the first list resolves `synced` as if the list were empty (and keeps retrying):
   * the proxy serves what it may read rather than wait for a grant that may never come.
   */
  forbiddenIsEmpty?: boolean;
}

/** Counters, for tests and metrics. */
export interface ReflectorStats {
  lists: number;
  watches: number;
  /** Lists forced by 410 Gone. */
  expired: number;
  failures: number;
}

/** Pages per list before giving up: a server that hands out continue tokens forever is broken. */
const MAX_PAGES = 100_000;
/** A watch that ends sooner than this without an event is a failure, not a timeout (client-go). */
const SHORT_WATCH_MS = 1000;

type Outcome = 'ended' | 'short';

export class Reflector<T extends KubernetesObject> {
  /** Resolves once the first complete list has been handed to `replace`. */
  readonly synced: Promise<void>;
  readonly stats: ReflectorStats = { lists: 0, watches: 0, expired: 0, failures: 0 };
  private resolveSynced: () => void = () => {};
  private readonly log: Logger;
  private readonly backoff: Backoff;
  private readonly random: RandomSource;
  private rv = '';
  private needList = true;
  private stopped = true;
  private loop: Promise<void> | undefined;
  /** Aborts the request or the sleep in progress. */
  private current: AbortController | undefined;
  private lastError: string | undefined;

  constructor(private readonly opts: ReflectorOptions<T>) {
    this.log = opts.logger.child({ component: 'reflector', resource: opts.name });
    this.random = opts.random ?? Math.random;
    this.backoff = new Backoff(opts.backoff ?? {}, this.random);
    this.synced = new Promise((resolve) => {
      this.resolveSynced = resolve;
    });
  }

  /** The resourceVersion the next watch resumes from ('' before the first list). */
  get resourceVersion(): string {
    return this.rv;
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.loop = this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.current?.abort(new Interrupted());
    await this.loop;
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      try {
        if (this.needList) await this.list();
        const outcome = await this.watchOnce();
        if (outcome === 'short') {
          // A server that ends every watch at once would otherwise be asked again in a tight loop.
          await this.sleep(this.failed(new KubeApiError(`watch ${this.opts.path}: ended at once without an event`, 'Network')));
        } else {
          // A watch that lived (quiet ones too: Services can go minutes without an event) ends a
          // streak of failures as an event does; one refused at once (a 410 loop) does not.
          this.recovered();
        }
      } catch (err) {
        if (this.stopped) break;
        await this.sleep(this.failed(err));
      }
    }
  }

  private async list(): Promise<void> {
    const items: T[] = [];
    let cont: string | undefined;
    let rv = '';
    for (let page = 0; page < MAX_PAGES; page++) {
      const body = await this.opts.api.get(this.opts.path, this.query({ limit: String(this.opts.pageSize ?? 500), continue: cont }), this.abortable());
      if (!isRecord(body) || !Array.isArray(body.items) || !isRecord(body.metadata)) {
        throw new KubeApiError(`list ${this.opts.path}: the answer is not a list`, 'BadResponse');
      }
      items.push(...(body.items as T[]));
      rv = typeof body.metadata.resourceVersion === 'string' ? body.metadata.resourceVersion : '';
      cont = typeof body.metadata.continue === 'string' && body.metadata.continue !== '' ? body.metadata.continue : undefined;
      if (cont === undefined) break;
    }
    if (cont !== undefined) throw new KubeApiError(`list ${this.opts.path}: more than ${MAX_PAGES} pages`, 'BadResponse');
    if (this.stopped) return;
    this.opts.handlers.replace(items);
    this.rv = rv;
    this.needList = false;
    this.stats.lists++;
    // Reachable, but the backoff is reset only by a watch event: a list that succeeds between
    // two 410s (a watch refused however fresh its resourceVersion) must not make the next
    // re-list immediate, or list and watch would alternate without pause.
    this.reachable();
    if (this.stats.lists === 1) this.log.info({ objects: items.length, resourceVersion: rv }, `listed ${this.opts.name}`);
    else this.log.debug({ objects: items.length, resourceVersion: rv }, `re-listed ${this.opts.name}`);
    this.resolveSynced();
  }

  private async watchOnce(): Promise<Outcome> {
    const timeoutSeconds = this.opts.watchTimeoutSeconds?.() ?? Math.floor(300 * (1 + this.random()));
    const started = performance.now();
    let events = 0;
    this.stats.watches++;
    const onEvent = (ev: WatchEvent): void => {
      // An ERROR event is no sign of recovery: a server answering every watch with one must
      // still meet a growing backoff.
      if (ev.type !== 'ERROR' && events++ === 0) this.recovered();
      this.handle(ev);
    };
    const query = this.query({ watch: 'true', resourceVersion: this.rv, allowWatchBookmarks: 'true', timeoutSeconds: String(timeoutSeconds) });
    await this.opts.api.watch(this.opts.path, query, {
      onEvent,
      // Reachable again; the backoff is reset only by an event, so that a server that opens
      // watches and closes them at once still meets a growing delay.
      onOpen: () => this.reachable(),
      signal: this.abortable(),
      idleTimeoutMs: timeoutSeconds * 1000 + (this.opts.watchGraceMs ?? 30_000),
    });
    return events === 0 && performance.now() - started < SHORT_WATCH_MS ? 'short' : 'ended';
  }

  private handle(ev: WatchEvent): void {
    const obj = ev.object;
    if (ev.type === 'ERROR') throw statusError(obj, `watch ${this.opts.path}`);
    if (!isRecord(obj)) throw new KubeApiError(`watch ${this.opts.path}: a ${ev.type} event without an object`, 'BadResponse');
    try {
      switch (ev.type) {
        case 'ADDED':
        case 'MODIFIED':
          this.opts.handlers.upsert(obj as T);
          break;
        case 'DELETED':
          this.opts.handlers.remove(obj as T);
          break;
        case 'BOOKMARK':
          break;
        default:
          this.log.warn({ type: ev.type }, `watch ${this.opts.path}: unknown event type ignored`);
      }
    } catch (err) {
      // A bug downstream, not bad input (the sink validates): keep the stack, skip the event
      // rather than replay it forever.
      this.log.error({ err, type: ev.type }, `applying a ${this.opts.name} watch event failed; skipped`);
    }
    const meta = obj.metadata;
    if (isRecord(meta) && typeof meta.resourceVersion === 'string' && meta.resourceVersion !== '') this.rv = meta.resourceVersion;
  }

  /** Logs the failure (the first of a streak loudly, repeats quietly) and returns the delay before the next try. */
  private failed(err: unknown): number {
    this.stats.failures++;
    if (err instanceof KubeApiError && err.expired) {
      // Compacted away: the next attempt lists. Once at once; repeatedly, with backoff.
      this.stats.expired++;
      this.needList = true;
      this.log.info({ resourceVersion: this.rv }, `${this.opts.name}: resourceVersion ${this.rv} expired (410 Gone); listing again`);
      const first = this.backoff.failures === 0;
      const delay = this.backoff.next();
      return first ? 0 : delay;
    }
    const delay = this.backoff.next();
    const message = err instanceof Error ? err.message : String(err);
    const bindings = { err: err instanceof KubeApiError ? { message, failure: err.failure, status: err.status } : err, retryInMs: delay };
    const verb = this.needList ? 'list' : 'watch';
    // RBAC's answer is the user's to act on: one line naming exactly what is missing.
    const text = err instanceof KubeApiError && err.status === 403
      ? `forbidden: cannot ${verb} ${this.opts.name} ${this.opts.namespace !== undefined ? `in namespace ${this.opts.namespace}` : 'cluster-wide'}${this.opts.forbiddenHint ? `: ${this.opts.forbiddenHint}` : ''}`
      : `${verb} of ${this.opts.name} failed; serving the last good state, retrying with backoff`;
    const kind = errorKind(err);
    if (kind === 'Status:403' && this.opts.forbiddenIsEmpty && this.stats.lists === 0) this.resolveSynced();
    if (this.lastError === undefined || (this.lastError !== kind && kind === 'Status:403')) this.log.warn(bindings, text);
    else if (this.lastError !== kind) this.log.info(bindings, text);
    else this.log.debug(bindings, text);
    this.lastError = kind;
    return delay;
  }

  private recovered(): void {
    this.reachable();
    this.backoff.reset();
  }

  /** Ends a streak of failures in the log (`lastError` is set while one lasts). */
  private reachable(): void {
    if (this.lastError !== undefined) this.log.info({ failures: this.backoff.failures }, `${this.opts.name}: API reachable again`);
    this.lastError = undefined;
  }

  private query(extra: Record<string, string | undefined>): Record<string, string | undefined> {
    return { labelSelector: this.opts.labelSelector, fieldSelector: this.opts.fieldSelector, ...extra };
  }

  private abortable(): AbortSignal {
    this.current = new AbortController();
    if (this.stopped) this.current.abort(new Interrupted());
    return this.current.signal;
  }

  private sleep(ms: number): Promise<void> {
    if (ms <= 0 || this.stopped) return Promise.resolve();
    const signal = this.abortable();
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        signal.removeEventListener('abort', done);
        resolve();
      }
      signal.addEventListener('abort', done);
    });
  }
}

/** What kind of failure, for telling a repeat from a change: `Network:ECONNREFUSED`, `Status:503`... */
function errorKind(err: unknown): string {
  if (err instanceof KubeApiError) return `${err.failure}:${err.status ?? errnoCode(err.cause) ?? ''}`;
  return err instanceof Error ? err.name : typeof err;
}

/** The reflector cut its own request or sleep short: it is stopping. */
class Interrupted extends Error {
  constructor() {
    super('interrupted: stop');
    this.name = 'Interrupted';
  }
}
