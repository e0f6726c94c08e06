import { connect, type Socket } from 'node:net';
import type { HostPort } from './plan.js';

/**
 * Small HTTP clients for the scale runs, each on a fresh TCP connection: a proxy picks the
 * endpoint per connection, so a new connection is what sees an endpoint change.
 */

const REQUEST_CLOSE = 'GET / HTTP/1.0\r\nHost: bench\r\n\r\n';
const REQUEST_KEEP = 'GET / HTTP/1.1\r\nHost: bench\r\n\r\n';

/** One request over a new connection (HTTP/1.0: the server closes); resolves with the body. */
export function httpOnce(target: HostPort, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const s = connect({ host: target.host, port: target.port });
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`no answer from ${target.host}:${target.port} within ${timeoutMs} ms`));
    }, timeoutMs);
    s.on('connect', () => s.write(REQUEST_CLOSE));
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    s.on('close', () => {
      clearTimeout(timer);
      const text = Buffer.concat(chunks).toString();
      const at = text.indexOf('\r\n\r\n');
      if (at < 0) reject(new Error(`no HTTP response from ${target.host}:${target.port}`));
      else resolve(text.slice(at + 4));
    });
  });
}

/** Open a connection, make one keep-alive request, and leave it open and idle. */
function openOne(target: HostPort, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: target.host, port: target.port });
    let got = '';
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error('timed out'));
    }, timeoutMs);
    const fail = (err: Error): void => {
      clearTimeout(timer);
      s.destroy();
      reject(err);
    };
    s.once('error', fail);
    s.on('connect', () => s.write(REQUEST_KEEP));
    s.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      if (!got.endsWith('\r\n\r\nok\n')) return;
      clearTimeout(timer);
      s.off('error', fail);
      s.removeAllListeners('data');
      // From now on the connection idles; an error (a reset at teardown) is expected.
      s.on('error', () => s.destroy());
      resolve(s);
    });
  });
}

/**
 * `n` idle proxied connections, opened `concurrency` at a time. Bounded by `deadlineMs` overall;
 * connections that fail are counted, not retried.
 */
export async function openIdle(target: HostPort, n: number, opts: { concurrency: number; deadlineMs: number }): Promise<{ sockets: Socket[]; failed: number; firstError?: string }> {
  const sockets: Socket[] = [];
  let failed = 0;
  let firstError: string | undefined;
  let next = 0;
  const deadline = performance.now() + opts.deadlineMs;
  const worker = async (): Promise<void> => {
    while (next < n && performance.now() < deadline) {
      next++;
      try {
        sockets.push(await openOne(target, 10_000));
      } catch (err) {
        failed++;
        firstError ??= (err as Error).message;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(opts.concurrency, n) }, worker));
  return firstError === undefined ? { sockets, failed } : { sockets, failed, firstError };
}
