/**
 * Stable loopback addresses for the no-root portal: each Service gets its own address in
 * 127.0.0.0/8 so that two Services can both listen on port 80.
 *
 * An IPv4 ClusterIP a.b.c.d maps to 127.b.c.d: service CIDRs are at most a /12 in practice, so
 * the low 24 bits are what tells Services apart, and a user can read the mapping at a glance
 * (10.96.0.10 -> 127.96.0.10). Services with no IPv4 ClusterIP, or whose mapped address is
 * reserved or taken, get an address hashed from `namespace/name` in 127.128.0.0/9 (stable across
 * restarts; linear probing on a collision). 127.0.0.0/16 is never handed out: 127.0.0.1 carries
 * node ports, and other local tools live there.
 */

export function isReservedLoopback(addr: string): boolean {
  // Both callers hand over a dotted quad (a cluster IP's last three octets, or a hashed address);
  // anything else is never handed out. The octets are read between the dots, without the arrays
  // split() would make: every Service's address passes here.
  const dots = threeDots(addr);
  if (dots === undefined) return true;
  const b = Number(addr.slice(dots[0] + 1, dots[1]));
  const c = Number(addr.slice(dots[1] + 1, dots[2]));
  const d = Number(addr.slice(dots[2] + 1));
  return b === 0 || d === 0 || d === 255 || (b === 255 && c === 255);
}

/** Where the dots of four dotted parts are; undefined unless there are exactly three. */
function threeDots(text: string): [number, number, number] | undefined {
  const first = text.indexOf('.');
  const second = first < 0 ? -1 : text.indexOf('.', first + 1);
  const third = second < 0 ? -1 : text.indexOf('.', second + 1);
  if (third < 0 || text.indexOf('.', third + 1) >= 0) return undefined;
  return [first, second, third];
}

function fromIPv4ClusterIP(ip: string): string | undefined {
  const dots = threeDots(ip);
  return dots === undefined ? undefined : `127${ip.slice(dots[0])}`;
}

/** FNV-1a, 32 bits: stable and cheap; no crypto needed for spreading names. */
function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

function hashed(serviceKey: string, probe: number): string {
  // 127.128.0.0/9: 23 bits of host part.
  const n = (fnv1a(serviceKey) + probe) % (1 << 23);
  const b = 128 + (n >>> 16);
  const c = (n >>> 8) & 0xff;
  const d = n & 0xff;
  return `127.${b}.${c}.${d}`;
}

/**
 * The loopback address for a Service. `taken` answers whether another Service already holds an
 * address; the caller records the result.
 */
export function loopbackAddressFor(serviceKey: string, clusterIPs: readonly string[], taken: (addr: string) => boolean): string {
  const v4 = clusterIPs.find((ip) => ip.includes('.') && !ip.includes(':'));
  const direct = v4 ? fromIPv4ClusterIP(v4) : undefined;
  if (direct && !isReservedLoopback(direct) && !taken(direct)) return direct;
  for (let probe = 0; probe < 1 << 23; probe++) {
    const addr = hashed(serviceKey, probe);
    if (!isReservedLoopback(addr) && !taken(addr)) return addr;
  }
  throw new Error('no free loopback address left in 127.128.0.0/9');
}
