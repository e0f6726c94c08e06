import { cidrContains, isLinkLocalV6, parseCidr, type IPFamily } from '../address.js';

/** One address of this node, as os.networkInterfaces() reports it. */
export interface NodeAddress {
  ip: string;
  family: IPFamily;
  iface: string;
  /** Loopback. */
  internal: boolean;
}

/**
 * The interface of the default route in /proc/net/route (IPv4): the lowest metric among up
 * routes to 0.0.0.0/0. Hex columns: Iface Destination Gateway Flags RefCnt Use Metric Mask ...
 */
export function defaultRouteInterfaceV4(procNetRoute: string): string | undefined {
  let best: { iface: string; metric: number } | undefined;
  for (const line of procNetRoute.split('\n').slice(1)) {
    const [iface, dest, , flags, , , metric, mask] = line.trim().split(/\s+/);
    if (!iface || dest !== '00000000' || mask !== '00000000') continue;
    if ((parseInt(flags ?? '0', 16) & 0x1) === 0) continue; // RTF_UP
    const m = Number(metric ?? 0);
    if (!best || m < best.metric) best = { iface, metric: m };
  }
  return best?.iface;
}

/**
 * The same for /proc/net/ipv6_route: dest prefix-len src src-len next-hop metric refcnt use flags
 * iface, all hex. The kernel's own catch-all `unreachable` default on lo (RTF_REJECT) is skipped.
 */
export function defaultRouteInterfaceV6(procIpv6Route: string): string | undefined {
  let best: { iface: string; metric: number } | undefined;
  for (const line of procIpv6Route.split('\n')) {
    const cols = line.trim().split(/\s+/);
    if (cols.length < 10) continue;
    const [dest, prefix, , , , metric, , , flags, iface] = cols as [string, string, string, string, string, string, string, string, string, string];
    if (!/^0+$/.test(dest) || parseInt(prefix, 16) !== 0) continue;
    const f = parseInt(flags, 16);
    if ((f & 0x1) === 0 || (f & 0x200) !== 0) continue; // RTF_UP, not RTF_REJECT
    const m = parseInt(metric, 16);
    if (!best || m < best.metric) best = { iface, metric: m };
  }
  return best?.iface;
}

/**
 * The address the node's own portal traffic is DNATed to (the legacy mode's "host IP"): an
 * address of the default route's interface, since a local client reaching a portal address by
 * that route picks it as its source, and a UDP reply only finds its way back through conntrack
 * from that same address. Then any other address that is not loopback or link-local, then
 * loopback. Addresses on `exclude` (the bind portal's own interface) never count.
 */
export function chooseHostIP(addresses: readonly NodeAddress[], family: IPFamily, defaultIface: string | undefined, exclude?: string): string {
  const usable = addresses.filter((a) => a.family === family && a.iface !== exclude && !isLinkLocalV6(a.ip));
  const onDefault = usable.find((a) => a.iface === defaultIface && !a.internal);
  if (onDefault) return onDefault.ip;
  const external = usable.find((a) => !a.internal);
  if (external) return external.ip;
  return family === 4 ? '127.0.0.1' : '::1';
}

/**
 * The node addresses `--nodeport-addresses` allows: those inside one of the CIDRs (every address
 * when there are none), never link-local IPv6 ones, never those on `exclude`.
 */
export function nodePortAddresses(addresses: readonly NodeAddress[], cidrs: readonly string[], exclude?: string): NodeAddress[] {
  const parsed = cidrs.map(parseCidr).filter((c) => c !== undefined);
  return addresses.filter((a) => a.iface !== exclude && !isLinkLocalV6(a.ip) && (parsed.length === 0 || parsed.some((c) => cidrContains(c, a.ip))));
}
