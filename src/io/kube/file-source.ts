import { statSync, watch, watchFile, unwatchFile, type BigIntStats, type FSWatcher, type Stats } from 'node:fs';
import { readlink, stat } from 'node:fs/promises';
import { performance } from 'node:perf_hooks';
import { basename, dirname, join, relative, resolve, sep } from 'node:path';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { StateSink } from '../../seams/state-sink.js';
import { problemString, type ObjectProblem } from '../../core/model.js';
import { validateEndpointSlice, validateService } from '../../core/validate.js';
import { errnoCode, ProxyError } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';
import { Backoff, type BackoffOptions } from '../../core/backoff.js';
import { endsLikeJson, startsLikeJson } from './json-list-scan.js';
import { ManifestReader, type ManifestChange, type ManifestRead } from './manifest-reader.js';
import { DEFAULT_MAX_BYTES, earlyReadStillCurrent, readStateFile, type StateFileRead } from './state-file-read.js';

/**
 * Services and EndpointSlices from a file (see manifest.ts for what it may hold), re-read when
 * it changes. A successful read brings the state in line with the file: a JSON list edited in
 * its items passes on only the objects that changed (manifest-reader.ts), anything else replaces
 * the whole state. A read that fails (missing file, syntax error) changes nothing, so the last
 * good state stays in force, and the next read is compared with the last version applied.
 *
 * A file that parses but holds no Service or EndpointSlice (`{}`, `null`, a ConfigMap) or only
 * invalid ones is refused like one that does not parse: only an empty List says "no Services".
 * An empty file is reported as such (a writer caught between truncating and writing, most
 * likely) and changes nothing either.
 *
 * Two watchers, because neither is enough alone:
 * - fs.watch on the directory, not the file: editors save by writing a temporary file and
 *   renaming it over the original, and a watch on the old inode would go quiet after the first
 *   save. Only events for the file's own name, or for a name its symlinks pass through in the
 *   directory, trigger a read: a ConfigMap volume swaps a `..data` symlink and never touches the
 *   file's own name, while any other file there (the proxy's own log, say) must not make it
 *   read, or every line logged about a read would trigger the next read.
 * - fs.watchFile polling, for filesystems where inotify says nothing (NFS, some overlay mounts)
 *   and for a directory that does not exist yet.
 * Reads are serialized and identical content is not applied twice, so the two watchers firing
 * for one edit cost one apply and at most one log line. A read that fails other than by the
 * file's absence (EMFILE, EACCES, EIO) is retried with capped backoff: no event may come again
 * for the edit it missed.
 *
 * When to read: soon after an event (settleMs gathers the events of one save), because an edit
 * should reach connections within a few milliseconds. But a file being written in place
 * (`kubectl get -o json > file`, a script's open-truncate-write) may be read empty or
 * half-written. Half a JSON document never parses, so JSON that parses is applied at once, and
 * JSON that does not end as a document can end is not even parsed until the writer is done;
 * anything else (YAML, whose prefix may well parse, an empty file, JSON that does not parse yet)
 * is taken as final only after debounceMs without events. A parse error is reported only then.
 * An empty or unparsable read in between changes nothing, so the complete file that follows is
 * still read as an edit of the last one applied.
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
   * default 3000, past the first sync, so start-up does not wait for it. The index is then built a
   * slice of INDEX_SLICE_MS at a time, so connections are not held up for the whole of it.
   */
  indexAfterMs?: number;
  /**
   * Largest file read, in bytes; default 256 MiB. 30,000 Services with 10 endpoints each come to
   * about 80 MB of pretty-printed JSON; V8 cannot hold much more than 512 MiB as one string.
   */
  maxBytes?: number;
  /** Reads the file, refusing one over maxBytes with ProxyError TOO_LARGE; default readStateFile. A seam for tests. */
  readFile?: (path: string, maxBytes: number) => Promise<Buffer>;
  /**
   * The file read before this source existed (state-file-read.ts, beginEarlyStateRead), taken as
   * the first read if it is still the file's content; not with readFile. Its buffer must be its
   * own: the source reads into it again.
   */
  earlyRead?: Promise<StateFileRead | undefined>;
  /** Retries of a failed read; default from 100 ms, doubling, to 5 s. */
  retry?: Partial<BackoffOptions>;
}

