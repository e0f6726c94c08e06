import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync, readdirSync } from 'node:fs';
import { parseProcNet, parseProcStat, parseVmRss, tail, type ProcNetSocket } from './parse.js';

/**
 * Processes the harness starts: every one is recorded here and stopped by its own PID (SIGTERM,
 * then SIGKILL after a bounded wait), never by name. With pinning on, each runs under
 * `taskset -c CPU`, which execs the program, so the PID is the program's own.
 */

export interface Pinning {
  /** taskset's path, or undefined when pinning is off. */
  taskset: string | undefined;
  /** The core(s) the proxies run on, in taskset's list syntax. */
  proxyCpus: string;
  /** The core(s) the backends, load generators and the harness itself run on. */
  loadCpus: string;
}

export interface Started {
  readonly name: string;
  readonly pid: number;
  readonly logFile: string;
  readonly exited: Promise<string>;
  running(): boolean;
  /** The end of its log, for error messages. */
  logTail(): string;
  stop(): Promise<void>;
}

function pinned(pin: Pinning, cpus: string | undefined, cmd: string, args: readonly string[]): [string, string[]] {
  if (pin.taskset === undefined || cpus === undefined) return [cmd, [...args]];
  return [pin.taskset, ['-c', cpus, cmd, ...args]];
}

export class Processes {
  private readonly live = new Set<{ started: Started; child: ChildProcess }>();

  constructor(private readonly pin: Pinning) {}

  start(name: string, cmd: string, args: readonly string[], opts: { cpu?: string; logFile: string; env?: NodeJS.ProcessEnv }): Started {
    const fd = openSync(opts.logFile, 'a');
    const [file, argv] = pinned(this.pin, opts.cpu, cmd, args);
    const child = spawn(file, argv, { stdio: ['ignore', fd, fd], env: opts.env ?? process.env });
    closeSync(fd);
    if (child.pid === undefined) throw new Error(`cannot start ${name} (${cmd})`);
    const pid = child.pid;
    let done = false;
    const exited = new Promise<string>((resolve) => {
      child.once('exit', (code, signal) => {
        done = true;
        resolve(signal ?? String(code));
      });
      child.once('error', (err) => {
        done = true;
        resolve(`error: ${err.message}`);
      });
    });
    const entry = { child, started: undefined as unknown as Started };
    const started: Started = {
      name,
      pid,
      logFile: opts.logFile,
      exited,
      running: () => !done,
      logTail: () => {
        try {
          return tail(readFileSync(opts.logFile, 'utf8'), 8);
        } catch {
          return '';
        }
      },
      stop: async () => {
        if (!done) {
          child.kill('SIGTERM');
          if ((await Promise.race([exited, sleep(5000).then(() => 'timeout')])) === 'timeout') {
            child.kill('SIGKILL');
            await Promise.race([exited, sleep(2000)]);
          }
        }
        this.live.delete(entry);
      },
    };
    entry.started = started;
    this.live.add(entry);
    return started;
  }

  async stopAll(): Promise<void> {
    await Promise.all([...this.live].map((e) => e.started.stop()));
  }

  /**
   * For exit paths that cannot wait for events: SIGTERM each process still running, by its PID,
   * then SIGKILL what is left half a second later. SIGTERM first, because an nginx master killed
   * outright leaves its workers behind, still listening on the bench's addresses.
   */
  killAllNow(): void {
    const running = [...this.live].filter((e) => e.started.running());
    for (const e of running) e.child.kill('SIGTERM');
    if (running.length === 0) return;
    // A blocking wait: the caller exits right after, so the event loop will not run again.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 500);
    for (const e of running) {
      if (e.child.pid !== undefined && isAlive(e.child.pid)) e.child.kill('SIGKILL');
    }
  }

