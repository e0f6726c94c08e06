import { spawnSync } from 'node:child_process';
import { closeSync, fstatSync, mkdirSync, openSync, readFileSync, readSync, renameSync, writeFileSync, writeSync } from 'node:fs';
import { descriptorBudget } from '../../src/core/descriptor-budget.js';
import { join } from 'node:path';
import type { Context } from './context.js';
import { BACKEND_HOST, MOVED_HOST, PROBE_PORT, SCALE_ADMIN, SCALE_LOOPBACK_PREFIX, SCALE_PORT, SERVICES, type HostPort } from './plan.js';
import { httpOnce } from './probe.js';
import { cpuSeconds, rssBytes, sleep, sockets, waitUntil, type Started } from './proc.js';
import { scaleClusterIP, ScaleState, type Formatting } from './state-file.js';
import { spawnProxy } from './systems.js';
import { has, path } from './tools.js';

/**
 * A proxy serving thousands of Services for the scale runs: started from a state file or from an
 * API server, timed until every Service port listens. Service 0 is the probe: its one endpoint is
 * nginx at BACKEND_HOST (answering `A`) or MOVED_HOST (`B`), so a move is seen by the first new
 * connection answered by the other.
 */

export const MB = 1024 * 1024;
/** Where the probe Service is reached (its ClusterIP, served on loopback by --portal loopback). */
export const PROBE_TARGET: HostPort = { host: scaleClusterIP(0).replace(/^10\./, '127.'), port: SCALE_PORT };
export const PROBE_ANSWER: Readonly<Record<string, string>> = { [BACKEND_HOST]: 'A', [MOVED_HOST]: 'B' };

/** A state of `services` Services, `endpoints` each, the probe at BACKEND_HOST. */
export function scaleStateFor(services: number, endpoints: number, formatting: Formatting): ScaleState {
  return new ScaleState({ services, endpoints, targetPort: SERVICES.http.port, probeEndpoint: { ip: BACKEND_HOST, port: PROBE_PORT }, formatting });
}

/** Listening sockets on the scale port of the scale addresses (one per address and worker). */
export function listeningScalePorts(): number {
  let n = 0;
  const prefix = `${SCALE_LOOPBACK_PREFIX}.`;
  for (const s of sockets('tcp')) if (s.state === '0A' && s.port === SCALE_PORT && s.host.startsWith(prefix)) n++;
  return n;
}

/**
 * A check, cheap to call often, of whether the proxy's log has a line with this msg at or after
 * `since` (epoch ms): each call reads only the bytes added since the last.
 */
function logFollower(logFile: string, msg: string, since: number): () => boolean {
  let offset = 0;
  let partial = '';
  let found = false;
  const chunk = Buffer.alloc(1 << 16);
  return () => {
    if (found) return true;
    let fd: number;
    try {
      fd = openSync(logFile, 'r');
    } catch {
      return false;
    }
    try {
      const size = fstatSync(fd).size;
      while (offset < size) {
        const n = readSync(fd, chunk, 0, chunk.length, offset);
        if (n === 0) break;
        offset += n;
        const lines = (partial + chunk.toString('utf8', 0, n)).split('\n');
        partial = lines.pop() ?? '';
        if (lines.some((line) => isRecordOf(line, msg, since))) {
          found = true;
          break;
        }
      }
    } finally {
      closeSync(fd);
    }
    return found;
  };
}

function isRecordOf(line: string, msg: string, since: number): boolean {
  if (!line.includes(`"msg":"${msg}"`)) return false;
  try {
    const rec = JSON.parse(line) as { time?: string | number };
    const t = typeof rec.time === 'number' ? rec.time : Date.parse(rec.time ?? '');
    return t >= Math.floor(since);
  } catch {
    return false;
  }
}

interface LogRecord {
  time: number;
  msg: string;
  [k: string]: unknown;
}

/** The proxy's pino lines with this msg at or after `since` (epoch ms). */
export function logRecords(logFile: string, msg: string, since: number): LogRecord[] {
  let text = '';
  try {
    text = readFileSync(logFile, 'utf8');
  } catch {
    return [];
  }
  const out: LogRecord[] = [];
  for (const line of text.split('\n')) {
    if (!line.includes(`"msg":"${msg}"`)) continue;
    try {
      const rec = JSON.parse(line) as { time?: string | number } & Record<string, unknown>;
      const t = typeof rec.time === 'number' ? rec.time : Date.parse(rec.time ?? '');
      // pino's isoTime has millisecond resolution; the harness's clock reading has more.
      if (t >= Math.floor(since)) out.push({ ...rec, time: t, msg });
    } catch {
      // not JSON
    }
  }
  return out;
}

/**
 * The first such line, waiting (bounded) for it: the proxy's log reaches its file a little after
 * what it logs has taken effect, so a probe can see a change before its line is there.
 */