/** Work per turn of the event loop while indexing a whole read in the background. */
const INDEX_SLICE_MS = 5;
/** At most this many new problems of one read are logged one by one; the rest as a count. */
const MAX_LOGGED_PROBLEMS = 20;
/** Symlinks followed when finding the names a state file's path passes through (as ELOOP would stop). */
const MAX_SYMLINKS = 40;

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
  private readonly maxBytes: number;
  private readonly readFile: ((path: string, maxBytes: number) => Promise<Buffer>) | undefined;
  private earlyRead: Promise<StateFileRead | undefined> | undefined;
  /** The last read() was the early read's (said in the `loaded state file` line). */
  private readWasEarly = false;
  /**
   * With readStateFile, two buffers the file is read into in turn: `accepted` holds the version
   * the reader compares with (its `last`), `spare` is free to be read into. Nothing else keeps a
   * view of either: a refused read is kept as a copy.
   */
  private accepted: ArrayBuffer | undefined;
  private spare: Buffer | undefined;
  private readonly retry: Backoff;
  /** Names in the file's directory whose events concern the file (its own, and its symlinks' on the way). */
  private names: Set<string>;
  private readonly reader: ManifestReader;
  private indexTimer: NodeJS.Timeout | undefined;
  private indexImmediate: NodeJS.Immediate | undefined;
  private sink: StateSink | undefined;
  private dirWatcher: FSWatcher | undefined;
  /** The directory dirWatcher watches (device, inode, birth time): a watch on one removed says nothing more. */
  private watchedDir: string | undefined;
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
    this.maxBytes = opts.maxBytes ?? DEFAULT_MAX_BYTES;
    this.readFile = opts.readFile;
    if (opts.readFile === undefined) this.earlyRead = opts.earlyRead;
    this.retry = new Backoff({ initialMs: 100, maxMs: 5000, ...opts.retry }, Math.random);
    this.names = new Set([basename(opts.path)]);
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
    this.stopIndexing();
    this.dirWatcher?.close();
    this.dirWatcher = undefined;
    unwatchFile(this.path, this.onPoll);
    await this.loading;
  }

  private armDirWatcher(): void {
    if (this.dirWatcher || this.stopped) return;
    try {
      // Before the watch: a directory replaced in between is then seen as replaced next time.
      this.watchedDir = dirIdentity(statSync(dirname(this.path), { bigint: true }));
      const w = watch(dirname(this.path), { persistent: true }, (_event, name) => {
        // No name (some platforms): cannot tell, so read.
        if (name === null || this.names.has(name)) this.onEvent();
      });
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

  /**
   * Linux says nothing (no 'error') to a watch whose directory was removed: one made anew under
   * the same name is not watched. Dropped here, so that armDirWatcher watches the new one.
   */
  private async dropStaleDirWatcher(): Promise<void> {
    const w = this.dirWatcher;
    if (w === undefined) return;
    let now: string | undefined;
    try {
      now = dirIdentity(await stat(dirname(this.path), { bigint: true }));
    } catch {
      now = undefined;
    }
    if (now !== this.watchedDir && this.dirWatcher === w) {
      w.close();
      this.dirWatcher = undefined;
    }
  }

  private async load(): Promise<void> {
    await this.dropStaleDirWatcher();
    this.armDirWatcher();
    this.names = (await namesOnTheWay(this.path)) ?? this.names;
    const startedAt = performance.now();
    const buf = await this.read();
    const readMs = performance.now() - startedAt;
    const earlyRead = this.readWasEarly;
    this.readWasEarly = false;
    if (buf === undefined || this.stopped || this.failed?.equals(buf)) return;
    // Milliseconds until the file has been quiet for debounceMs (<= 0: it has).
    const unquietMs = this.started ? this.debounceMs - (performance.now() - this.lastEventAt) : 0;
    if (unquietMs > 0 && !startsLikeJson(buf)) return this.readWhenQuiet(unquietMs, 'not JSON');
    if (unquietMs > 0 && !endsLikeJson(buf)) return this.readWhenQuiet(unquietMs, 'JSON not complete');
    let read: ManifestRead | undefined;
    try {
      read = this.reader.diff(buf);
    } catch (err) {
      if (unquietMs > 0) return this.readWhenQuiet(unquietMs, 'does not parse');
      this.failed = Buffer.from(buf);
      // A ProxyError's message names the file, line and column: one line, and the last good
      // state stays. Anything else is a bug, but the file is what made it: name the file.
      const message = err instanceof ProxyError ? err.message : `${this.path}: cannot read the state file: ${(err as Error).message}`;
      this.log.error({ file: this.path, err }, `${message}; keeping the last good state`);
      return;
    }
    if (read === undefined) {
      this.failed = undefined;
      return;
    }
    const refusal = this.refusal(read);
    if (refusal !== undefined) {
      // Not accepted: the next read is compared with the state as it stands, not with this content.
      this.failed = Buffer.from(buf);
      this.log[refusal.level]({ file: this.path }, `${this.path}: ${refusal.message}; keeping the last good state (an empty List, {"apiVersion":"v1","kind":"List","items":[]}, removes every Service)`);
      return;
    }
    this.failed = undefined;
    read.accept();
    if (!this.readFile) this.swapBuffers(buf);
    this.apply(read.change, { readMs, loadMs: performance.now() - startedAt, earlyRead });
  }

  /**
   * Why a file that parsed must not replace the state, if it must not: it holds no Service or
   * EndpointSlice and is not an empty List, or none of its objects is valid. The
   * whole state would otherwise go for a file that says nothing about it.
   */
  private refusal(read: ManifestRead): { level: 'warn' | 'error'; message: string } | undefined {
    const { change, holds } = read;
    if (holds === 'blank') return { level: 'warn', message: 'state file is empty (still being written?)' };
    const problems = change.kind === 'full' ? change.manifest.problems : change.problems;
    const first = (ps: readonly ObjectProblem[]): string => (ps[0] ? ` (${problemString({ ...ps[0], file: undefined })})` : '');
    if (holds === 'nothing') return { level: 'error', message: `holds no Service or EndpointSlice${first(problems)}` };
    if (holds === 'objects') {
      const invalid = firstProblemIfNoneValid(read.objects());
      if (invalid !== undefined) return { level: 'error', message: `holds no valid Service or EndpointSlice${first(invalid)}` };
    }
    return undefined;
  }

  /** The file may be half-written: look again once it has been quiet. */
  private readWhenQuiet(ms: number, why: string): void {
    this.log.debug({ file: this.path, why, inMs: Math.ceil(ms) }, 'state file changed moments ago and may be half-written; reading it again when quiet');
    this.readIn(ms);
  }

  /**
   * The early read's bytes, once, if it succeeded and is still the file's content: asked after the
   * watchers are armed, so an edit made before then is seen here (earlyReadStillCurrent) and one
   * made after by them.
   */
  private async takeEarlyRead(): Promise<Buffer | undefined> {
    const early = this.earlyRead;
    if (early === undefined) return undefined;
    this.earlyRead = undefined;
    const r = await early;
    if (r === undefined) return undefined;
    if (r.buf.length <= this.maxBytes && (await earlyReadStillCurrent(this.path, r))) {
      this.readWasEarly = true;
      return r.buf;
    }
    // Read into it again rather than into a second buffer as large beside it.
    this.spare = Buffer.from(r.buf.buffer);
    return undefined;
  }

  /**
   * The file's content, or undefined when it cannot be read (reported once per kind of failure).
   * A failure other than absence or size is retried with backoff: an edit made while descriptors
   * ran out (EMFILE) sends no second event. Absence waits for the watchers; size, for an edit.
   */
  private async read(): Promise<Buffer | undefined> {
    try {
      const buf = (await this.takeEarlyRead()) ?? (this.readFile ? await this.readFile(this.path, this.maxBytes) : await readStateFile(this.path, this.maxBytes, this.spare));
      if (!this.readFile && buf.buffer !== this.accepted) this.spare = Buffer.from(buf.buffer);
      this.lastFailure = undefined;
      this.retry.reset();
      return buf;
    } catch (err) {
      const code = errnoCode(err) ?? 'unknown';
      // Forget the content, so the file coming back as it was is applied (and reported) again.
      this.reader.reset();
      this.failed = undefined;
      const retry = code !== 'ENOENT' && code !== 'TOO_LARGE';
      const inMs = retry ? this.retry.next() : undefined;
      if (inMs !== undefined) this.readIn(inMs);
      if (this.lastFailure === code) return undefined;
      this.lastFailure = code;
      if (code === 'ENOENT') {
        const what = this.loadedOnce ? 'state file disappeared; keeping the last good state' : 'state file not found';
        this.log.error({ file: this.path }, `${this.path}: ${what}; waiting for it to appear`);
      } else if (code === 'TOO_LARGE') {
        this.log.error({ file: this.path }, `${(err as Error).message}; keeping the last good state`);
      } else {
        this.log.error({ file: this.path, err, retryInMs: inMs }, `${this.path}: cannot read the state file; keeping the last good state and trying again`);
      }
      return undefined;
    }
  }

  /**
   * `took`: milliseconds reading the file, and reading, comparing and parsing it, and whether the
   * read was the early one (for the log: where an edit's time went).
   */
  private apply(change: ManifestChange, took: { readMs: number; loadMs: number; earlyRead?: boolean }): void {
    const sink = this.sink;
    if (!sink) return;
    let counts: { services: number; endpointSlices: number };
    // Each call on its own: one that throws (a bug in the sink, not bad input: the sink validates)
    // must not keep the others from being applied.
    let failures = 0;
    let firstErr: unknown;
    const attempt = (call: () => void): void => {
      try {
        call();
      } catch (err) {
        if (failures++ === 0) firstErr = err;
      }
    };
    if (change.kind === 'full') {
      const m = change.manifest;
      this.reportProblems(m.problems);
      attempt(() => sink.replaceServices(m.services));
      attempt(() => sink.replaceEndpointSlices(m.endpointSlices));
      counts = { services: m.services.length, endpointSlices: m.endpointSlices.length };
    } else {
      this.reportProblems(change.problems);
      for (const s of change.upsertServices) attempt(() => sink.upsertService(s));
      for (const s of change.upsertEndpointSlices) attempt(() => sink.upsertEndpointSlice(s));
      for (const k of change.deleteEndpointSlices) attempt(() => sink.deleteEndpointSlice(k.namespace, k.name));
      for (const k of change.deleteServices) attempt(() => sink.deleteService(k.namespace, k.name));
      counts = { services: change.services, endpointSlices: change.endpointSlices };
    }
    if (failures > 0) {
      // Keep the stack, and read the file whole next time.
      this.reader.reset();
      this.log.error({ file: this.path, err: firstErr, failures }, 'applying the state file failed');
    }
    this.loadedOnce = true;
    if (change.kind === 'full') this.indexLater();
    const changed = change.kind === 'full' ? 'all' : change.upsertServices.length + change.upsertEndpointSlices.length + change.deleteServices.length + change.deleteEndpointSlices.length;
    const ms = (v: number): number => Math.round(v * 10) / 10;
    this.log.info({ file: this.path, ...counts, changed, readMs: ms(took.readMs), loadMs: ms(took.loadMs), ...(took.earlyRead === true ? { earlyRead: true } : {}) }, 'loaded state file');
  }

  /** `buf` (a view of the spare) was accepted: the buffer that held the version before is now the spare. */
  private swapBuffers(buf: Buffer): void {
    const before = this.accepted;
    this.accepted = buf.buffer as ArrayBuffer;
    this.spare = before !== undefined && before !== this.accepted ? Buffer.from(before) : undefined;
  }

  /** Index the whole read just applied, after indexAfterMs, a slice per turn of the event loop. */
  private indexLater(): void {
    this.stopIndexing();
    const slice = (): void => {
      this.indexImmediate = undefined;
      if (this.stopped || this.reader.indexFor(INDEX_SLICE_MS)) return;
      this.indexImmediate = setImmediate(slice).unref();
    };
    this.indexTimer = setTimeout(slice, this.indexAfterMs).unref();
  }

  private stopIndexing(): void {
    if (this.indexTimer) clearTimeout(this.indexTimer);
    if (this.indexImmediate) clearImmediate(this.indexImmediate);
    this.indexTimer = undefined;
    this.indexImmediate = undefined;
  }

  /**
   * Ignored objects are reported when they first appear, not on every re-read of the file; past
   * MAX_LOGGED_PROBLEMS in one read, only counted (a List of 100,000 ConfigMaps is one more line).
   */
  private reportProblems(problems: readonly ObjectProblem[]): void {
    const now = new Set<string>();
    let unlogged = 0;
    let logged = 0;
    for (const p of problems) {
      const s = problemString(p);
      if (!this.reportedProblems.has(s) && !now.has(s)) {
        if (logged++ < MAX_LOGGED_PROBLEMS) this.log.warn({ file: this.path, object: p.object, field: p.field }, s);
        else unlogged++;
      }
      now.add(s);
    }
    if (unlogged > 0) this.log.warn({ file: this.path, unlogged }, `${this.path}: ${unlogged} more objects ignored (not logged one by one)`);
    this.reportedProblems = now;
  }
}

/** A directory made anew often gets the inode of the one removed: its birth time tells them apart. */
function dirIdentity(s: BigIntStats): string {
  return `${s.dev}:${s.ino}:${s.birthtimeNs}`;
}

/**
 * Undefined when the read has an object the state cache would take (usually the first one tried);
 * else the problems of its first object.
 */
function firstProblemIfNoneValid(m: { services: Iterable<V1Service>; endpointSlices: Iterable<V1EndpointSlice> }): ObjectProblem[] | undefined {
  let firstProblems: ObjectProblem[] | undefined;
  const valid = (problems: ObjectProblem[]): boolean => {
    firstProblems ??= problems;
    return problems.length === 0;
  };
  for (const s of m.services) if (valid(validateService(s))) return undefined;
  for (const s of m.endpointSlices) if (valid(validateEndpointSlice(s))) return undefined;
  return firstProblems ?? [];
}

/**
 * The names in the file's directory that events for the file come by: its own, and those its
 * symlinks lead through there. In a ConfigMap volume `state.yaml -> ..data/state.yaml` and
 * `..data -> ..2024_01_01_00_00_00.123`: an update renames a new `..data` into place.
 * Targets outside the directory are left to the poller. Undefined when a link could not be read
 * (EMFILE, EACCES): the names found last time are as good a guess as any.
 */
async function namesOnTheWay(path: string): Promise<Set<string> | undefined> {
  const abs = resolve(path);
  const dir = dirname(abs);
  const names = new Set([basename(abs)]);
  const queue = [abs];
  for (let hops = 0; hops < MAX_SYMLINKS && queue.length > 0; hops++) {
    const p = queue.shift() as string;
    let target: string;
    try {
      target = await readlink(p);
    } catch (err) {
      const code = errnoCode(err);
      if (code === 'EINVAL' || code === 'ENOENT' || code === 'ENOTDIR') continue; // not a symlink, or gone
      return undefined;
    }
    const t = resolve(dirname(p), target);
    const first = relative(dir, t).split(sep)[0];
    if (first === undefined || first === '' || first === '..') continue;
    names.add(first);
    // The first step may itself be a link (`..data`), and so may the rest of the target.
    queue.push(join(dir, first));
    if (t !== join(dir, first)) queue.push(t);
  }
  return names;
}
