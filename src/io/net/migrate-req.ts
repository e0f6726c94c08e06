import { readFile, writeFile } from 'node:fs/promises';

/**
 * `net.ipv4.tcp_migrate_req` (Linux 5.14+, per network namespace; it covers IPv6 too): when a
 * listener of an SO_REUSEPORT group closes, the connections in its accept queue (and those still
 * in the handshake) move to another listener of the group instead of being reset. That is what
 * lets a process that hands over close its listeners without resetting a client that connected
 * at that very instant.
 */
export const MIGRATE_REQ_PATH = '/proc/sys/net/ipv4/tcp_migrate_req';

export type MigrateReqOutcome =
  | { state: 'on'; changed: boolean }
  | { state: 'off'; why: string };

/** Turns it on in this process's network namespace, if it can; says why not otherwise. */
export async function enableMigrateReq(path = MIGRATE_REQ_PATH): Promise<MigrateReqOutcome> {
  try {
    if ((await readFile(path, 'utf8')).trim() === '1') return { state: 'on', changed: false };
    await writeFile(path, '1\n');
    return { state: 'on', changed: true };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'the kernel has no net.ipv4.tcp_migrate_req (Linux 5.14 or later has it)'
      : code === 'EACCES' || code === 'EPERM' || code === 'EROFS' ? `cannot write ${path} (it needs root in this network namespace and /proc/sys mounted writable; set it on the node: sysctl -w net.ipv4.tcp_migrate_req=1)`
      : err instanceof Error ? err.message : String(err);
    return { state: 'off', why };
  }
}