export async function firstLogRecord(logFile: string, msg: string, since: number, timeoutMs = 2000): Promise<LogRecord | undefined> {
  const end = performance.now() + timeoutMs;
  for (;;) {
    const first = logRecords(logFile, msg, since)[0];
    if (first !== undefined || performance.now() >= end) return first;
    await sleep(10);
  }
}

/** Milliseconds from `since` (epoch ms) to the first log line with this msg at or after it. */
export function logTimeOf(logFile: string, msg: string, since: number): number {
  const first = logRecords(logFile, msg, since)[0];
  return first === undefined ? NaN : first.time - since;
}

export function writeByRename(file: string, bytes: Buffer): void {
  writeFileSync(`${file}.tmp`, bytes);
  renameSync(`${file}.tmp`, file);
}

/**
 * As `kubectl get -o json > file` writes it: the shell empties the file, kubectl writes it some
 * time later (`gapMs`, its round trip to the API server), a MiB at a time. Returns when the last
 * byte is written.
 */
export async function writeInPlace(file: string, buf: Buffer, gapMs: number): Promise<void> {
  const fd = openSync(file, 'w');
  try {
    if (gapMs > 0) await sleep(gapMs);
    for (let at = 0; at < buf.length; at += MB) writeSync(fd, buf, at, Math.min(MB, buf.length - at));
  } finally {
    closeSync(fd);
  }
}

export interface ScaleProxy {
  started: Started;
  logFile: string;
  /** Start-up figures: listenMs, tableMs, cpuMs, loadedMs, syncedMs, rssMB. */
  metrics: Record<string, number>;
}

export interface ScaleProxyStart {
  services: number;
  /** File-name-safe, unique per proxy of a run. */
  tag: string;
  /** Serve this state file, or watch the API server this kubeconfig names. */
  stateFile?: string;
  kubeconfig?: string;
  /** How long to wait for every port (default 180 s). */
  timeoutMs?: number;
  /** Worker processes (--workers N; default 1): each listens on every port (SO_REUSEPORT). */
  workers?: number;
}

/**
 * Start a proxy and resolve once every one of its `services` ports listens, with the start-up
 * figures. Refuses to start while something else listens on the scale addresses (another run of
 * this harness on the same machine): its sockets would be counted as this proxy's.
 */
export async function startScaleProxy(ctx: Context, s: ScaleProxyStart): Promise<ScaleProxy> {
  const { nofile, listeners } = openFilesFor(ctx, s.services);
  if (listeners < s.services) ctx.say(`    the open-file limit lets the proxy open ${listeners} of ${s.services} listeners, and it cannot be raised here: timing those`);
  // The figures are read from the proxy's info lines (loaded, synced): without them every wait
  // would run to its timeout.
  const args = ctx.options.proxyArgs;
  const level = args.flatMap((a, i) => (a.startsWith('--log-level=') ? [a.slice(12)] : a === '--log-level' ? [args[i + 1] ?? ''] : [])).at(-1);
  if (level !== undefined && !['trace', 'debug', 'info'].includes(level)) throw new Error(`the scale rows read the proxy's info lines; --log-level ${level} hides them`);
  const busy = listeningScalePorts();
  if (busy > 0) throw new Error(`${busy} sockets already listen on ${SCALE_LOOPBACK_PREFIX}.*:${SCALE_PORT} (another bench run?); not measuring`);
  const dir = join(ctx.tmp, `scale-${s.tag}`);
  mkdirSync(dir, { recursive: true });
  const logFile = join(dir, 'out.log');
  const workers = s.workers ?? 1;
  const wall0 = Date.now();
  const t0 = performance.now();
  let listenedAt = t0;
  let tableAt = t0;
  const started = spawnProxy(ctx, {
    name: `proxy with ${s.services} Services`,
    workers,
    slug: `proxy-scale-${s.tag}`,
    ...(s.kubeconfig !== undefined ? { kubeconfig: s.kubeconfig } : { stateFile: s.stateFile ?? '' }),
    admin: SCALE_ADMIN,
    extraArgs: ctx.options.proxyArgs,
    logFile,
    ...(nofile !== undefined ? { nofile } : {}),
  });
  try {
    // The figures below read the first sync's log line (and, with fewer listeners than Services,
    // it says the rest were refused). The proxy writes it once every port listens; the socket
    // table then confirms it. The table is read only after the line: at 10,000 sockets one read
    // of /proc/net/tcp costs some 40 ms of CPU, mostly the kernel's, so reading it every 10 ms
    // while the proxy starts took most of a core from it and lengthened the very start it timed
    // (by 300-500 ms at 10,000 Services on this machine kind, thirteenth session).
    // Only what the log gained since the last look is read: past the open-file limit the sync
    // writes a line per refused Service (18,000 at 30,000 Services), and reading the whole log
    // every 10 ms would be the harness competing with the start again.
    const synced = logFollower(logFile, 'synced proxy rules', wall0);
    const timeoutMs = s.timeoutMs ?? 180_000;
    await waitUntil(synced, 'the first sync', timeoutMs, { everyMs: 10, process: started });
    listenedAt = performance.now();
    // Each worker listens on every port: the socket table lists one socket per worker. Short of
    // them (a proxy that logged its sync early), the time is taken when the table has them all.
    if (listeningScalePorts() < listeners * workers) {
      await waitUntil(() => listeningScalePorts() >= listeners * workers, `${listeners} service ports listening`, timeoutMs, { everyMs: 10, process: started });
      listenedAt = performance.now();
    }
    tableAt = performance.now();
  } catch (err) {
    await started.stop();
    throw err;
  }
  const listenMs = listenedAt - t0;
  // CPU time next to wall time: on a shared machine the gap is time spent waiting for a core.
  const cpuMs = cpuSeconds([started.pid]) * 1000;
  const rssMB = rssBytes([started.pid]) / MB;
  const loaded = s.kubeconfig !== undefined ? 'synced proxy rules' : 'loaded state file';
  return {
    started,
    logFile,
    metrics: { listenMs, tableMs: tableAt - t0, cpuMs, loadedMs: logTimeOf(logFile, loaded, wall0), syncedMs: logTimeOf(logFile, 'synced proxy rules', wall0), rssMB, listening: listeners },
  };
}

