import { watch, watchFile, unwatchFile, type FSWatcher, type Stats } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { StateSink } from '../../core/state-cache.js';
import { problemString } from '../../core/model.js';
import { errnoCode } from '../../errors.js';
import type { Logger } from '../../log.js';
import { parseManifest, type Manifest } from './manifest.js';

/**
 * Services and EndpointSlices from a file (see manifest.ts for what it may hold), re-read when
 * it changes. Every successful read replaces the whole state; a read that fails (missing file,
 * syntax error) changes nothing, so the last good state stays in force.
 *
 * Two watchers, because neither is enough alone:
 * - fs.watch on the directory, not the file: editors save by writing a temporary file and
 *   renaming it over the original, and a watch on the old inode would go quiet after the first
 *   save. Any event in the directory triggers a read, because a ConfigMap volume swaps a
 *   `..data` symlink and never touches the file's own name.
 * - fs.watchFile polling, for filesystems where inotify says nothing (NFS, some overlay mounts)
 *   and for a directory that does not exist yet.
 * Events are debounced, reads are serialized, and identical content is not applied twice, so the
 * two watchers firing for one edit cost one apply and at most one log line.
 */

export interface FileSourceOptions {
  path: string;
  logger: Logger;
  /** Quiet time after the last event before reading; default 100. */
  debounceMs?: number;
  /** fs.watchFile interval; default 1000. */
  pollIntervalMs?: number;
}

export class FileSource {
  /** Resolves after the first read, whether it applied state or failed. */
  readonly synced: Promise<void>;
  private resolveSynced: () => void = () => {};
  private readonly path: string;
  private readonly log: Logger;
  private readonly debounceMs: number;
  private readonly pollIntervalMs: number;
  private sink: StateSink | undefined;
  private dirWatcher: FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private loading: Promise<void> | undefined;
  private reloadAgain = false;
  private stopped = false;
  /** Content of the last read (applied or not): the same bytes are neither applied nor reported twice. */
  private lastText: string | undefined;
  private lastFailure: string | undefined;
  private loadedOnce = false;
  private reportedProblems = new Set<string>();
  private readonly onPoll = (curr: Stats, prev: Stats): void => {
    if (curr.mtimeMs !== prev.mtimeMs || curr.ino !== prev.ino || curr.size !== prev.size) this.schedule();
  };

  constructor(opts: FileSourceOptions) {
    this.path = opts.path;
    this.log = opts.logger;
    this.debounceMs = opts.debounceMs ?? 100;
    this.pollIntervalMs = opts.pollIntervalMs ?? 1000;
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
    this.resolveSynced();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.dirWatcher?.close();
    this.dirWatcher = undefined;
    unwatchFile(this.path, this.onPoll);
    await this.loading;
  }

  private armDirWatcher(): void {
    if (this.dirWatcher || this.stopped) return;
    try {
      const w = watch(dirname(this.path), { persistent: true }, () => this.schedule());
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

  private schedule(): void {
    if (this.stopped) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.runLoad();
    }, this.debounceMs);
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
        this.schedule();
      }
    });
    return this.loading;
  }

  private async load(): Promise<void> {
    this.armDirWatcher();
    const text = await this.read();
    if (text === undefined || text === this.lastText || this.stopped) return;
    this.lastText = text;
    let manifest: Manifest;
    try {
      manifest = parseManifest(text, this.path);
    } catch (err) {
      // err.message names the file, line and column: one line, and the last good state stays.
      this.log.error({ file: this.path, err }, `${(err as Error).message}; keeping the last good state`);
      return;
    }
    this.apply(manifest);
  }

  /** The file's text, or undefined when it cannot be read (reported once per kind of failure). */
  private async read(): Promise<string | undefined> {
    try {
      const text = await readFile(this.path, 'utf8');
      this.lastFailure = undefined;
      return text;
    } catch (err) {
      const code = errnoCode(err) ?? 'unknown';
      // Forget the content, so the file coming back as it was is applied again.
      this.lastText = undefined;
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

  private apply(m: Manifest): void {
    const sink = this.sink;
    if (!sink) return;
    this.reportProblems(m);
    try {
      sink.replaceServices(m.services);
      sink.replaceEndpointSlices(m.endpointSlices);
    } catch (err) {
      // A bug in the sink, not bad input: keep its stack.
      this.log.error({ file: this.path, err }, 'applying the state file failed');
      return;
    }
    this.loadedOnce = true;
    this.log.info({ file: this.path, services: m.services.length, endpointSlices: m.endpointSlices.length }, 'loaded state file');
  }

  /** Ignored objects are reported when they first appear, not on every re-read of the file. */
  private reportProblems(m: Manifest): void {
    const now = new Set<string>();
    for (const p of m.problems) {
      const s = problemString(p);
      if (!this.reportedProblems.has(s) && !now.has(s)) this.log.warn({ file: this.path, object: p.object, field: p.field }, s);
      now.add(s);
    }
    this.reportedProblems = now;
  }
}
