import { readFileSync } from 'node:fs';
import { chmod, mkdir, readFile, readdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HEAP_TUNING, V8_HEAP_FLAGS, heapTuningEnv, heapTuningFlags, underDebugger } from '../src/core/heap-tuning.js';
import { endpointSlice, list, service } from './helpers/objects.js';
import { freePort, tcpEchoServer, tcpRequest, waitFor } from './helpers/net.js';
import { runCli, type Spawned } from './helpers/cli.js';

describe('heapTuningEnv', () => {
  it('adds the settings to the environment on Linux', () => {
    expect(heapTuningEnv('linux', { PATH: '/bin', HOME: undefined })).toEqual({ PATH: '/bin', ...HEAP_TUNING });
  });
  it('leaves a process that has them (the image, or the second pass) alone', () => {
    expect(heapTuningEnv('linux', { ...HEAP_TUNING })).toBeUndefined();
  });
  it("respects the user's own choice of either setting or of a glibc tunable", () => {
    expect(heapTuningEnv('linux', { MALLOC_TRIM_THRESHOLD_: '131072' })).toBeUndefined();
    expect(heapTuningEnv('linux', { MALLOC_TOP_PAD_: '0' })).toBeUndefined();
    expect(heapTuningEnv('linux', { GLIBC_TUNABLES: 'glibc.malloc.trim_threshold=131072' })).toBeUndefined();
    expect(heapTuningEnv('linux', { GLIBC_TUNABLES: 'glibc.pthread.rseq=0' })).toMatchObject(HEAP_TUNING);
  });
  it('does nothing elsewhere than Linux', () => {
    expect(heapTuningEnv('darwin', {})).toBeUndefined();
  });
});

describe('heapTuningFlags', () => {
  it("adds V8's young-generation size to a process started without it", () => {
    expect(heapTuningFlags([], undefined)).toEqual([...V8_HEAP_FLAGS]);
    expect(heapTuningFlags(['--enable-source-maps'], '--no-warnings')).toEqual([...V8_HEAP_FLAGS]);
  });
  it('leaves a process that has them (the second pass) alone', () => {
    expect(heapTuningFlags([...V8_HEAP_FLAGS], undefined)).toEqual([]);
  });
  it("respects the user's own sizing, on the command line or in NODE_OPTIONS, in either spelling", () => {
    expect(heapTuningFlags(['--max-semi-space-size=64'], undefined)).toEqual([]);
    expect(heapTuningFlags([], '--no-warnings --max_semi_space_size=32')).toEqual([]);
    expect(heapTuningFlags(['--min-semi-space-size=8'], undefined)).toEqual([]);
    expect(heapTuningFlags([], '--max-heap-size=512')).toEqual([]);
    expect(heapTuningFlags(['--max-old-space-size=512'], undefined)).toEqual([...V8_HEAP_FLAGS]);
    // node accepts a quoted word in NODE_OPTIONS, and honours it
    expect(heapTuningFlags([], '--no-warnings "--max-semi-space-size=4"')).toEqual([]);
  });
});

describe('underDebugger', () => {
  it('sees --inspect on the command line and in NODE_OPTIONS, which node leaves out of execArgv', () => {
    expect(underDebugger(['--inspect-brk=0.0.0.0:9229'], undefined)).toBe(true);
    expect(underDebugger([], '--no-warnings --inspect=127.0.0.1:0')).toBe(true);
    expect(underDebugger([], '"--inspect-wait"')).toBe(true);
    expect(underDebugger(['--enable-source-maps'], '--max-semi-space-size=16')).toBe(false);
  });
});

describe('the image', () => {
  it('starts node with the same young-generation size, so that the binary need not re-execute itself for it', () => {
    const dockerfile = readFileSync(new URL('../Dockerfile', import.meta.url), 'utf8');
    const nodeOptions = /^ENV NODE_OPTIONS=(.*)$/m.exec(dockerfile)?.[1];
    expect(nodeOptions?.split(/\s+/)).toEqual([...V8_HEAP_FLAGS]);
    expect(heapTuningFlags([], nodeOptions)).toEqual([]);
    // And glibc's settings: with both in the environment, nothing is left to re-execute for.
    const malloc: Record<string, string> = Object.fromEntries([...dockerfile.matchAll(/\b(MALLOC_[A-Z_]+)=(\S+)/g)].map((m) => [m[1] as string, m[2] as string]));
    expect(malloc).toEqual(HEAP_TUNING);
    expect(heapTuningEnv('linux', { PATH: '/usr/bin', ...malloc })).toBeUndefined();
  });
});