  /** Run a tool to completion (bounded by `timeoutMs`), pinned to `cpu`. */
  run(cmd: string, args: readonly string[], opts: { cpu?: string; timeoutMs: number }): Promise<{ code: number; stdout: string; stderr: string }> {
    const [file, argv] = pinned(this.pin, opts.cpu, cmd, args);
    return new Promise((resolve) => {
      execFile(file, argv, { timeout: opts.timeoutMs, killSignal: 'SIGKILL', maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
        const code = err === null ? 0 : typeof err.code === 'number' ? err.code : 1;
        resolve({ code, stdout, stderr: err && err.killed ? `${stderr}\n(killed after ${opts.timeoutMs} ms)` : stderr });
      });
    });
  }
}

/** Whether a process (that this harness started) still exists; a zombie not yet reaped counts as gone. */
function isAlive(pid: number): boolean {
  try {
    return parseProcStatState(readFileSync(`/proc/${pid}/stat`, 'utf8')) !== 'Z';
  } catch {
    return false;
  }
}

function parseProcStatState(text: string): string {
  return text.slice(text.lastIndexOf(')') + 2, text.lastIndexOf(')') + 3);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Pin this process (all its threads) to `cpu`, so the harness's own work stays off the proxy core. */
export function pinSelf(pin: Pinning): void {
  if (pin.taskset === undefined) return;
  execFileSync(pin.taskset, ['-a', '-p', '-c', pin.loadCpus, String(process.pid)], { stdio: 'ignore' });
}

/**
 * Poll `check` every `everyMs` until it returns true; throws after `timeoutMs`, or at once when a
 * process it depends on has exited (with the end of that process's log).
 */
export async function waitUntil(check: () => boolean | Promise<boolean>, what: string, timeoutMs: number, opts: { everyMs?: number; process?: Started } = {}): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (opts.process && !opts.process.running()) throw new Error(`${opts.process.name} exited while waiting for ${what}: ${opts.process.logTail()}`);
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${opts.process ? `: ${opts.process.logTail()}` : ''}`);
    await sleep(opts.everyMs ?? 20);
  }
}

export function sockets(proto: 'tcp' | 'udp'): ProcNetSocket[] {
  return parseProcNet(readFileSync(`/proc/net/${proto}`, 'utf8'));
}

/** Whether some socket is bound to host:port (listening, for TCP). */
export function isBound(proto: 'tcp' | 'udp', host: string, port: number): boolean {
  return sockets(proto).some((s) => s.port === port && (s.host === host || s.host === '0.0.0.0') && (proto === 'udp' || s.state === '0A'));
}

/** The first of these addresses something already listens on (another program, a leftover run). */
export function inUse(addrs: ReadonlyArray<{ proto: 'tcp' | 'udp'; host: string; port: number }>): string | undefined {
  const hit = addrs.find((a) => isBound(a.proto, a.host, a.port));
  return hit && `${hit.host}:${hit.port}/${hit.proto} is already in use by another process`;
}

/** A process and all its descendants (nginx's master and workers). */
function tree(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const { ppid } = parseProcStat(readFileSync(`/proc/${entry}/stat`, 'utf8'));
      const list = children.get(ppid) ?? [];
      list.push(Number(entry));
      children.set(ppid, list);
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  const stack = [root];
  while (stack.length > 0) {
    const pid = stack.pop() as number;
    out.push(pid);
    stack.push(...(children.get(pid) ?? []));
  }
  return out;
}

/** USER_HZ: 100 on every Linux architecture Node runs on. */
const TICKS_PER_SECOND = 100;

/** CPU seconds (user + system) used so far by the processes rooted at `roots`. */
export function cpuSeconds(roots: readonly number[]): number {
  let ticks = 0;
  for (const root of roots) {
    for (const pid of tree(root)) {
      try {
        ticks += parseProcStat(readFileSync(`/proc/${pid}/stat`, 'utf8')).ticks;
      } catch {
        // gone meanwhile
      }
    }
  }
  return ticks / TICKS_PER_SECOND;
}

/** Resident memory, in bytes, of the processes rooted at `roots`. */
export function rssBytes(roots: readonly number[]): number {
  let total = 0;
  for (const root of roots) {
    for (const pid of tree(root)) {
      try {
        total += parseVmRss(readFileSync(`/proc/${pid}/status`, 'utf8'));
      } catch {
        // gone meanwhile, or a kernel thread without VmRSS
      }
    }
  }
  return total;
}
