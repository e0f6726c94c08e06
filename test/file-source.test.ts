import { mkdtemp, mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, it, expect } from 'vitest';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { FileSource } from '../src/io/kube/file-source.js';
import type { StateSink } from '../src/seams/state-sink.js';
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

async function setup(opts: { pollIntervalMs?: number; debounceMs?: number; subdir?: string; initial?: string } = {}) {
  const dir = await mkdtemp(join(tmpdir(), 'kup-file-source-'));
  dirs.push(dir);
  const stateDir = opts.subdir ? join(dir, opts.subdir) : dir;
  const path = join(stateDir, 'state.json');
  if (opts.initial !== undefined) await writeFile(path, opts.initial);
  const { logger, lines } = captureLogger();
  const source = new FileSource({ path, logger, debounceMs: opts.debounceMs ?? 20, pollIntervalMs: opts.pollIntervalMs ?? 100 });
  sources.push(source);
  const sink = new RecordingSink();
  return { dir, stateDir, path, source, sink, lines };
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

  it('stops watching on stop()', async () => {
    const { source, sink } = await setup({ initial: state('web') });
    await source.start(sink);
    await source.stop();
    await source.stop();
    expect(sink.applied).toHaveLength(1);
  });
});
