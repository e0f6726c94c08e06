import { access, chmod, chown, constants, open, readFile, realpath, rename as fsRename, stat, unlink, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { ProxyError, errnoCode } from '../../core/errors.js';
import { hostsBlockLines, spliceHostsBlock } from '../../core/hosts-block.js';
import type { Logger } from '../../seams/logger.js';

/**
 * `--hosts-file FILE`: keeps the proxy's marked block of `address name...` lines in a hosts-format
 * file (core/hosts-block.ts decides the text). Each write reads the file afresh, so edits outside
 * the block made meanwhile are kept; the block is written only when its lines change.
 *
 * A write replaces the file atomically: a temporary file beside it, with the original's mode (and
 * owner, when root), renamed over it, so a reader never sees half a file. Where the file cannot be
 * replaced (a bind mount, as /etc/hosts is in a container: EBUSY; a directory not writable), it is
 * rewritten in place instead, said once in the log: a reader may then catch it mid-write.
 * A symbolic link is followed: the file it points to is written, the link stays.
 */

export interface HostsFileOptions {
  /** As given on the command line: errors name it so. */
  path: string;
  logger: Logger;
  /** rename(2); tests inject a failing one to take the in-place path. */
  rename?: (from: string, to: string) => Promise<void>;
}

/** Errors for which the file is rewritten in place rather than replaced. */
const IN_PLACE_CODES = new Set(['EBUSY', 'EXDEV', 'EPERM', 'EACCES']);

export class HostsFile {
  private readonly path: string;
  private readonly log: Logger;
  private readonly rename: (from: string, to: string) => Promise<void>;
  private target: string | undefined;
  /** The lines asked for last (and joined, to compare). */
  private wanted: readonly string[] | undefined;
  private wantedKey: string | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private closed = false;
  private saidInPlace = false;
  /** The last write failed: the next sync tries again even if nothing changed. */
  failed = false;

  constructor(opts: HostsFileOptions) {
    this.path = opts.path;
    this.log = opts.logger.child({ component: 'hosts-file' });
    this.rename = opts.rename ?? fsRename;
  }

  /**
   * At start: the file (or, when it does not exist yet, its directory) can be written and any block
   * in it is whole. One line naming the flag otherwise (ProxyError STARTUP, or USAGE for a broken block).
   */
  async check(): Promise<void> {
    const target = await this.resolveTarget();
    let text: string | undefined;
    try {
      text = await readFile(target, 'latin1');
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw this.cannot('read', err);
    }
    if (text !== undefined) hostsBlockLines(text, this.path);
    try {
      await access(text === undefined ? dirname(target) : target, constants.W_OK);
    } catch (err) {
      throw this.cannot('write', err);
    }
  }

  /** Asks for these lines in the block; written soon, and only when they differ from what is there. */
  set(lines: readonly string[]): void {
    if (this.closed) return;
    const key = lines.join('\n');
    if (!this.failed && this.wantedKey === key) return;
    this.wanted = lines;
    this.wantedKey = key;
    this.kick();
  }

  /** Waits until what was asked for is written (or failed). */
  async flush(): Promise<void> {
    while (this.running) await this.running;
  }

  /**
   * Takes the block out, after any write under way; nothing is written after. A failure is logged,
   * not thrown: the rest of the shutdown goes on, and `--cleanup` can take the block out later.
   */
  async remove(): Promise<boolean> {
    this.closed = true;
    await this.flush();
    try {
      const changed = await this.apply(undefined);
      if (changed) this.log.info({ file: this.path }, 'removed the Service names block');
      return true;
    } catch (err) {
      this.log.error({ err, file: this.path }, `could not remove the Service names block from ${this.path}; run with --cleanup --hosts-file ${this.path} to remove it`);
      return false;
    }
  }

  private kick(): void {
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.loop().finally(() => {
      this.running = undefined;
    });
  }

  private async loop(): Promise<void> {
    do {
      this.again = false;
      const lines = this.wanted;
      if (lines === undefined || this.closed) return;
      try {
        await this.apply(lines);
        this.failed = false;
      } catch (err) {
        this.failed = true;
        this.log.error({ err, file: this.path }, `could not write the Service names block to ${this.path}; trying again at the next sync`);
      }
    } while (this.again);
  }

  /** Reads the file, splices the block in (or out), writes it when that changed anything. */
  private async apply(lines: readonly string[] | undefined): Promise<boolean> {
    const target = await this.resolveTarget();
    let text = '';
    try {
      text = await readFile(target, 'latin1');
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw err;
      if (lines === undefined) return false;
    }
    const next = spliceHostsBlock(text, lines, this.path);
    if (next === text) return false;
    const how = await replaceFile(target, next, this.rename);
    if (how.inPlace && !this.saidInPlace) {
      this.saidInPlace = true;
      this.log.warn({ file: this.path, code: how.code }, `cannot replace ${this.path} atomically (${how.code}: a bind mount?); rewriting it in place`);
    }
    return true;
  }

  private async resolveTarget(): Promise<string> {
    if (this.target !== undefined) return this.target;
    try {
      this.target = await realpath(this.path);
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw this.cannot('read', err);
      this.target = this.path;
    }
    return this.target;
  }

  private cannot(what: 'read' | 'write', err: unknown): ProxyError {
    const code = errnoCode(err);
    const why = code === 'EACCES' || code === 'EPERM' ? 'permission denied (a system hosts file needs root)' : code === 'ENOENT' ? 'no such directory' : code === 'EROFS' ? 'read-only file system' : err instanceof Error ? err.message : String(err);
    return new ProxyError('STARTUP', `--hosts-file ${this.path}: cannot ${what} it: ${why}`, { cause: err });
  }
}

/** `--cleanup`: takes the block out of `path`, if it has one. True when it did. */
export async function removeHostsBlock(path: string): Promise<boolean> {
  let target: string;
  let text: string;
  try {
    target = await realpath(path);
    text = await readFile(target, 'latin1');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return false;
    throw new ProxyError('PORTAL', `--hosts-file ${path}: cannot read it: ${errnoCode(err) ?? String(err)}`, { cause: err });
  }
  const next = spliceHostsBlock(text, undefined, path);
  if (next === text) return false;
  try {
    await replaceFile(target, next, fsRename);
  } catch (err) {
    throw new ProxyError('PORTAL', `--hosts-file ${path}: cannot write it: ${errnoCode(err) ?? String(err)}`, { cause: err });
  }
  return true;
}

/**
 * Replaces `target` with `text`: atomically by rename when it can, in place when the file cannot
 * be replaced. The temporary file carries the pid, so two processes never share one.
 */
async function replaceFile(target: string, text: string, rename: (from: string, to: string) => Promise<void>): Promise<{ inPlace: boolean; code?: string }> {
  const st = await stat(target).catch((err: unknown) => {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  });
  const tmp = join(dirname(target), `.${basename(target)}.kube-userspace-proxy-${process.pid}.tmp`);
  try {
    await writeFile(tmp, text, { mode: 0o600, encoding: 'latin1' });
    try {
      await chmod(tmp, st ? st.mode & 0o7777 : 0o644);
      if (st && process.getuid?.() === 0) await chown(tmp, st.uid, st.gid);
      await rename(tmp, target);
    } catch (err) {
      await unlink(tmp).catch(() => undefined);
      throw err;
    }
    return { inPlace: false };
  } catch (err) {
    const code = errnoCode(err);
    if (st === undefined || code === undefined || !IN_PLACE_CODES.has(code)) throw err;
    await writeInPlace(target, text);
    return { inPlace: true, code };
  }
}

/** Overwrites from the start, then cuts what is left: the file is never seen empty on the way. */
async function writeInPlace(target: string, text: string): Promise<void> {
  const fh = await open(target, 'r+');
  try {
    const data = Buffer.from(text, 'latin1');
    await fh.write(data, 0, data.length, 0);
    await fh.truncate(data.length);
  } finally {
    await fh.close();
  }
}