/** The command line of a running process. */
async function cmdlineOf(pid: number): Promise<string[]> {
  return (await readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0').filter(Boolean);
}

/** The environment the kernel holds for a running process (what glibc read at its start). */
async function environOf(pid: number): Promise<Record<string, string>> {
  const raw = await readFile(`/proc/${pid}/environ`, 'utf8');
  return Object.fromEntries(raw.split('\0').filter(Boolean).map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
}

describe.runIf(process.platform === 'linux')('the binary started directly', () => {
  let dir: string;
  const running: Spawned[] = [];
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-heap-'));
  });
  afterAll(async () => {
    for (const r of running) r.kill();
    await rm(dir, { recursive: true, force: true });
  });

  async function serve(env: NodeJS.ProcessEnv): Promise<{ r: Spawned; port: number }> {
    const backend = await tcpEchoServer('127.0.31.1', 'heap');
    const port = await freePort('127.96.31.1');
    const stateFile = join(dir, `state-${running.length}.yaml`);
    await writeFile(stateFile, list([
      service({ name: 'bulk', clusterIP: '10.96.31.1', ports: [{ name: 'tcp', port }] }),
      endpointSlice({ service: 'bulk', ports: [{ name: 'tcp', port: backend.port }], endpoints: [{ ip: '127.0.31.1' }] }),
    ]));
    const r = runCli(['--state', stateFile, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0'], { env });
    running.push(r);
    await r.waitForLine(/kube-userspace-proxy started/);
    expect(await tcpRequest('127.96.31.1', port, 'x')).toBe('heap:x');
    await backend.close();
    return { r, port };
  }

  it('runs with the heap settings, in the same process (same PID), serving as usual', async () => {
    const env = { ...process.env };
    for (const name of Object.keys(HEAP_TUNING)) delete env[name];
    delete env.NODE_OPTIONS; // one that sized the heap would leave the flag out (the next test)
    const { r } = await serve(env);
    const environ = await environOf(r.child.pid as number);
    expect(environ).toMatchObject(HEAP_TUNING);
    expect(await cmdlineOf(r.child.pid as number)).toEqual(expect.arrayContaining([...V8_HEAP_FLAGS]));
    expect(r.stderr()).not.toMatch(/could not re-execute|ExperimentalWarning/);
    r.child.kill('SIGTERM');
    expect(await r.exited).toBe(0);
  });

  it('writes V8\'s compile cache where NODE_COMPILE_CACHE says once it serves, not only at exit', async () => {
    const cache = join(dir, 'compile-cache');
    const cached = async (): Promise<number> => (await readdir(cache, { recursive: true }).catch(() => [])).length;
    const { r } = await serve({ ...process.env, NODE_COMPILE_CACHE: cache });
    // The bundle's chunks that a start loads (rolldown.config.js): a dozen or so entries.
    await waitFor(async () => ((await cached()) > 8 ? true : undefined), 'compile cache entries', 10_000);
    // A proxy that is killed keeps what it wrote after start-up.
    r.child.kill('SIGKILL');
    await r.exited;
    expect(await cached()).toBeGreaterThan(8);
  });

  it('without NODE_COMPILE_CACHE, keeps the cache in a directory of its own user under TMPDIR, closed to others; one open to others is not used', async () => {
    const uid = process.getuid?.() ?? 'user';
    const cached = async (d: string): Promise<number> => (await readdir(d, { recursive: true }).catch(() => [])).length;
    const env = (tmp: string): NodeJS.ProcessEnv => {
      const e: NodeJS.ProcessEnv = { ...process.env, TMPDIR: tmp };
      delete e.NODE_COMPILE_CACHE;
      return e;
    };
    const mine = join(dir, 'tmp-private');
    await mkdir(mine);
    const made = join(mine, `kube-userspace-proxy-compile-cache-${uid}`);
    const a = await serve(env(mine));
    await waitFor(async () => ((await cached(made)) > 8 ? true : undefined), 'compile cache entries', 10_000);
    expect((await stat(made)).mode & 0o777).toBe(0o700);
    a.r.child.kill('SIGTERM');
    expect(await a.r.exited).toBe(0);
    // Made by someone else first, or open to others: code cache is code, so it is left alone.
    const open = join(dir, 'tmp-open');
    const planted = join(open, `kube-userspace-proxy-compile-cache-${uid}`);
    await mkdir(planted, { recursive: true });
    await chmod(planted, 0o777);
    const b = await serve(env(open));
    b.r.child.kill('SIGTERM');
    expect(await b.r.exited).toBe(0);
    expect(await cached(planted)).toBe(0);
    expect(await readdir(open)).toEqual([`kube-userspace-proxy-compile-cache-${uid}`]);
  });

  it("keeps the user's own young-generation size (NODE_OPTIONS), and re-executes for the young generation alone when the environment has the rest", async () => {
    const own = await serve({ ...process.env, NODE_OPTIONS: '--max-semi-space-size=32' });
    const ownCmdline = await cmdlineOf(own.r.child.pid as number);
    expect(ownCmdline.some((a) => /semi-space/.test(a))).toBe(false);
    own.r.child.kill('SIGTERM');
    expect(await own.r.exited).toBe(0);
    const env: NodeJS.ProcessEnv = { ...process.env, ...HEAP_TUNING };
    delete env.NODE_OPTIONS;
    const tuned = await serve(env);
    expect(await cmdlineOf(tuned.r.child.pid as number)).toEqual(expect.arrayContaining([...V8_HEAP_FLAGS]));
    tuned.r.child.kill('SIGTERM');
    expect(await tuned.r.exited).toBe(0);
  });

  it('keeps a value the user set', async () => {
    const env: NodeJS.ProcessEnv = { ...process.env, MALLOC_TRIM_THRESHOLD_: '131072' };
    delete env.MALLOC_TOP_PAD_;
    const { r } = await serve(env);
    const environ = await environOf(r.child.pid as number);
    expect(environ.MALLOC_TRIM_THRESHOLD_).toBe('131072');
    expect(environ.MALLOC_TOP_PAD_).toBeUndefined();
    r.child.kill('SIGTERM');
    expect(await r.exited).toBe(0);
  });
});
