import type { Socket as DgramSocket } from 'node:dgram';
import { readFile, readdir, readlink } from 'node:fs/promises';
import { isIPv6 } from 'node:net';
import type { ServicePortStats } from '../../core/stats.js';
import type { Logger } from '../../seams/logger.js';
import { hostPort } from '../../core/address.js';
import type { BoundAddress } from '../../seams/proxy-socket.js';
import { parseProcNetUdp, parseProcNetUdpSockets, type UdpDropTable, type UdpSocketDrops } from './proc-net-udp.js';

/**
 * The kernel side of the UDP listeners: how big their receive buffers are, and how many
 * datagrams the kernel dropped because one was full. One per process, shared by every UDP
 * service port and by metrics.
 *
 * A burst faster than the event loop reads (a resolver's retries, a flood from many client ports)
 * queues in the listener's receive buffer; Linux's default (net.core.rmem_default, about 208 KiB)
 * holds a few hundred small datagrams, each charged with its buffer overhead, and the rest are
 * dropped unseen. A bigger buffer costs memory only while it is full.
 *
 * The drops never reach the proxy, so they are read from /proc/net/udp{,6} when metrics are
 * scraped, and never on the data path. Drops a listener took after the last scrape and before it
 * closed are not counted.
 */

/** Asked for each listener; Linux caps it at net.core.rmem_max (and reports double what it grants). */
export const LISTENER_RECV_BUFFER_BYTES = 4 * 1024 * 1024;

export interface UdpReceiveBuffersOptions {
  logger: Logger;
  /** Receive buffer asked for each listener, in bytes (0 leaves the kernel's default). */
  bytes?: number;
  /**
   * The listeners share their addresses with other processes' (SO_REUSEPORT: `--workers`), whose
   * drops must not be counted here: this process's sockets are told apart by inode, found once
   * per listener among the descriptors of /proc/self/fd.
   */
  sharedAddresses?: boolean;
}

interface Watch {
  key: string;
  ipv6: boolean;
  stats: ServicePortStats;
  /** The socket's drops as last read: the counter is bumped by the difference. */
  last: number;
  /** The refresh() it was watched during (or after): the tables of that one predate it. */
  since: number;
  /** The socket's inode, once found (sharedAddresses). */
  inode?: number;
}

export class UdpReceiveBuffers {
  private readonly parentLog: Logger;
  private childLog: Logger | undefined;
  private readonly bytes: number;
  private readonly sharedAddresses: boolean;
  private readonly watches = new Map<DgramSocket, Watch>();
  /** refresh() calls so far. */
  private refreshes = 0;
  private cappedSaid = false;
  private readFailedSaid = false;

  constructor(opts: UdpReceiveBuffersOptions) {
    this.parentLog = opts.logger;
    this.bytes = opts.bytes ?? LISTENER_RECV_BUFFER_BYTES;
    this.sharedAddresses = opts.sharedAddresses ?? false;
  }

  /** Made on first use: it logs at most twice. */
  private get log(): Logger {
    return (this.childLog ??= this.parentLog.child({ component: 'udp-receive-buffers' }));
  }

  /**
   * Sizes a bound listener's receive buffer and starts counting its drops on `stats`. Never
   * throws: a listener with the default buffer still works.
   */
  watch(socket: DgramSocket, bound: BoundAddress, stats: ServicePortStats): void {
    this.size(socket);
    this.watches.set(socket, { key: hostPort(bound), ipv6: isIPv6(bound.host), stats, last: 0, since: this.refreshes });
  }

  /** Before the listener closes. Unknown sockets are ignored. */
  unwatch(socket: DgramSocket): void {
    this.watches.delete(socket);
  }

