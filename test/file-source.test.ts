import { mkdtemp, mkdir, open, rename, rm, symlink, utimes, writeFile } from 'node:fs/promises';
import { appendFileSync, readFileSync, statSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, it, expect } from 'vitest';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { FileSource, type FileSourceOptions } from '../src/io/kube/file-source.js';
import { beginEarlyStateRead, readStateFile, type StateFileRead } from '../src/io/kube/state-file-read.js';
import { earlyReadOf } from './helpers/early-read.js';
import { StateCache } from '../src/core/state-cache.js';
import type { StateSink } from '../src/seams/state-sink.js';
import { problemString, type ObjectProblem } from '../src/core/model.js';
import type { NodeInfo } from '../src/core/model.js';
import { createLogger } from '../src/log.js';
import { waitFor } from './helpers/net.js';
import { endpointSlice, list, service } from './helpers/objects.js';

/**
 * Keeps the state the source drives it to, full replaces and single changes alike, and records
 * it after each apply (the calls of one apply are synchronous: one snapshot per microtask).
 */
class RecordingSink implements StateSink {
  readonly applied: Array<{ services: string[]; slices: string[] }> = [];
  readonly calls = { replace: 0, upsert: 0, delete: 0 };
  private readonly services = new Map<string, string>();
  private readonly slices = new Map<string, string>();
  private snapshotQueued = false;
  replaceServices(objs: readonly V1Service[]): void {
    this.calls.replace++;
    this.replace(this.services, objs);
  }
  replaceEndpointSlices(objs: readonly V1EndpointSlice[]): void {
    this.replace(this.slices, objs);
  }
  upsertService(obj: V1Service): void {
    this.calls.upsert++;
    this.set(this.services, obj);
  }
  deleteService(namespace: string, name: string): void {
    this.calls.delete++;
    this.remove(this.services, namespace, name);
  }
  upsertEndpointSlice(obj: V1EndpointSlice): void {
    this.calls.upsert++;
    this.set(this.slices, obj);
  }
  deleteEndpointSlice(namespace: string, name: string): void {
    this.calls.delete++;
    this.remove(this.slices, namespace, name);
  }
  setNode(_n: NodeInfo): void {}
  last(): { services: string[]; slices: string[] } | undefined {
    return this.applied[this.applied.length - 1];
  }
  private replace(map: Map<string, string>, objs: readonly (V1Service | V1EndpointSlice)[]): void {
    map.clear();
    for (const o of objs) this.set(map, o);
    this.snapshotSoon();
  }
  private set(map: Map<string, string>, o: V1Service | V1EndpointSlice): void {
    map.set(`${o.metadata?.namespace || 'default'}/${o.metadata?.name ?? ''}`, o.metadata?.name ?? '');
    this.snapshotSoon();
  }
  private remove(map: Map<string, string>, namespace: string, name: string): void {
    map.delete(`${namespace || 'default'}/${name}`);
    this.snapshotSoon();
  }
  private snapshotSoon(): void {
    if (this.snapshotQueued) return;
    this.snapshotQueued = true;
    queueMicrotask(() => {
      this.snapshotQueued = false;
      this.applied.push({ services: [...this.services.values()], slices: [...this.slices.values()] });
    });
  }
}

interface LogLine {
  level: number;
  msg: string;
  file?: string;
  err?: { message: string; code?: string };
}

function captureLogger(): { logger: ReturnType<typeof createLogger>; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const logger = createLogger('debug', { write: (s: string) => void lines.push(JSON.parse(s) as LogLine) });
  return { logger, lines };
}
const ERROR = 50;
const isDeferral = (l: LogLine): boolean => l.msg.includes('may be half-written');

