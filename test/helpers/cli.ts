import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const MAIN = fileURLToPath(new URL('../../dist/bundle/main.js', import.meta.url));

export interface Spawned {
  child: ChildProcess;
  stdout(): string;
  stderr(): string;
  /** Resolves with the exit code (or the signal's name). */
  exited: Promise<number | string>;
  /** Wait until a log line matching `re` appears on stdout. */
  waitForLine(re: RegExp, timeoutMs?: number): Promise<string>;
  /** SIGKILL if still running: for afterAll, so no process outlives its test. */
  kill(): void;
}

/**
 * Spawn the built CLI as a black box (corepack's tests/_runCli.ts style); `main`, another copy of
 * it (MAIN by default), and `cwd`, where it runs (this process's by default).
 */
export function runCli(args: string[], opts: { prefix?: string[]; env?: NodeJS.ProcessEnv; detached?: boolean; main?: string; cwd?: string } = {}): Spawned {
  const [cmd, ...pre] = opts.prefix ?? [];
  const main = opts.main ?? MAIN;
  // detached: a process group of its own (as a shell's foreground job), for signals to the group.
  const spawnOpts = { env: opts.env ?? process.env, detached: opts.detached ?? false, cwd: opts.cwd };
  const child = cmd ? spawn(cmd, [...pre, process.execPath, main, ...args], spawnOpts) : spawn(process.execPath, [main, ...args], spawnOpts);
  let out = '';
  let err = '';
  const waiters: Array<() => void> = [];
  child.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
    for (const w of waiters.splice(0)) w();
  });
  child.stderr?.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const exited = new Promise<number | string>((resolve) => child.on('exit', (code, signal) => resolve(code ?? signal ?? -1)));
  return {
    child,
    stdout: () => out,
    stderr: () => err,
    exited,
    kill: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
    waitForLine(re, timeoutMs = 15_000) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no line matching ${re} within ${timeoutMs}ms; stdout:\n${out}\nstderr:\n${err}`)), timeoutMs);
        const check = (): void => {
          const line = out.split('\n').find((l) => re.test(l));
          if (line) {
            clearTimeout(timer);
            resolve(line);
          } else if (child.exitCode !== null) {
            clearTimeout(timer);
            reject(new Error(`exited ${child.exitCode} before a line matching ${re}; stderr:\n${err}`));
          } else waiters.push(check);
        };
        check();
      });
    },
  };
}
