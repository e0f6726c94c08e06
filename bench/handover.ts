#!/usr/bin/env node
/**
 * Hand-over (`--handover-socket`, docs/handover.md): how long a new process takes from its start
 * to serving, and the longest gap between accepted connections a client sees while the old
 * process hands over, beside the same figure in a quiet second before each swap.
 *
 * Everything runs in a network namespace this script creates (root needed): an echo backend on
 * 127.0.0.1, the proxy CLI (`--portal loopback`, one Service on 127.96.0.50:80), and a prober that
 * opens connections back to back (`--concurrency` loops), each one a request and its answer, and
 * records when each connect completed. `--restarts` swaps, one after another.
 *
 * Run: npm run build && node dist/bench/handover.js [--restarts N] [--concurrency C] [--workers W] [--out DIR]
 * Every process is stopped by its PID; the namespace and the temporary files are removed.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const MAIN = fileURLToPath(new URL('../bundle/main.js', import.meta.url));

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
}
const RESTARTS = arg('restarts', 10);
const CONCURRENCY = arg('concurrency', 4);
const WORKERS = arg('workers', 1);
const outIndex = process.argv.indexOf('--out');
const OUT = outIndex >= 0 ? (process.argv[outIndex + 1] as string) : fileURLToPath(new URL('../../bench/results/', import.meta.url));

const NS = `kup-bench-ho-${process.pid}`;
const children: ChildProcess[] = [];

function ns(cmd: string, args: string[]): void {
  execFileSync('ip', ['netns', 'exec', NS, cmd, ...args], { stdio: 'ignore' });
}

interface Proc {
  child: ChildProcess;
  out: string;
  wait(re: RegExp, timeoutMs?: number): Promise<Record<string, unknown>>;
  exited: Promise<void>;
}

function start(cmd: string, args: string[], input = false): Proc {
  const child = spawn('ip', ['netns', 'exec', NS, cmd, ...args], { stdio: [input ? 'pipe' : 'ignore', 'pipe', 'inherit'] });
  children.push(child);
  const p: Proc = {
    child,
    out: '',
    exited: new Promise((resolve) => child.once('exit', () => resolve())),
    wait(re, timeoutMs = 60_000) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no line matching ${re} in ${timeoutMs} ms:\n${p.out.slice(-2000)}`)), timeoutMs);
        const check = (): void => {
          // Whole lines only: a long one arrives in several chunks.
          const line = p.out.split('\n').slice(0, -1).find((l) => re.test(l));
          if (line === undefined) return;
          clearTimeout(timer);
          child.stdout?.off('data', check);
          resolve(line.startsWith('{') ? (JSON.parse(line) as Record<string, unknown>) : { line });
        };
        child.stdout?.on('data', check);
        check();
      });
    },
  };
  child.stdout?.on('data', (d: Buffer) => {
    p.out += d.toString();
  });
  return p;
}

const BACKEND = `require('node:net').createServer({ allowHalfOpen: true }, (s) => { s.on('error', () => s.destroy()); s.pipe(s); }).listen(18080, '127.0.0.1', () => process.stdout.write('ready\\n'));`;

const PROBER = `
const net = require('node:net');
const [host, port, loops] = process.argv.slice(1);
const at = []; let errors = 0; let stop = false;
process.stdin.on('data', () => { stop = true; });
async function loop() {
  while (!stop) {
    await new Promise((resolve) => {
      const s = net.connect({ host, port: Number(port), allowHalfOpen: true });
      s.on('connect', () => { at.push(Date.now()); s.end('x'); });
      s.on('data', () => undefined);
      s.on('end', () => { s.destroy(); resolve(); });
      s.on('error', () => { errors++; resolve(); });
    });
  }
}
process.stdout.write('probing\\n');
Promise.all(Array.from({ length: Number(loops) }, loop)).then(() => process.stdout.write('DONE ' + JSON.stringify({ at, errors }) + '\\n'));`;

/** The longest gap between consecutive accepts within [from, to]. */
function longestGap(at: readonly number[], from: number, to: number): number {
  let prev: number | undefined;
  let gap = 0;
  for (const t of at) {
    if (t < from) {
      prev = t;
      continue;
    }
    if (t > to) {
      if (prev !== undefined) gap = Math.max(gap, Math.min(t, to) - prev);
      break;
    }
    if (prev !== undefined) gap = Math.max(gap, t - prev);
    prev = t;
  }
  return gap;
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};