const state = (...names: string[]): string =>
  list([
    ...names.map((n) => service({ name: n, ports: [{ name: 'http', port: 80 }] })),
    ...names.map((n) => endpointSlice({ service: n, ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.0.0.1' }] })),
  ]);

const sources: FileSource[] = [];
const dirs: string[] = [];

type SetupOptions = { pollIntervalMs?: number; debounceMs?: number; subdir?: string; initial?: string; name?: string } & Partial<
  Pick<FileSourceOptions, 'maxBytes' | 'readFile' | 'logger'>
> & { earlyRead?: (path: string) => Promise<StateFileRead | undefined> };

async function setup(opts: SetupOptions = {}) {
  const dir = await mkdtemp(join(tmpdir(), 'kup-file-source-'));
  dirs.push(dir);
  const stateDir = opts.subdir ? join(dir, opts.subdir) : dir;
  const path = join(stateDir, opts.name ?? 'state.json');
  if (opts.initial !== undefined) await writeFile(path, opts.initial);
  const captured = captureLogger();
  const logger = opts.logger ?? captured.logger;
  const lines = captured.lines;
  const source = new FileSource({
    path,
    logger,
    debounceMs: opts.debounceMs ?? 20,
    pollIntervalMs: opts.pollIntervalMs ?? 100,
    ...(opts.maxBytes !== undefined ? { maxBytes: opts.maxBytes } : {}),
    ...(opts.readFile !== undefined ? { readFile: opts.readFile } : {}),
    ...(opts.earlyRead !== undefined ? { earlyRead: opts.earlyRead(path) } : {}),
  });
  sources.push(source);
  const sink = new RecordingSink();
  return { dir, stateDir, path, source, sink, lines };
}

/** `content` in a new file beside `path`, to rename over it. */
async function writeTemp(path: string, content: string): Promise<string> {
  const tmp = `${path}.tmp`;
  await writeFile(tmp, content);
  return tmp;
}

afterEach(async () => {
  await Promise.all(sources.splice(0).map((s) => s.stop()));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

describe('FileSource', () => {
  it('applies the file once at start, then resolves synced', async () => {
    const { source, sink, lines } = await setup({ initial: state('web', 'api') });
    await source.start(sink);
    await source.synced;
    expect(sink.applied).toEqual([{ services: ['web', 'api'], slices: ['web-abcde', 'api-abcde'] }]);
    expect(lines.filter((l) => l.level >= ERROR)).toEqual([]);
  });

  it('takes the read begun before it existed as its first read, while the file is unchanged', async () => {
    // The early read's bytes differ from the file's, its stat is the file's: applied, so the file
    // itself was not read again.
    const { source, sink, lines } = await setup({ initial: state('web'), earlyRead: async (path) => earlyReadOf(path, state('early')) });
    await source.start(sink);
    expect(sink.applied).toEqual([{ services: ['early'], slices: ['early-abcde'] }]);
    expect(lines.find((l) => l.msg === 'loaded state file')).toMatchObject({ earlyRead: true });
  });

  it('reads the file again when it changed after the early read, or the early read failed', async () => {
    const stale = await setup({ initial: state('web'), earlyRead: async (path) => earlyReadOf(path, state('web')) });
    // Rewritten after the early read and before the source watches it: no watcher sees it.
    await rename(await writeTemp(stale.path, state('web', 'api')), stale.path);
    await stale.source.start(stale.sink);
    expect(stale.sink.applied).toEqual([{ services: ['web', 'api'], slices: ['web-abcde', 'api-abcde'] }]);
    expect(stale.lines.find((l) => l.msg === 'loaded state file')).not.toHaveProperty('earlyRead');
    const failed = await setup({ initial: state('db'), earlyRead: async () => undefined });
    await failed.source.start(failed.sink);
    expect(failed.sink.applied).toEqual([{ services: ['db'], slices: ['db-abcde'] }]);
  });

  it('reads the file again when its last change was too recent to tell another one in the same tick apart', async () => {
    const { source, sink } = await setup({
      initial: state('web'),
      // Opened 5 ms after the file's last change: an edit in the same 20 ms could keep its stat.
      earlyRead: async (path) => ({ ...earlyReadOf(path, state('early')), openedAtMs: Number(statSync(path, { bigint: true }).ctimeNs / 1_000_000n) + 5 }),
    });
    await source.start(sink);
    expect(sink.applied).toEqual([{ services: ['web'], slices: ['web-abcde'] }]);
  });

  it('begins an early read that is the file and its stat, or undefined for anything else than a regular file read whole', async () => {
    const { stateDir, path } = await setup({ initial: state('web') });
    const early = beginEarlyStateRead(path);
    const r = await early.take(path);
    expect(r?.buf.toString()).toBe(state('web'));
    expect(r?.stat.ino).toBe(statSync(path, { bigint: true }).ino);
    // Taken once, and only for its own path.
    expect(early.take(path)).toBeUndefined();
    expect(beginEarlyStateRead(path).take(join(stateDir, 'other.json'))).toBeUndefined();
    const read = (p: string, maxBytes?: number): Promise<StateFileRead | undefined> | undefined => beginEarlyStateRead(p, maxBytes).take(p);
    await writeFile(join(stateDir, 'empty.json'), '');
    expect((await read(join(stateDir, 'empty.json')))?.buf.length).toBe(0);
    expect(await read(join(stateDir, 'missing.json'))).toBeUndefined();
    expect(await read(stateDir)).toBeUndefined();
    expect(await read(path, 10)).toBeUndefined();
    // A FIFO with no writer: nothing blocks.
    const fifo = join(stateDir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    expect(await read(fifo)).toBeUndefined();
  });

  it('reads a real kubectl-shaped fixture', async () => {
    const { source, sink } = await setup({ initial: readFileSync(new URL('./fixtures/kube/services-list.json', import.meta.url), 'utf8') });
    await source.start(sink);
    expect(sink.last()?.services).toEqual(['ext', 'headless', 'kubernetes', 'web']);
  });

  it('picks up a live edit', async () => {
    const { path, source, sink } = await setup({ initial: state('web') });
    await source.start(sink);
    await writeFile(path, state('web', 'api'));
    await waitFor(() => sink.last()?.services.includes('api'), 'the edit to be applied');
    expect(sink.last()).toEqual({ services: ['web', 'api'], slices: ['web-abcde', 'api-abcde'] });
  });

  it('follows an editor that saves by renaming a new file over the old one, save after save', async () => {
    const { dir, path, source, sink } = await setup({ initial: state('v0') });
    await source.start(sink);
    for (const version of ['v1', 'v2', 'v3']) {
      const tmp = join(dir, `.state.json.${version}.swp`);
      await writeFile(tmp, state(version));
      await rename(tmp, path);
      await waitFor(() => sink.last()?.services[0] === version, `save ${version} to be applied`);
    }
    expect(sink.applied.map((a) => a.services[0])).toEqual(['v0', 'v1', 'v2', 'v3']);
  });

  it('reports an edit that does not parse as one error line naming file and line, and applies nothing', async () => {
    const { path, source, sink, lines } = await setup({ initial: state('web') });
    await source.start(sink);
    await writeFile(path, 'apiVersion: v1\nkind: List\nitems:\n  - kind: Service\n   bad: indent\n');
    await waitFor(() => lines.some((l) => l.level >= ERROR), 'the parse error to be logged');
    // A good edit after it: once it is applied, every event about the bad one has been handled.
    await writeFile(path, state('api'));
    await waitFor(() => sink.last()?.services[0] === 'api', 'the fix to be applied');
    const errors = lines.filter((l) => l.level >= ERROR);
    expect(errors).toHaveLength(1);
    expect(errors[0]?.file).toBe(path);
    expect(errors[0]?.msg).toContain(`${path}:5:`);
    expect(errors[0]?.msg).toContain('keeping the last good state');
    expect(errors[0]?.err?.code).toBe('PARSE');
    expect(sink.applied.map((a) => a.services)).toEqual([['web'], ['api']]);
  });

  it('waits for a missing file with one clear error line, and applies it when it appears', async () => {
    const { path, source, sink, lines } = await setup();
    await source.start(sink);
    await source.synced;
    expect(sink.applied).toEqual([]);
    const errors = lines.filter((l) => l.level >= ERROR);
    expect(errors).toHaveLength(1);
    expect(errors[0]?.msg).toBe(`${path}: state file not found; waiting for it to appear`);
    await writeFile(path, state('web'));
    await waitFor(() => sink.last()?.services[0] === 'web', 'the new file to be applied');
    expect(lines.filter((l) => l.level >= ERROR)).toHaveLength(1);
  });

  it('keeps the last good state while the file is gone, and applies it again when it comes back', async () => {
    const { path, source, sink, lines } = await setup({ initial: state('web') });
    await source.start(sink);
    await rm(path);
    await waitFor(() => lines.some((l) => l.msg.includes('state file disappeared')), 'the removal to be noticed');
    expect(sink.applied).toHaveLength(1);
    await writeFile(path, state('web'));
    await waitFor(() => sink.applied.length === 2, 'the file to be applied again');
  });

  it('falls back to polling when the directory does not exist yet', async () => {
    const { stateDir, path, source, sink } = await setup({ subdir: 'later', pollIntervalMs: 50 });
    await source.start(sink);
    await mkdir(stateDir);
    await writeFile(path, state('web'));
    await waitFor(() => sink.last()?.services[0] === 'web', 'the polled file to be applied');
    // The directory watch is armed by now: a rename-replace is still followed.
    const tmp = join(stateDir, 'tmp');
    await writeFile(tmp, state('api'));
    await rename(tmp, path);
    await waitFor(() => sink.last()?.services[0] === 'api', 'the replacement to be applied');
  });

  it('logs objects of other kinds once, not on every re-read', async () => {
    const other = (names: string): string => `${names}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\n`;
    const yaml = (n: string): string => `apiVersion: v1\nkind: Service\nmetadata: {name: ${n}}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}`;
    const { path, source, sink, lines } = await setup({ initial: other(yaml('a')) });
    await source.start(sink);
    await writeFile(path, other(yaml('b')));
    await waitFor(() => sink.last()?.services[0] === 'b', 'the edit to be applied');
    expect(lines.filter((l) => l.msg.includes('ConfigMap default/cfg'))).toHaveLength(1);
  });

  it('passes on only what an edit of a JSON list changed, not the whole file again', async () => {
    const { dir, path, source, sink } = await setup({ initial: state('a', 'b', 'c') });
    await source.start(sink);
    expect(sink.calls).toEqual({ replace: 1, upsert: 0, delete: 0 });
    const tmp = join(dir, 'tmp');
    await writeFile(tmp, state('a', 'c'));
    await rename(tmp, path);
    await waitFor(() => !sink.last()?.services.includes('b'), 'b to be removed');
    expect(sink.last()).toEqual({ services: ['a', 'c'], slices: ['a-abcde', 'c-abcde'] });
    expect(sink.calls.replace).toBe(1);
    expect(sink.calls.delete).toBe(2);
  });

  describe('a whole file rewritten with a few objects changed', () => {
    /** 300 Services with a slice each, as kubectl prints them (pretty, 4-space indent) or on one line; `moved` slices point elsewhere. */
    const big = (formatting: 'pretty' | 'compact', moved: readonly number[] = []): string => {
      const items: unknown[] = [];
      for (let i = 0; i < 300; i++) {
        const on = moved.includes(i);
        items.push(service({ name: `s${i}`, ports: [{ name: 'http', port: 80 }] }));
        items.push(endpointSlice({ service: `s${i}`, ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: on ? '10.0.1.2' : '10.0.0.1' }], resourceVersion: on ? '2' : '1' }));
      }
      const doc = { apiVersion: 'v1', items, kind: 'List', metadata: { resourceVersion: '' } };
      return formatting === 'pretty' ? `${JSON.stringify(doc, null, 4)}\n` : JSON.stringify(doc);
    };

    for (const formatting of ['pretty', 'compact'] as const) {
      it(`applies only the three objects a script changed, rewriting the file by rename (${formatting})`, async () => {
        const { dir, path, source, sink } = await setup({ initial: big(formatting) });
        await source.start(sink);
        const tmp = join(dir, '.state.json.tmp');
        await writeFile(tmp, big(formatting, [10, 150, 290]));
        await rename(tmp, path);
        await waitFor(() => sink.applied.length === 2, 'the rewrite to be applied');
        expect(sink.calls).toEqual({ replace: 1, upsert: 3, delete: 0 });
      });

      it(`applies the one changed endpoint of a file written in place, emptied first as a shell's > does (${formatting})`, async () => {
        const { path, source, sink, lines } = await setup({ initial: big(formatting) });
        await source.start(sink);
        const text = big(formatting, [42]);
        // Cut just after a quote: a document still being written, as a reader may catch it.
        const cut = text.indexOf('"', text.length / 2) + 1;
        const fh = await open(path, 'w');
        try {
          // Empty long enough to be reported, then half of it, then the rest: each read in between is refused.
          await waitFor(() => lines.some((l) => l.msg.includes('state file is empty')), 'the empty file to be reported');
          await fh.write(text.slice(0, cut));
          await waitFor(() => lines.some(isDeferral), 'the first half to be read and put off');
          await fh.write(text.slice(cut));
        } finally {
          await fh.close();
        }
        await waitFor(() => sink.applied.length === 2, 'the rewrite to be applied');
        expect(sink.calls).toEqual({ replace: 1, upsert: 1, delete: 0 });
        expect(lines.filter((l) => l.level >= ERROR)).toEqual([]);
      });
    }
  });

  it('takes a YAML file written in two steps in its final form only, after a quiet spell', async () => {
    const svc = (n: string): string => `apiVersion: v1\nkind: Service\nmetadata: {name: ${n}}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n`;
    const { path, source, sink, lines } = await setup({ initial: svc('a'), debounceMs: 400 });
    await source.start(sink);
    // The first half is valid YAML on its own (one Service fewer), as a file written in place can be when read.
    await writeFile(path, `${svc('a')}---\n`);
    await waitFor(() => lines.some(isDeferral), 'the first half to be read and put off');
    await writeFile(path, `${svc('a')}---\n${svc('b')}`);
    await waitFor(() => sink.last()?.services.includes('b'), 'the whole file to be applied');
    expect(sink.applied.map((a) => a.services)).toEqual([['a'], ['a', 'b']]);
    expect(lines.filter((l) => l.level >= ERROR)).toEqual([]);
  });

  it('does not report JSON caught half-written when it is complete within the quiet spell', async () => {
    const { path, source, sink, lines } = await setup({ initial: state('a'), debounceMs: 400 });
    await source.start(sink);
    const text = state('a', 'b');
    await writeFile(path, text.slice(0, text.length / 2));
    await waitFor(() => lines.some(isDeferral), 'the first half to be read and put off');
    await writeFile(path, text);
    await waitFor(() => sink.last()?.services.includes('b'), 'the whole file to be applied');
    expect(lines.filter((l) => l.level >= ERROR)).toEqual([]);
  });

  it('applies a YAML file at start even while other files in its directory keep changing', async () => {
    const yaml = 'apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n';
    const { dir, path, source, sink } = await setup({ debounceMs: 400 });
    await writeFile(path, yaml);
    // A ConfigMap volume's other keys, an editor's swap file: events in the directory during start-up.
    let writing = true;
    const churn = (async () => {
      for (let i = 0; writing && i < 500; i++) await writeFile(join(dir, 'other'), String(i));
    })();
    await source.start(sink);
    const atSynced = sink.calls.replace;
    writing = false;
    await churn;
    expect(atSynced).toBe(1);
  });

  it('refuses a file that parses but holds no Service or EndpointSlice, and keeps the last good state', async () => {
    const { path, source, sink, lines } = await setup({ initial: state('web') });
    await source.start(sink);
    const nothing = ['{}', '[]', '"x"', '42', 'null', '{"kind":"Servic"}', '---\n', '# all commented out\n'];
    for (const [i, text] of nothing.entries()) {
      await writeFile(path, text);
      await waitFor(() => lines.filter((l) => l.level >= ERROR).length === i + 1, `${text} to be refused`);
      expect(sink.applied).toHaveLength(1);
    }
    const errors = lines.filter((l) => l.level >= ERROR);
    expect(errors.every((l) => l.file === path && l.msg.startsWith(`${path}: holds no Service or EndpointSlice`) && l.msg.includes('keeping the last good state'))).toBe(true);
    expect(errors[5]?.msg).toContain('(Servic default/<unnamed>: kind: "Servic" ignored: only Service and EndpointSlice are read)');
    // Objects, but none of them valid: the same.
    await writeFile(path, list([service({ name: 'bad', ports: [{ name: 'http', port: 0 }] })]));
    await waitFor(() => lines.some((l) => l.msg.includes('holds no valid Service or EndpointSlice (Service default/bad: spec.ports[0].port:')), 'invalid objects to be refused');
    // An empty List is the way to say "no Services".
    await writeFile(path, '{"apiVersion":"v1","kind":"List","items":[]}');
    await waitFor(() => sink.applied.length === 2, 'the empty List to be applied');
    expect(sink.last()).toEqual({ services: [], slices: [] });
  });

  it('keeps the last good state over an empty file, and says so once', async () => {
    const { path, source, sink, lines } = await setup({ initial: state('web') });
    await source.start(sink);
    await writeFile(path, '');
    await waitFor(() => lines.some((l) => l.msg.includes('state file is empty')), 'the empty file to be reported');
    await writeFile(path, '  \n');
    await writeFile(path, state('api'));
    await waitFor(() => sink.last()?.services[0] === 'api', 'the rewrite to be applied');
    expect(sink.applied.map((a) => a.services)).toEqual([['web'], ['api']]);
    expect(lines.filter((l) => l.msg.includes('state file is empty'))).toHaveLength(1);
    expect(lines.find((l) => l.msg.includes('state file is empty'))?.level).toBe(40);
  });

  it('applies the other objects of a file while one nests past the stack, edit after edit', async () => {
    const problems: ObjectProblem[] = [];
    const cache = new StateCache({ onProblem: (p) => problems.push(p) });
    const deep = `${'{"a":'.repeat(100_000)}1${'}'.repeat(100_000)}`;
    const text = (port: number, ip: string): string =>
      list([
        service({ name: 'web', ports: [{ name: 'http', port: 80 }] }),
        endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip }] }),
        service({ name: 'deep', ports: [{ name: 'http', port }] }),
      ]).replace('"name": "deep"', `"name": "deep", "annotations": {"x": ${deep}}`);
    const { path, source, lines } = await setup({ initial: text(80, '10.0.0.1') });
    await source.start(cache);
    for (const [port, ip] of [[81, '10.0.0.2'], [82, '10.0.0.3']] as const) {
      await writeFile(path, text(port, ip));
      await waitFor(() => cache.slicesFor('default/web')[0]?.endpoints[0]?.addresses[0] === ip, `the edit to ${ip} to be applied`);
    }
    expect(cache.serviceKeys()).toEqual(['default/web']);
    expect(lines.filter((l) => l.level >= ERROR)).toEqual([]);
    expect(problems.map(problemString)).toEqual(['Service default/deep: metadata.annotations.x.a.a.a…: nested more than 100 levels deep']);
  });

  it('reads only for events about the state file, not for its own log file beside it', async () => {
    // The proxy logging at debug into the state file's directory: each read logs a line, and a
    // read for every event in the directory would keep YAML from ever being quiet long enough.
    const logDir = await mkdtemp(join(tmpdir(), 'kup-file-source-log-'));
    dirs.push(logDir);
    let logFile = join(logDir, 'proxy.log');
    const lines: LogLine[] = [];
    const logger = createLogger('debug', {
      write: (s: string) => {
        lines.push(JSON.parse(s) as LogLine);
        appendFileSync(logFile, s);
      },
    });
    let reads = 0;
    const yaml = (n: string): string => `apiVersion: v1\nkind: Service\nmetadata: {name: ${n}}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n`;
    const { dir, path, source, sink } = await setup({
      name: 'state.yaml',
      initial: yaml('a'),
      debounceMs: 100,
      logger,
      readFile: (p, max) => {
        reads++;
        return readStateFile(p, max);
      },
    });
    logFile = join(dir, 'proxy.log');
    await source.start(sink);
    await writeFile(path, yaml('b'));
    await waitFor(() => sink.last()?.services[0] === 'b', 'the edit to be applied', 3000);
    expect(lines.filter((l) => l.level >= ERROR)).toEqual([]);
    expect(reads).toBeLessThan(10);
  });

  it('follows a ConfigMap volume: the file a symlink through ..data, updated by swapping ..data', async () => {
    const { dir, path, source, sink } = await setup({ pollIntervalMs: 60_000 });
    const version = async (v: string, text: string): Promise<void> => {
      await mkdir(join(dir, `..${v}`));
      await writeFile(join(dir, `..${v}`, 'state.json'), text);
      await symlink(`..${v}`, join(dir, '..data_tmp'));
      await rename(join(dir, '..data_tmp'), join(dir, '..data'));
    };
    await version('v1', state('web'));
    await symlink('..data/state.json', path);
    await source.start(sink);
    expect(sink.last()?.services).toEqual(['web']);
    await version('v2', state('api'));
    await waitFor(() => sink.last()?.services[0] === 'api', 'the swapped ..data to be applied');
  });

  it('refuses a file over maxBytes once, keeping the last good state, and reads it again once it shrinks', async () => {
    const { path, source, sink, lines } = await setup({ initial: state('web'), maxBytes: 4096 });
    await source.start(sink);
    const big = state(...Array.from({ length: 20 }, (_, i) => `s${i}`));
    expect(big.length).toBeGreaterThan(4096);
    await writeFile(path, big);
    await waitFor(() => lines.some((l) => l.level >= ERROR), 'the oversize file to be reported');
    await writeFile(path, `${big}\n`);
    await writeFile(path, state('api'));
    await waitFor(() => sink.last()?.services[0] === 'api', 'the smaller file to be applied');
    const errors = lines.filter((l) => l.level >= ERROR);
    expect(errors.map((l) => l.msg)).toEqual([`${path}: state file is ${big.length} bytes, more than the 4096 read; keeping the last good state`]);
    expect(sink.applied.map((a) => a.services)).toEqual([['web'], ['api']]);
  });

  it('retries a read that failed for want of descriptors until the edit is applied', async () => {
    let failures = 0;
    const readFile = (p: string, max: number): Promise<Buffer> => {
      if (failures > 0) {
        failures--;
        return Promise.reject(Object.assign(new Error(`EMFILE: too many open files, open '${p}'`), { code: 'EMFILE' }));
      }
      return readStateFile(p, max);
    };
    const { path, source, sink, lines } = await setup({ initial: state('web'), readFile, pollIntervalMs: 60_000 });
    await source.start(sink);
    failures = 3;
    await writeFile(path, state('api'));
    await waitFor(() => sink.last()?.services[0] === 'api', 'the edit to be applied after the failed reads');
    expect(failures).toBe(0);
    const errors = lines.filter((l) => l.level >= ERROR);
    expect(errors).toHaveLength(1);
    expect(errors[0]?.msg).toBe(`${path}: cannot read the state file; keeping the last good state and trying again`);
    expect(errors[0]?.err?.code).toBe('EMFILE');
  });

  it('quotes at most the faulty line of a symlinked file in a parse error', async () => {
    const { dir, path, source, sink, lines } = await setup({ name: 'state.yaml', pollIntervalMs: 50 });
    await mkdir(join(dir, 'secret'));
    const target = join(dir, 'secret', 'data.yaml');
    const yaml = (tail: string): string => `apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations: {token: s3cr3t-1}\n${tail}spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\nextra: s3cr3t-2\n`;
    await writeFile(target, yaml(''));
    await symlink(target, path);
    await source.start(sink);
    expect(sink.last()?.services).toEqual(['web']);
    await writeFile(target, yaml('   broken: indent\n'));
    await waitFor(() => lines.some((l) => l.level >= ERROR), 'the parse error to be logged');
    const errors = lines.filter((l) => l.level >= ERROR);
    expect(errors[0]?.msg).toBe(`${path}:6:4: invalid YAML: bad indentation of a mapping entry; the line reads "   broken: indent"; keeping the last good state`);
    expect(JSON.stringify(lines)).not.toContain('s3cr3t');
  });

  it('applies the rest of an edit when the sink throws on one object', async () => {
    class ThrowingSink extends RecordingSink {
      readonly ports = new Map<string, number | undefined>();
      override upsertService(obj: V1Service): void {
        if (obj.metadata?.name === 'boom') throw new Error('sink bug');
        this.ports.set(obj.metadata?.name ?? '', obj.spec?.ports?.[0]?.port);
        super.upsertService(obj);
      }
    }
    const svcs = (port: number): string => list(['boom', 'web'].map((n) => service({ name: n, ports: [{ name: 'http', port }] })));
    const { path, source, lines } = await setup({ initial: svcs(80) });
    const sink = new ThrowingSink();
    await source.start(sink);
    await writeFile(path, svcs(81));
    await waitFor(() => lines.some((l) => l.level >= ERROR), 'the failure to be logged');
    expect(sink.ports.get('web')).toBe(81);
    expect(lines.filter((l) => l.level >= ERROR).map((l) => [l.msg, l.err?.message])).toEqual([['applying the state file failed', 'sink bug']]);
  });

  it('logs at most 20 ignored objects of one read one by one, and counts the rest', async () => {
    const configMaps = Array.from({ length: 500 }, (_, i) => ({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: `cm${i}` } }));
    const { source, sink, lines } = await setup({ initial: list([service({ name: 'web', ports: [{ name: 'http', port: 80 }] }), ...configMaps]) });
    await source.start(sink);
    expect(sink.last()?.services).toEqual(['web']);
    const warnings = lines.filter((l) => l.level === 40);
    expect(warnings).toHaveLength(21);
    expect(warnings[20]?.msg).toMatch(/: 480 more objects ignored \(not logged one by one\)$/);
  });

  it('stops watching on stop()', async () => {
    const { source, sink } = await setup({ initial: state('web') });
    await source.start(sink);
    await source.stop();
    await source.stop();
    expect(sink.applied).toHaveLength(1);
  });
});

