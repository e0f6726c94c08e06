import { close, constants, fstatSync, openSync, read, statSync, type BigIntStats } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import { ProxyError } from '../../core/errors.js';

/**
 * Reading the state file, apart from watching it (file-source.ts): main.ts begins the first read
 * before the rest of the proxy is loaded, so this module imports nothing heavy.
 */

export const DEFAULT_MAX_BYTES = 256 * 1024 * 1024;

/**
 * The file's bytes, or ProxyError TOO_LARGE before reading a file over maxBytes (or one that grew
 * past it). One read() for the size stat() gave, where fh.readFile() would make one trip to the
 * thread pool per 512 KiB (80 for a 40 MB file, each queued behind whatever else is there); then
 * reads until end of file, for a file that grew meanwhile. Into `into` (the result is a view of
 * it) when it has room: a fresh 40 MB buffer per read is 10,000 pages for the kernel to fault
 * in and zero, ten times a second under churn, and as much again for the collector to free.
 */
export async function readStateFile(path: string, maxBytes: number, into?: Buffer): Promise<Buffer> {
  const fh = await open(path, 'r');
  try {
    const { size } = await fh.stat();
    if (size > maxBytes) throw tooLarge(path, size, maxBytes);
    // One byte more than the size, so that a file that did not grow is read in one call and known
    // complete; an eighth more room, so that the next read of a growing file fits as well. Never
    // from the shared pool (allocUnsafeSlow): the buffer is read into again later.
    const want = Math.min(size, maxBytes) + 1;
    let buf = into !== undefined && into.length >= want ? into : Buffer.allocUnsafeSlow(Math.min(want + (want >> 3), maxBytes + 1));
    let length = 0;
    for (;;) {
      if (length === buf.length) {
        if (length > maxBytes) throw tooLarge(path, length, maxBytes);
        const bigger = Buffer.allocUnsafeSlow(Math.min(length * 2, maxBytes + 1));
        buf.copy(bigger, 0, 0, length);
        buf = bigger;
      }
      const { bytesRead } = await fh.read(buf, length, buf.length - length, length);
      if (bytesRead === 0) break;
      length += bytesRead;
    }
    if (length > maxBytes) throw tooLarge(path, length, maxBytes);
    return buf.subarray(0, length);
  } finally {
    await fh.close();
  }
}

function tooLarge(path: string, size: number, maxBytes: number): ProxyError {
  return new ProxyError('TOO_LARGE', `${path}: state file is ${size} bytes, more than the ${maxBytes} read`);
}

/**
 * The state file read as the process starts, while Node loads the proxy's modules (some 80 ms at
 * 10,000 Services, and the read of a 15 MB file is 20-60 ms the event loop would otherwise wait
 * for afterwards). `path` is the `--state` argument as main.ts found it; the file source takes
 * the read only for that same path, and only if it is still the file's content (takeEarlyRead).
 * Taken once: whoever takes it (or finds it is not theirs) leaves nothing behind, so an unused
 * read of a large file is not kept for the life of the process.
 */
export class EarlyStateRead {
  private read: Promise<StateFileRead | undefined> | undefined;

  constructor(
    readonly path: string,
    read: Promise<StateFileRead | undefined>,
  ) {
    this.read = read;
  }

  /** The read, if it was of `path` and not taken before; either way it is let go of. */
  take(path: string | undefined): Promise<StateFileRead | undefined> | undefined {
    const read = this.read;
    this.read = undefined;
    return path === this.path ? read : undefined;
  }
}

/** The early read's bytes; the buffer is its own (the file source reads into it again later). */
export interface StateFileRead {
  buf: Buffer;
  /** The file as opened, before the read; the same after it, or there would be no read. */
  stat: BigIntStats;
  /** Date.now() before the file was opened: how recent a change may be and still be told apart. */
  openedAtMs: number;
}

export function beginEarlyStateRead(path: string, maxBytes = DEFAULT_MAX_BYTES): EarlyStateRead {
  return new EarlyStateRead(path, new Promise((resolve) => readWhole(path, maxBytes, resolve)));
}

/**
 * The file with one trip to the thread pool: stat()ed, opened and measured on the main thread
 * (nothing is served yet; microseconds on a local file system), then one read of it all.
 * readStateFile's five trips would each wait for the event loop, which is busy loading modules:
 * the read then took 90 ms instead of 25. Anything else than a regular file read whole and
 * unchanged meanwhile gives undefined, and the file source reads (and reports) as usual: not a
 * regular file (not opened, so a FIFO does not block; O_NONBLOCK for one swapped in between
 * the stat and the open), too large, a short read, a file that grew or changed during the read,
 * an error, no memory for the buffer. Never rejects.
 */
function readWhole(path: string, maxBytes: number, done: (r: StateFileRead | undefined) => void): void {
  const openedAtMs = Date.now();
  let fd: number;
  try {
    const named = statSync(path, { bigint: true });
    if (!named.isFile() || named.size > BigInt(maxBytes)) return done(undefined);
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch {
    return done(undefined);
  }
  const finish = (r: StateFileRead | undefined): void => {
    done(r);
    close(fd, () => {});
  };
  try {
    const before = fstatSync(fd, { bigint: true });
    const size = Number(before.size);
    if (!before.isFile() || size > maxBytes) return finish(undefined);
    // A byte more than the size, as readStateFile: a file that grew reads it.
    const want = size + 1;
    const buf = Buffer.allocUnsafeSlow(Math.min(want + (want >> 3), maxBytes + 1));
    read(fd, buf, 0, want, 0, (err, bytesRead) => {
      let after: BigIntStats | undefined;
      try {
        after = err ? undefined : fstatSync(fd, { bigint: true });
      } catch {
        after = undefined;
      }
      const whole = after !== undefined && bytesRead === size && sameFile(before, after);
      finish(whole ? { buf: buf.subarray(0, size), stat: before, openedAtMs } : undefined);
    });
  } catch {
    finish(undefined);
  }
}

/**
 * Whether the early read is still the content of the file at `path`, asked once the file source
 * watches it (so that an edit from then on is theirs to see): the same file by device, inode, size
 * and change times to the nanosecond, and its last change not so recent that another change in
 * the same tick of the file system's clock could leave all of these the same (git's "racily
 * clean" entries): within 20 ms where timestamps have sub-second parts, within 2 s where they are
 * whole seconds (FAT, some network file systems). A file that fails either is read again. The
 * rule reads the file's times against this machine's clock: on a network file system whose
 * server's clock is behind ours and whose timestamps are coarse it can pass a racy file (and such
 * file systems' attribute caches make stat() stale anyway, early read or not).
 */
export async function earlyReadStillCurrent(path: string, r: StateFileRead): Promise<boolean> {
  let now: BigIntStats;
  try {
    now = await stat(path, { bigint: true });
  } catch {
    return false;
  }
  if (!sameFile(r.stat, now)) return false;
  const granuleMs = r.stat.ctimeNs % 1_000_000_000n === 0n ? 2000 : 20;
  return Number(r.stat.ctimeNs / 1_000_000n) + granuleMs < r.openedAtMs;
}

function sameFile(a: BigIntStats, b: BigIntStats): boolean {
  return a.dev === b.dev && a.ino === b.ino && a.size === b.size && a.mtimeNs === b.mtimeNs && a.ctimeNs === b.ctimeNs;
}
