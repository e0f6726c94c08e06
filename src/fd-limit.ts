import { readFileSync } from 'node:fs';
import type { ProxierEvents } from './seams/proxier-events.js';

/**
 * The open-file warning at start-up. Every listener, every proxied TCP connection (two sockets:
 * client and endpoint) and every UDP session holds a descriptor; past the limit accept() and
 * connect() fail with EMFILE and connections are dropped. Node raises its soft limit to the hard
 * one at start, so the hard limit is what counts, and only the operator can raise it.
 */

import { BASE_DESCRIPTORS, DEFAULT_EXPECTED_CONNECTIONS } from './core/descriptor-budget.js';

export { BASE_DESCRIPTORS, DEFAULT_EXPECTED_CONNECTIONS };

export interface OpenFileLimit {
  /** `Infinity` for "unlimited". */
  soft: number;
  hard: number;
}

/** Parses the "Max open files" line of /proc/<pid>/limits; undefined when there is none. */
export function parseOpenFileLimit(procLimits: string): OpenFileLimit | undefined {
  const m = /^Max open files\s+(\S+)\s+(\S+)/m.exec(procLimits);
  if (!m) return undefined;
  const num = (s: string): number => (s === 'unlimited' ? Infinity : Number(s));
  const soft = num(m[1] as string);
  const hard = num(m[2] as string);
  return Number.isNaN(soft) || Number.isNaN(hard) ? undefined : { soft, hard };
}

export interface DescriptorNeed {
  /** Sockets listening now: one per portal address and proxy port of every service port. */
  listeners: number;
  /** Concurrent connections and sessions expected over the node. */
  expectedConnections: number;
}

/** What the proxy needs: a TCP connection holds two descriptors, a UDP session one; budget for TCP. */
export function descriptorsNeeded(need: DescriptorNeed): number {
  return BASE_DESCRIPTORS + need.listeners + 2 * need.expectedConnections;
}

/** The warning for `limit` against `need`, or undefined when the limit is enough. Pure. */
export function openFileLimitWarning(limit: OpenFileLimit, need: DescriptorNeed): string | undefined {
  const needed = descriptorsNeeded(need);
  // Node runs on the soft limit it raised to the hard one; a soft limit lower than that (a
  // setrlimit by a wrapper after start) is what applies.
  const effective = Math.min(limit.soft, limit.hard);
  if (effective >= needed) return undefined;
  return (
    `the open-file limit (${effective}) is below the ${needed} descriptors this proxy may need ` +
    `(${need.listeners} listening sockets and ${need.expectedConnections} concurrent connections at two descriptors each); ` +
    'past it, connections are dropped. Raise the hard limit: `ulimit -Hn` in the shell that starts it, ' +
    'LimitNOFILE= in a systemd unit, `--ulimit nofile=1048576:1048576` for docker run, or the container runtime\'s default (containerd: LimitNOFILE in its unit)'
  );
}

/** Reads this process's limit; undefined where /proc is not available. */
export function readOpenFileLimit(read: (path: string) => string = (p) => readFileSync(p, 'utf8')): OpenFileLimit | undefined {
  try {
    return parseOpenFileLimit(read('/proc/self/limits'));
  } catch {
    return undefined;
  }
}

/** The warning for this process, if one is due. */
export function checkOpenFileLimit(need: DescriptorNeed, read?: (path: string) => string): string | undefined {
  const limit = readOpenFileLimit(read);
  return limit === undefined ? undefined : openFileLimitWarning(limit, need);
}

/**
 * Reads the limit now, at start-up, while descriptors are there to read it with (once they run
 * out, even /proc/self/limits cannot be opened), and warns once, after the first sync, when the
 * service ports (and so the listeners wanted, served or not) are known. `warn` gets the message;
 * main passes the logger's warn.
 */
export function warnOnLowOpenFileLimit(events: ProxierEvents, warn: (msg: string, need: DescriptorNeed) => void, expectedConnections = DEFAULT_EXPECTED_CONNECTIONS, read?: (path: string) => string): void {
  const limit = readOpenFileLimit(read);
  const off = events.onSync((e) => {
    off();
    const need = { listeners: e.listeners + e.listenersFailed, expectedConnections };
    const msg = limit === undefined ? undefined : openFileLimitWarning(limit, need);
    if (msg !== undefined) warn(msg, need);
  });
}