/** Writes `content` (as long as what is there) over the file in place and puts its mtime back: the poller cannot see it, inotify can. */
async function writeUnseenByPoller(path: string, content: string): Promise<void> {
  const fh = await open(path, 'r+');
  try {
    await fh.write(content, 0);
  } finally {
    await fh.close();
  }
  await utimes(path, 1_000_000, 1_000_000);
}

describe('FileSource directory watch', () => {
  it('watches the directory again after it was removed and made anew', async () => {
    const { dir, stateDir, path, source, sink } = await setup({ subdir: 'dir', pollIntervalMs: 200 });
    await mkdir(stateDir);
    await writeFile(path, state('aaa'));
    await utimes(path, 1_000_000, 1_000_000);
    await source.start(sink);
    expect(sink.last()?.services).toEqual(['aaa']);
    // The watch sees an edit the poller cannot.
    await writeUnseenByPoller(path, state('bbb'));
    await waitFor(() => sink.last()?.services[0] === 'bbb', 'the edit seen by the directory watch');
    // The directory goes, and comes back with the file. Linux tells the old watch nothing it
    // reports, so only the poller sees this; it has then sampled the new file, so past here
    // only a watch on the new directory can see the edit below.
    await rm(stateDir, { recursive: true });
    await mkdir(stateDir);
    const tmp = join(dir, 'next.json');
    await writeFile(tmp, state('ccc'));
    await utimes(tmp, 1_000_000, 1_000_000);
    await rename(tmp, path);
    await waitFor(() => sink.last()?.services[0] === 'ccc', 'the file in the new directory to be applied');
    await writeUnseenByPoller(path, state('ddd'));
    await waitFor(() => sink.last()?.services[0] === 'ddd', 'the edit seen by a watch on the new directory', 3000);
  });
});
