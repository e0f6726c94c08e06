import { ipFamily, type HostPort, type IPFamily } from './address.js';
import type { PortalAddress } from './model.js';

/**
 * Where a client connected, for a connection that reached a proxy port through a NAT rule (the
 * iptables portal REDIRECTs or DNATs portal traffic to the unit's proxy port, so the accepted
 * socket's local address is the node's and the port the proxy port, not the Service's).
 *
 * The kernel knows the original destination (getsockopt SO_ORIGINAL_DST), but Node has no
 * getsockopt, and asking conntrack for it would be a process or a netlink round trip per
 * connection. The unit's portals tell it without either when they leave no choice: one portal
 * address in the client's family and no node port (a node port is reached on every node address,
 * in both families). That is the ClusterIP Service of one address per family, the common case. For
 * a unit reached several ways (externalIPs, load-balancer IPs, node ports), each family with
 * more than one candidate is left out and the caller falls back to the local address.
 */
export type PortalDestinations = Partial<Record<IPFamily, HostPort>>;

export function portalDestinations(portals: readonly PortalAddress[]): PortalDestinations {
  if (portals.some((p) => p.kind === 'nodePort')) return {};
  const byFamily = new Map<IPFamily, HostPort[]>();
  for (const p of portals) {
    const family = ipFamily(p.ip);
    if (family === undefined) continue;
    const list = byFamily.get(family) ?? [];
    list.push({ host: p.ip, port: p.port });
    byFamily.set(family, list);
  }
  const out: PortalDestinations = {};
  for (const [family, list] of byFamily) if (list.length === 1) out[family] = list[0];
  return out;
}