  /** Reads the kernel's drop counts and adds what each watched listener dropped since the last read. Called at scrape time. */
  async refresh(): Promise<void> {
    if (this.watches.size === 0) return;
    const refresh = ++this.refreshes;
    let v4 = false;
    let v6 = false;
    for (const w of this.watches.values()) {
      if (w.ipv6) v6 = true;
      else v4 = true;
    }
    if (this.sharedAddresses) {
      await this.refreshShared(refresh, v4, v6);
      return;
    }
    const table: UdpDropTable = new Map();
    if (v4) await this.readInto('/proc/net/udp', (text) => parseProcNetUdp(text, table));
    if (v6) await this.readInto('/proc/net/udp6', (text) => parseProcNetUdp(text, table));
    for (const w of this.watches.values()) {
      // A listener bound while the files were read: what they say of its address may be of the
      // socket it replaced.
      if (w.since >= refresh) continue;
      const now = table.get(w.key);
      // Only forward: a read that finished after a later one must not count twice.
      if (now !== undefined && now > w.last) {
        w.stats.udpReceiveBufferDrops += now - w.last;
        w.last = now;
      }
    }
  }

  private size(socket: DgramSocket): void {
    if (this.bytes <= 0) return;
    let granted: number;
    try {
      socket.setRecvBufferSize(this.bytes);
      granted = socket.getRecvBufferSize();
    } catch (err) {
      this.sayCapped({ err, asked: this.bytes });
      return;
    }
    // Linux doubles what it grants (the other half is its bookkeeping) and caps at rmem_max first.
    if (granted < (process.platform === 'linux' ? 2 : 1) * this.bytes) this.sayCapped({ asked: this.bytes, granted });
  }

  /** Once: the cap is the system's (net.core.rmem_max), the same for every listener. */
  private sayCapped(fields: Record<string, unknown>): void {
    if (this.cappedSaid) return;
    this.cappedSaid = true;
    this.log.debug(fields, 'UDP listener receive buffers are smaller than asked: raise net.core.rmem_max for more');
  }

  /** As refresh(), each listener's own socket found by inode among those sharing its address. */
  private async refreshShared(refresh: number, v4: boolean, v6: boolean): Promise<void> {
    const sockets: UdpSocketDrops[] = [];
    if (v4) await this.readInto('/proc/net/udp', (text) => parseProcNetUdpSockets(text, sockets));
    if (v6) await this.readInto('/proc/net/udp6', (text) => parseProcNetUdpSockets(text, sockets));
    const byInode = new Map(sockets.map((s) => [s.inode, s]));
    const unknown = [...this.watches.values()].filter((w) => w.inode === undefined && w.since < refresh);
    if (unknown.length > 0) {
      const own = await ownSocketInodes();
      const taken = new Set<number>();
      for (const w of this.watches.values()) if (w.inode !== undefined) taken.add(w.inode);
      for (const w of unknown) {
        const mine = sockets.filter((s) => s.key === w.key && own.has(s.inode) && !taken.has(s.inode));
        // Two of this process's sockets on one address (one closing as its successor binds): ask again next time.
        if (mine.length !== 1) continue;
        w.inode = (mine[0] as UdpSocketDrops).inode;
        taken.add(w.inode);
      }
    }
    for (const w of this.watches.values()) {
      const now = w.inode === undefined ? undefined : byInode.get(w.inode)?.drops;
      if (now !== undefined && now > w.last) {
        w.stats.udpReceiveBufferDrops += now - w.last;
        w.last = now;
      }
    }
  }

  private async readInto(path: string, parse: (text: string) => unknown): Promise<void> {
    try {
      parse(await readFile(path, 'utf8'));
    } catch (err) {
      // No /proc (not Linux), or no IPv6: nothing to count. Said once.
      if (this.readFailedSaid) return;
      this.readFailedSaid = true;
      this.log.debug({ err, path }, 'cannot read UDP receive-buffer drops');
    }
  }
}

/** The inodes of this process's sockets, from the links in /proc/self/fd (`socket:[12345]`). */
async function ownSocketInodes(): Promise<Set<number>> {
  const out = new Set<number>();
  let fds: string[];
  try {
    fds = await readdir('/proc/self/fd');
  } catch {
    return out;
  }
  await Promise.all(fds.map(async (fd) => {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(await readlink(`/proc/self/fd/${fd}`));
      if (m) out.add(Number(m[1]));
    } catch {
      // Closed meanwhile.
    }
  }));
  return out;
}