/** The soft open-file limit this process runs with (inherited by what it starts). */
function openFileLimit(): { soft: number; hard: number } {
  const line = readFileSync('/proc/self/limits', 'utf8').split('\n').find((l) => l.startsWith('Max open files')) ?? '';
  const [soft, hard] = line.replace('Max open files', '').trim().split(/\s+/).map((v) => (v === 'unlimited' ? Infinity : Number(v)));
  return { soft: soft ?? NaN, hard: hard ?? NaN };
}

/**
 * How a proxy serving `services` Services is to be started, given the open-file limit: it needs a
 * listening socket each, and room for connections. With too low a limit the proxy bounds its
 * listeners to what the limit leaves (core/descriptor-budget.ts) and serves only that many, so
 * the limit is raised with prlimit when the harness may (root with CAP_SYS_RESOURCE, or within
 * the hard limit); when it may not, the run waits for as many listeners as the proxy will open
 * and says so (`listening` below `services`).
 */
function openFilesFor(ctx: Context, services: number): { nofile?: number; listeners: number } {
  const need = services + 10_000;
  const { soft, hard } = openFileLimit();
  if (need <= soft) return { listeners: services };
  if (has(ctx.tools, 'prlimit') && (need <= hard || mayRaise(path(ctx.tools, 'prlimit'), need))) return { nofile: need, listeners: services };
  return { listeners: Math.min(services, descriptorBudget(soft).maxListeners) };
}

const raisable = new Map<number, boolean>();

/** Whether prlimit may set this limit (a container without CAP_SYS_RESOURCE may not exceed its hard limit). */
function mayRaise(prlimit: string, n: number): boolean {
  let ok = raisable.get(n);
  if (ok === undefined) {
    ok = spawnSync(prlimit, [`--nofile=${n}:${n}`, '--', 'true'], { stdio: 'ignore', timeout: 5000 }).status === 0;
    raisable.set(n, ok);
  }
  return ok;
}

/** The probe Service's answer now: `A` or `B`; throws when it does not answer. */
export function probeOnce(timeoutMs = 2000): Promise<string> {
  return httpOnce(PROBE_TARGET, timeoutMs);
}

/**
 * Probe on fresh connections until `body` answers; then `tailMs` more to catch stragglers on the
 * old endpoint. Back to back, or `spacingMs` apart (the churn runs, whose CPU figure should be the
 * proxy's work, not the probes'). Times are from `t0` (performance.now()), counted when an answer
 * arrived, not when its probe set out: a connection made while the proxy was busy waits in the
 * listen backlog and is routed only afterwards.
 */
export async function probeUntil(body: string, t0: number, timeoutMs: number, opts: { spacingMs?: number; tailMs?: number } = {}): Promise<{ moveMs?: number; stale: number; probes: number; errors: number; firstError?: string }> {
  const tailMs = opts.tailMs ?? 200;
  let moveMs: number | undefined;
  let stale = 0;
  let probes = 0;
  let errors = 0;
  let firstError: string | undefined;
  while (performance.now() - t0 < timeoutMs && probes < 200_000) {
    probes++;
    const sent = performance.now();
    let answer: string;
    try {
      answer = await probeOnce(2000);
    } catch (err) {
      errors++;
      firstError ??= (err as Error).message;
      if (errors > 1000) break;
      await sleep(opts.spacingMs ?? 0);
      continue;
    }
    if (answer === body) moveMs ??= performance.now() - t0;
    else if (moveMs !== undefined) stale++;
    if (moveMs !== undefined && performance.now() - t0 >= moveMs + tailMs) break;
    const wait = (opts.spacingMs ?? 0) - (performance.now() - sent);
    if (wait > 0) await sleep(wait);
  }
  const tail = firstError === undefined ? {} : { firstError };
  return moveMs === undefined ? { stale, probes, errors, ...tail } : { moveMs, stale, probes, errors, ...tail };
}
