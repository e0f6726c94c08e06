/**
 * The chains of the iptables portal and the jumps that lead into them. The chain names are the
 * legacy userspace proxy's, so tools and runbooks written for it still find them; the guard chain
 * is ours alone (the legacy mode had no guard).
 */

export type Table = 'nat' | 'filter';

/** Traffic from pods (and from other hosts) to a portal address: jumped to from the top of PREROUTING. */
export const PORTALS_CONTAINER = 'KUBE-PORTALS-CONTAINER';
/** Traffic the node itself sends to a portal address: jumped to from the top of OUTPUT. */
export const PORTALS_HOST = 'KUBE-PORTALS-HOST';
/** Node ports, arriving from elsewhere: jumped to from the bottom of PREROUTING, local destinations only. */
export const NODEPORT_CONTAINER = 'KUBE-NODEPORT-CONTAINER';
/** Node ports the node itself dials: jumped to from the bottom of OUTPUT, local destinations only. */
export const NODEPORT_HOST = 'KUBE-NODEPORT-HOST';
/** filter: lets redirected node-port traffic through a default-deny INPUT policy. */
export const NODEPORT_NON_LOCAL = 'KUBE-NODEPORT-NON-LOCAL';
/** filter: refuses new connections to a proxy port (or held node port) that no portal rule sent there. */
export const PROXY_PORTS_GUARD = 'KUBE-PROXY-PORTS';

export const OWN_CHAINS: Readonly<Record<Table, readonly string[]>> = {
  nat: [PORTALS_CONTAINER, PORTALS_HOST, NODEPORT_CONTAINER, NODEPORT_HOST],
  filter: [PROXY_PORTS_GUARD, NODEPORT_NON_LOCAL],
};

export function isOwnChain(table: string, chain: string): boolean {
  return (OWN_CHAINS[table as Table] ?? []).includes(chain);
}

/** A rule in a built-in chain that sends traffic into one of ours. */
export interface Jump {
  table: Table;
  /** The built-in chain holding the jump. */
  from: string;
  /** Our chain. */
  to: string;
  /** The rule's matches, as iptables-save prints them, without `-A chain` and `-j target`. */
  matches: string;
  /**
   * Where a missing jump is put. Portal jumps go first: a portal address must win over the broad
   * node-port match (an LB IP routed locally on some clouds counts as LOCAL, and its port may
   * equal another Service's node port). Node-port jumps go last for the same reason.
   */
  position: 'top' | 'bottom';
}

const LOCAL = '-m addrtype --dst-type LOCAL';

/**
 * In the order they must end up in. Two `top` jumps into one chain are inserted in reverse so the
 * first listed stays first: the guard must see a connection before the node-port ACCEPT does
 * (each is safe alone too: the ACCEPT requires a DNATed connection).
 */
export const JUMPS: readonly Jump[] = [
  { table: 'nat', from: 'PREROUTING', to: PORTALS_CONTAINER, matches: '-m comment --comment "kube-userspace-proxy service portals; before node ports"', position: 'top' },
  { table: 'nat', from: 'OUTPUT', to: PORTALS_HOST, matches: '-m comment --comment "kube-userspace-proxy service portals; before node ports"', position: 'top' },
  { table: 'nat', from: 'PREROUTING', to: NODEPORT_CONTAINER, matches: `${LOCAL} -m comment --comment "kube-userspace-proxy node ports; keep last"`, position: 'bottom' },
  { table: 'nat', from: 'OUTPUT', to: NODEPORT_HOST, matches: `${LOCAL} -m comment --comment "kube-userspace-proxy node ports; keep last"`, position: 'bottom' },
  { table: 'filter', from: 'INPUT', to: PROXY_PORTS_GUARD, matches: '-m comment --comment "kube-userspace-proxy proxy ports answer portal traffic only"', position: 'top' },
  { table: 'filter', from: 'INPUT', to: NODEPORT_NON_LOCAL, matches: '-m comment --comment "kube-userspace-proxy node port traffic may enter"', position: 'top' },
];
