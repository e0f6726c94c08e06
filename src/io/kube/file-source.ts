import { watch, watchFile, unwatchFile, type FSWatcher, type Stats } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { performance } from 'node:perf_hooks';
import { dirname } from 'node:path';
import type { StateSink } from '../../seams/state-sink.js';
import { problemString, type ObjectProblem } from '../../core/model.js';
import { errnoCode } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';
import { startsLikeJson } from './json-list-scan.js';
import { ManifestReader, type ManifestChange } from './manifest-reader.js';

/**
 * Services and EndpointSlices from a file (see manifest.ts for what it may hold), re-read when
 * it changes. A successful read brings the state in line with the file: a JSON list edited in
 * its items passes on only the objects that changed (manifest-reader.ts), anything else replaces
 * the whole state. A read that fails (missing file, syntax error) changes nothing, so the last
 * good state stays in force.
 *
 * Two watchers, because neither is enough alone:
 * - fs.watch on the directory, not the file: editors save by writing a temporary file and
 *   renaming it over the original, and a watch on the old inode would go quiet after the first
 *   save. Any event in the directory triggers a read, because a ConfigMap volume swaps a
 *   `..data` symlink and never touches the file's own name.
 * - fs.watchFile polling, for filesystems where inotify says nothing (NFS, some overlay mounts)
 *   and for a directory that does not exist yet.
 * Reads are serialized and identical content is not applied twice, so the two watchers firing
 * for one edit cost one apply and at most one log line.
 *
 * When to read: soon after an event (settleMs gathers the events of one save), because an edit
 * should reach connections within a few milliseconds. But a file being written in place may be
 * read half-written. Half a JSON document never parses, so JSON that parses is applied at once;
 * anything else (YAML, whose prefix may well parse, an empty file, JSON that does not parse yet)
 * is taken as final only after debounceMs without events. A parse error is reported only then.
 */

export interface FileSourceOptions {
  path: string;
  logger: Logger;
  /** Quiet time after the last event before text that might be half-written is taken as final; default 100. */
  debounceMs?: number;
  /** Time from an event to the read, gathering the events of one save; default 5. */
  settleMs?: number;
  /** fs.watchFile interval; default 1000. */
  pollIntervalMs?: number;
  /**
   * After a whole read, how long to wait before indexing it for fast edits (manifest-reader.ts);
   * default 3000, past the first sync, so start-up does not wait for it.
   */
  indexAfterMs?: number;
}

export class FileSource {
  /** Resolves after the first read, whether it applied state or failed. */
  readonly synced: Promise<void>;
  private resolveSynced: () => void = () => {};
  private readonly path: string;
  private readonly log: Logger;
  private readonly debounceMs: number;
  private readonly settleMs: number;
  private readonly pollIntervalMs: number;
  private readonly indexAfterMs: number;
  private readonly reader: ManifestReader;
  private indexTimer: NodeJS.Timeout | undefined;
  private sink: StateSink | undefined;
  private dirWatcher: FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private loading: Promise<void> | undefined;
  private reloadAgain = false;
  private stopped = false;
  /**
   * Set once the first read has been judged. That read is taken as final whatever the watchers
   * saw meanwhile (a sibling file of a ConfigMap volume, an editor's swap file): it is what
   * `synced` promises, and the proxier programs nothing until then.
   */
  private started = false;
  /** performance.now() of the last watcher event. */
  private lastEventAt = -Infinity;
  /** Content that failed to parse and was reported: not parsed or reported again. */
  private failed: Buffer | undefined;
  private lastFailure: string | undefined;
  private loadedOnce = false;
  private reportedProblems = new Set<string>();
  private readonly onPoll = (curr: Stats, prev: Stats): void => {
    if (curr.mtimeMs !== prev.mtimeMs || curr.ino !== prev.ino || curr.size !== prev.size) this.onEvent();
  };

  constructor(opts: FileSourceOptions) {
    this.path = opts.path;
    this.log = opts.logger;
    this.debounceMs = opts.debounceMs ?? 100;
    this.settleMs = opts.settleMs ?? 5;
    this.pollIntervalMs = opts.pollIntervalMs ?? 1000;
    this.indexAfterMs = opts.indexAfterMs ?? 3000;
    this.reader = new ManifestReader(opts.path);
    this.synced = new Promise((resolve) => {
      this.resolveSynced = resolve;
    });
  }

