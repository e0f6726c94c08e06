import { readFileSync } from 'node:fs';

/** The kernel's default somaxconn since Linux 5.4, and Go's syscall.SOMAXCONN. */
export const FALLBACK_BACKLOG = 4096;

/**
 * The accept backlog for listeners: the kernel's own cap, net.core.somaxconn, as Go's net package
 * uses (maxListenerBacklog). Node's default of 511 overflows under a burst of connections (1,000 at
 * once in the hardening issue), and each connection that overflows waits a second for its SYN to be
 * sent again. `text` is the sysctl file's content, undefined if it could not be read.
 */
export function backlogFromSomaxconn(text: string | undefined): number {
  const n = Number((text ?? '').trim());
  // listen() takes an int; the kernel caps a larger backlog at somaxconn anyway.
  if (!Number.isInteger(n) || n <= 0) return FALLBACK_BACKLOG;
  return Math.min(n, 0x7fffffff);
}

let cached: number | undefined;

/** backlogFromSomaxconn for this host, read once per process. */
export function listenBacklog(): number {
  if (cached === undefined) {
    let text: string | undefined;
    try {
      text = readFileSync('/proc/sys/net/core/somaxconn', 'utf8');
    } catch {
      text = undefined; // not Linux, or /proc not mounted
    }
    cached = backlogFromSomaxconn(text);
  }
  return cached;
}