async function main(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'kup-bench-ho-'));
  try {
    execFileSync('ip', ['netns', 'add', NS]);
    ns('ip', ['link', 'set', 'lo', 'up']);
    const state = join(dir, 'state.json');
    writeFileSync(state, JSON.stringify({
      apiVersion: 'v1', kind: 'List', items: [
        { apiVersion: 'v1', kind: 'Service', metadata: { name: 'echo', namespace: 'default', uid: 'u1' }, spec: { type: 'ClusterIP', clusterIP: '10.96.0.50', clusterIPs: ['10.96.0.50'], ports: [{ name: 'tcp', port: 80, protocol: 'TCP', targetPort: 18080 }] } },
        { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'echo-1', namespace: 'default', labels: { 'kubernetes.io/service-name': 'echo' } }, addressType: 'IPv4', ports: [{ name: 'tcp', port: 18080, protocol: 'TCP' }], endpoints: [{ addresses: ['127.0.0.1'], conditions: { ready: true } }] },
      ],
    }));
    const backend = start(process.execPath, ['-e', BACKEND]);
    await backend.wait(/ready/);
    const args = [MAIN, '--portal', 'loopback', '--state', state, '--handover-socket', join(dir, 'h.sock'), '--shutdown-grace-period', '1m', '--workers', String(WORKERS)];
    let current = start(process.execPath, args);
    await current.wait(/answering hand-overs/);
    const prober = start(process.execPath, ['-e', PROBER, '127.96.0.50', '80', String(CONCURRENCY)], true);
    await prober.wait(/probing/);
    const swaps: Array<{ spawnedAt: number; startedAt: number; servingAt: number; handedAt: number }> = [];
    for (let i = 0; i < RESTARTS; i++) {
      await new Promise((r) => setTimeout(r, 1000));
      const spawnedAt = Date.now();
      const next = start(process.execPath, args);
      const started = await next.wait(/kube-userspace-proxy started/);
      const serving = await next.wait(/took over from the previous process/);
      const handed = await current.wait(/handed over/);
      await next.wait(/answering hand-overs/);
      // pino's time is an ISO string (src/log.ts), to the millisecond.
      const when = (line: Record<string, unknown>): number => Date.parse(line.time as string);
      swaps.push({ spawnedAt, startedAt: when(started), servingAt: when(serving), handedAt: when(handed) });
      current = next;
    }
    await new Promise((r) => setTimeout(r, 1000));
    prober.child.stdin?.end('stop\n');
    const done = await prober.wait(/^DONE /);
    const { at, errors } = JSON.parse((done.line as string).slice(5)) as { at: number[]; errors: number };
    at.sort((a, b) => a - b);
    const startToServing = swaps.map((s) => s.servingAt - s.spawnedAt);
    const startToStarted = swaps.map((s) => s.startedAt - s.spawnedAt);
    const swapGap = swaps.map((s) => longestGap(at, s.spawnedAt, s.handedAt + 500));
    const quietGap = swaps.map((s) => longestGap(at, s.spawnedAt - 900, s.spawnedAt));
    const f = (xs: number[]): string => `median ${median(xs).toFixed(0)} ms, max ${Math.max(...xs).toFixed(0)} ms`;
    return [
      `hand-over bench: ${RESTARTS} restarts, --workers ${WORKERS}, ${CONCURRENCY} probe loops; ${cpus().length} cores, load ${loadavg().map((l) => l.toFixed(2)).join(' ')}`,
      `new process start -> serving (took over):      ${f(startToServing)}`,
      `new process start -> first sync (started):     ${f(startToStarted)}`,
      `longest gap between accepts during a swap:     ${f(swapGap)}`,
      `longest gap between accepts, quiet second:     ${f(quietGap)}`,
      `connections accepted: ${at.length}; failed: ${errors}`,
    ].join('\n');
  } finally {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await Promise.all(children.map((c) => (c.exitCode === null && c.signalCode === null ? new Promise<void>((r) => c.once('exit', () => r())) : Promise.resolve())));
    try {
      execFileSync('ip', ['netns', 'del', NS], { stdio: 'ignore' });
    } catch {
      // already gone
    }
    rmSync(dir, { recursive: true, force: true });
  }
}

main().then((report) => {
  process.stdout.write(`${report}\n`);
  mkdirSync(OUT, { recursive: true });
  const file = join(OUT, `handover-${new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19)}Z.txt`);
  writeFileSync(file, `${report}\n`);
  process.stdout.write(`written to ${file}\n`);
}, (err: unknown) => {
  process.stderr.write(`handover bench: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
});
