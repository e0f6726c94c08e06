import { close, fstatSync, openSync, read, type Stats } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import { ProxyError } from '../../core/errors.js';

/**
 * Reading the state file, apart from watching it (file-source.ts): main.ts begins the first read
 * before the rest of the proxy is loaded, so this module imports nothing heavy.
 */

export const DEFAULT_MAX_BYTES = 256 * 1024 * 1024;

/** The early read's bytes, with the file as it was when opened (file-source.ts compares it later). */
export interface StateFileRead {
  buf: Buffer;
  stat: Stats;
}

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
 * 10,000 Services, and the read of a 15 MB file is 20-30 ms the event loop would otherwise sit
 * idle for). `path` is the `--state` argument as given; the file source takes the read only for
 * that same path, and only if the file has not changed since (earlyReadStillCurrent).
 */
export interface EarlyStateRead {
  path: string;
  /** Never rejects: a failed early read is undefined, and the file source reads (and reports) as usual. */
  read: Promise<StateFileRead | undefined>;
}

export function beginEarlyStateRead(path: string, maxBytes = DEFAULT_MAX_BYTES): EarlyStateRead {
  return { path, read: new Promise((resolve) => readWhole(path, maxBytes, resolve)) };
}

/**
 * The file in one trip to the thread pool: opened and measured at once (microseconds, and nothing
 * is served yet), then one read of it all. readStateFile's five trips would each wait for
 * the event loop, which is busy loading modules: the read then took 90 ms instead of 25. Anything
 * unusual (not a regular file, too large, grown meanwhile, an error) gives undefined, and the
 * file source reads as usual.
 */
function readWhole(path: string, maxBytes: number, done: (r: StateFileRead | undefined) => void): void {
  let fd: number;
  let st: Stats;
  try {
    fd = openSync(path, 'r');
  } catch {
    return done(undefined);
  }
  const finish = (r: StateFileRead | undefined): void => {
    done(r);
    close(fd, () => {});
  };
  try {
    st = fstatSync(fd);
  } catch {
    return finish(undefined);
  }
  if (!st.isFile() || st.size > maxBytes) return finish(undefined);
  // A byte more than the size, as readStateFile: a file that did not grow reads short.
  const want = st.size + 1;
  const buf = Buffer.allocUnsafeSlow(Math.min(want + (want >> 3), maxBytes + 1));
  read(fd, buf, 0, want, 0, (err, bytesRead) => finish(err || bytesRead === want ? undefined : { buf: buf.subarray(0, bytesRead), stat: st }));
}

/**
 * Whether the file at `path` is still the one `before` describes: same inode, size and change
 * times. The early read is made before the file source watches the file, so an edit in between
 * would otherwise be missed by both of its watchers (the poller compares with its own first stat).
 */
export async function earlyReadStillCurrent(path: string, before: Stats): Promise<boolean> {
  try {
    const now = await stat(path);
    return now.dev === before.dev && now.ino === before.ino && now.size === before.size && now.mtimeMs === before.mtimeMs && now.ctimeMs === before.ctimeMs;
  } catch {
    return false;
  }
}
