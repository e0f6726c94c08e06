import { execFileSync, spawn } from 'node:child_process';
import { ProxyError, errnoCode } from '../../core/errors.js';

/**
 * The one way the portals touch the node: running `iptables-restore`, `iptables-save` and `ip`.
 * Injected, so unit tests fake it and namespace tests run the real commands.
 */
export interface CommandResult {
  stdout: string;
  stderr: string;
}

export interface CommandRunner {
  /** Runs `command args...` with `input` on stdin; rejects with CommandError unless it exits 0. */
  run(command: string, args: readonly string[], input?: string): Promise<CommandResult>;
  /**
   * The same, blocking. Only for the bind portal's fallback in listenSpecs (which is synchronous);
   * see BindPortal.prepare.
   */
  runSync(command: string, args: readonly string[], input?: string): CommandResult;
}

/** A command that could not be run or did not exit 0. */
export class CommandError extends ProxyError {
  readonly command: string;
  readonly exitCode: number | null;
  readonly stderr: string;
  /** The command is not installed (spawn said ENOENT): nothing of its kind can exist to clean up. */
  readonly missing: boolean;

  constructor(command: string, args: readonly string[], details: { exitCode: number | null; stderr: string; cause?: unknown }) {
    const missing = errnoCode(details.cause) === 'ENOENT';
    const why = missing ? 'not found (is it installed and on PATH?)' : firstLine(details.stderr) || (details.cause instanceof Error ? details.cause.message : `exit code ${details.exitCode}`);
    super('PORTAL', `${[command, ...args].join(' ')}: ${why}`, { cause: details.cause });
    this.name = 'CommandError';
    this.command = command;
    this.exitCode = details.exitCode;
    this.stderr = details.stderr;
    this.missing = missing;
  }
}

export function firstLine(text: string): string {
  return text.split('\n').map((l) => l.trim()).find((l) => l !== '') ?? '';
}

export function isMissingCommand(err: unknown): boolean {
  return err instanceof CommandError && err.missing;
}

const TIMEOUT_MS = 30_000;

/** Runs real processes. A hung command is killed after 30 s (iptables waits for its lock at most 5 s). */
export const processRunner: CommandRunner = {
  run(command, args, input) {
    return new Promise((resolve, reject) => {
      const child = spawn(command, [...args], { stdio: ['pipe', 'pipe', 'pipe'] });
      // Our own timer rather than spawn's `timeout`: that one is cleared on 'exit' only, which a
      // command that failed to start (ENOENT) never emits, and would hold the process open.
      const timer = setTimeout(() => child.kill('SIGKILL'), TIMEOUT_MS);
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      let spawnError: unknown;
      child.stdout.on('data', (d: Buffer) => out.push(d));
      child.stderr.on('data', (d: Buffer) => err.push(d));
      child.on('error', (e) => {
        spawnError = e;
      });
      // A command that exits without reading all of stdin must not crash us with EPIPE.
      child.stdin.on('error', () => {});
      child.on('close', (code) => {
        clearTimeout(timer);
        const stderr = Buffer.concat(err).toString();
        if (spawnError !== undefined || code !== 0) {
          reject(new CommandError(command, args, { exitCode: code, stderr, cause: spawnError }));
        } else {
          resolve({ stdout: Buffer.concat(out).toString(), stderr });
        }
      });
      child.stdin.end(input ?? '');
    });
  },
  runSync(command, args, input) {
    try {
      const stdout = execFileSync(command, [...args], { input: input ?? '', stdio: ['pipe', 'pipe', 'pipe'], timeout: TIMEOUT_MS, encoding: 'utf8' });
      return { stdout, stderr: '' };
    } catch (e) {
      const failed = e as { status?: number | null; stderr?: string | Buffer };
      throw new CommandError(command, args, { exitCode: failed.status ?? null, stderr: String(failed.stderr ?? ''), cause: e });
    }
  },
};
