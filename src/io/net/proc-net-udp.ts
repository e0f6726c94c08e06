import { SocketAddress } from 'node:net';
import { endianness } from 'node:os';
import { hostPort } from '../../core/address.js';

/**
 * The kernel's table of UDP sockets (/proc/net/udp and /proc/net/udp6, of this process's network
 * namespace), reduced to what metrics need: the `drops` of each unconnected socket, by the local
 * address and port it is bound to.
 *
 * Node gives no public way to a dgram socket's descriptor (and so its inode), but the local
 * address and port name an unconnected socket soundly: without SO_REUSEPORT, which one proxy
 * process does not set, the kernel lets only one unconnected socket bind an address and port.
 * Worker processes (`--workers`) do set it, and each binds every address: there the socket's
 * inode tells them apart (parseProcNetUdpSockets). Connected sockets (the proxy's own sessions
 * among them) are left out.
 *
 * The kernel prints an address as the 32-bit words of its network-order bytes, each formatted as
 * a native integer: on a little-endian machine 127.0.0.1 is `0100007F`. The port is in host order.
 */

/** Drops by hostPort() of the local address, as socket.address() spells it. */
export type UdpDropTable = Map<string, number>;

const ANY_REMOTE = /^0+:0000$/;

/**
 * Adds the unconnected sockets of one file's text to `into`. Lines that do not parse are skipped:
 * the table is advisory, and a kernel that adds a column must not break a scrape.
 */
export function parseProcNetUdp(text: string, into: UdpDropTable = new Map(), byteOrder: 'LE' | 'BE' = endianness()): UdpDropTable {
  eachUnconnected(text, byteOrder, (key, _inode, drops) => into.set(key, (into.get(key) ?? 0) + drops));
  return into;
}

/** One unconnected socket of the table: its local address (as hostPort() spells it), inode and drops. */
export interface UdpSocketDrops {
  key: string;
  inode: number;
  drops: number;
}

/** Every unconnected socket of one file's text, apart: for addresses several sockets share (SO_REUSEPORT). */
export function parseProcNetUdpSockets(text: string, into: UdpSocketDrops[] = [], byteOrder: 'LE' | 'BE' = endianness()): UdpSocketDrops[] {
  eachUnconnected(text, byteOrder, (key, inode, drops) => into.push({ key, inode, drops }));
  return into;
}

function eachUnconnected(text: string, byteOrder: 'LE' | 'BE', visit: (key: string, inode: number, drops: number) => void): void {
  let start = text.indexOf('\n') + 1; // the header
  while (start > 0 && start < text.length) {
    let end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    const fields = text.slice(start, end).trim().split(/\s+/);
    start = end + 1;
    // sl local remote st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
    if (fields.length < 13 || !ANY_REMOTE.test(fields[2] as string)) continue;
    const drops = Number(fields[fields.length - 1]);
    const inode = Number(fields[9]);
    const key = localKey(fields[1] as string, byteOrder);
    if (key === undefined || !Number.isSafeInteger(drops)) continue;
    visit(key, inode, drops);
  }
}

function localKey(hexAddr: string, byteOrder: 'LE' | 'BE'): string | undefined {
  const m = /^([0-9A-Fa-f]{8}|[0-9A-Fa-f]{32}):([0-9A-Fa-f]{4})$/.exec(hexAddr);
  if (!m) return undefined;
  const bytes = wordsToBytes(m[1] as string, byteOrder);
  const port = parseInt(m[2] as string, 16);
  if (bytes.length === 4) return hostPort({ host: bytes.join('.'), port });
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push((((bytes[i] as number) << 8) | (bytes[i + 1] as number)).toString(16));
  // Spelled as socket.address() spells it (inet_ntop's compressed form).
  const host = new SocketAddress({ address: groups.join(':'), family: 'ipv6' }).address;
  return hostPort({ host, port });
}

/** Network-order bytes from the kernel's native-order 32-bit words. */
function wordsToBytes(hex: string, byteOrder: 'LE' | 'BE'): number[] {
  const bytes: number[] = [];
  for (let w = 0; w < hex.length; w += 8) {
    const word = [0, 2, 4, 6].map((i) => parseInt(hex.slice(w + i, w + i + 2), 16));
    bytes.push(...(byteOrder === 'LE' ? word.reverse() : word));
  }
  return bytes;
}