  /** Reads and applies once, then keeps watching. Watchers are armed first so no edit slips between. */
  async start(sink: StateSink): Promise<void> {
    this.sink = sink;
    this.armDirWatcher();
    watchFile(this.path, { persistent: true, interval: this.pollIntervalMs }, this.onPoll);
    await this.runLoad();
    this.started = true;
    this.resolveSynced();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.indexTimer) clearTimeout(this.indexTimer);
    this.dirWatcher?.close();
    this.dirWatcher = undefined;
    unwatchFile(this.path, this.onPoll);
    await this.loading;
  }

  private armDirWatcher(): void {
    if (this.dirWatcher || this.stopped) return;
    try {
      const w = watch(dirname(this.path), { persistent: true }, () => this.onEvent());
      // The directory went away (or the watch broke): drop it; the poller notices the file's
      // return and the next read re-arms.
      w.on('error', () => {
        w.close();
        if (this.dirWatcher === w) this.dirWatcher = undefined;
      });
      this.dirWatcher = w;
    } catch (err) {
      // Most likely the directory does not exist yet; polling covers it meanwhile.
      this.log.debug({ file: this.path, err }, 'cannot watch the state file directory yet; polling');
    }
  }

  private onEvent(): void {
    this.lastEventAt = performance.now();
    this.readIn(this.settleMs);
  }

  /** A read `ms` from now, replacing any read already planned. */
  private readIn(ms: number): void {
    if (this.stopped) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.runLoad();
    }, ms);
  }

  /** One read at a time; an event during a read asks for one more read after it. */
  private runLoad(): Promise<void> {
    if (this.loading) {
      this.reloadAgain = true;
      return this.loading;
    }
    this.loading = this.load().finally(() => {
      this.loading = undefined;
      if (this.reloadAgain) {
        this.reloadAgain = false;
        this.readIn(0);
      }
    });
    return this.loading;
  }

  private async load(): Promise<void> {
    this.armDirWatcher();
    const buf = await this.read();
    if (buf === undefined || this.stopped || this.failed?.equals(buf)) return;
    // Milliseconds until the file has been quiet for debounceMs (<= 0: it has).
    const unquietMs = this.started ? this.debounceMs - (performance.now() - this.lastEventAt) : 0;
    if (unquietMs > 0 && !startsLikeJson(buf)) return this.readWhenQuiet(unquietMs, 'not JSON');
    let change: ManifestChange | undefined;
    try {
      change = this.reader.read(buf);
    } catch (err) {
      if (unquietMs > 0) return this.readWhenQuiet(unquietMs, 'does not parse');
      this.failed = buf;
      // err.message names the file, line and column: one line, and the last good state stays.
      this.log.error({ file: this.path, err }, `${(err as Error).message}; keeping the last good state`);
      return;
    }
    this.failed = undefined;
    if (change !== undefined) this.apply(change);
  }

  /** The file may be half-written: look again once it has been quiet. */
  private readWhenQuiet(ms: number, why: string): void {
    this.log.debug({ file: this.path, why, inMs: Math.ceil(ms) }, 'state file changed moments ago and may be half-written; reading it again when quiet');
    this.readIn(ms);
  }

  /** The file's content, or undefined when it cannot be read (reported once per kind of failure). */
  private async read(): Promise<Buffer | undefined> {
    try {
      const buf = await readFile(this.path);
      this.lastFailure = undefined;
      return buf;
    } catch (err) {
      const code = errnoCode(err) ?? 'unknown';
      // Forget the content, so the file coming back as it was is applied (and reported) again.
      this.reader.reset();
      this.failed = undefined;
      if (this.lastFailure === code) return undefined;
      this.lastFailure = code;
      if (code === 'ENOENT') {
        const what = this.loadedOnce ? 'state file disappeared; keeping the last good state' : 'state file not found';
        this.log.error({ file: this.path }, `${this.path}: ${what}; waiting for it to appear`);
      } else {
        this.log.error({ file: this.path, err }, `${this.path}: cannot read the state file; keeping the last good state`);
      }
      return undefined;
    }
  }

  private apply(change: ManifestChange): void {
    const sink = this.sink;
    if (!sink) return;
    let counts: { services: number; endpointSlices: number };
    try {
      if (change.kind === 'full') {
        const m = change.manifest;
        this.reportProblems(m.problems);
        sink.replaceServices(m.services);
        sink.replaceEndpointSlices(m.endpointSlices);
        counts = { services: m.services.length, endpointSlices: m.endpointSlices.length };
      } else {
        this.reportProblems(change.problems);
        for (const s of change.upsertServices) sink.upsertService(s);
        for (const s of change.upsertEndpointSlices) sink.upsertEndpointSlice(s);
        for (const k of change.deleteEndpointSlices) sink.deleteEndpointSlice(k.namespace, k.name);
        for (const k of change.deleteServices) sink.deleteService(k.namespace, k.name);
        counts = { services: change.services, endpointSlices: change.endpointSlices };
      }
    } catch (err) {
      // A bug in the sink, not bad input: keep its stack, and read the file whole next time.
      this.reader.reset();
      this.log.error({ file: this.path, err }, 'applying the state file failed');
      return;
    }
    this.loadedOnce = true;
    if (change.kind === 'full') {
      if (this.indexTimer) clearTimeout(this.indexTimer);
      this.indexTimer = setTimeout(() => this.reader.prepare(), this.indexAfterMs).unref();
    }
    const changed = change.kind === 'full' ? 'all' : change.upsertServices.length + change.upsertEndpointSlices.length + change.deleteServices.length + change.deleteEndpointSlices.length;
    this.log.info({ file: this.path, ...counts, changed }, 'loaded state file');
  }

  /** Ignored objects are reported when they first appear, not on every re-read of the file. */
  private reportProblems(problems: readonly ObjectProblem[]): void {
    const now = new Set<string>();
    for (const p of problems) {
      const s = problemString(p);
      if (!this.reportedProblems.has(s) && !now.has(s)) this.log.warn({ file: this.path, object: p.object, field: p.field }, s);
      now.add(s);
    }
    this.reportedProblems = now;
  }
}
