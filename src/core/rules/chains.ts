/**
 * The chains of the iptables portal and the jumps that lead into them. The six root chains keep
 * the legacy userspace proxy's names, so tools and runbooks written for it still find them (the
 * guard chain is ours alone: the legacy mode had no guard). Below each root hangs a small tree of
 * chains of our own (see dispatch-tree.ts), all named `KUBE-UP-<tree>-...`, so that a packet is
 * compared with a handful of rules rather than with one rule per Service.
 */

export type Table = 'nat' | 'filter';

/** Chain name -> its rules, each as iptables-save prints it without `-A <chain> `, in order. */
export type ChainRules = Map<string, string[]>;

/** The contents of our chains, per table: as rendered, as written, or as read back from a dump. */
export type TableChains = Record<Table, ChainRules>;

export function emptyChains(): TableChains {
  return { nat: new Map(), filter: new Map() };
}

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

/** Every chain of the trees below the roots starts with this. */
export const SUBCHAIN_PREFIX = 'KUBE-UP-';

/** The prefix of the tree below each root (`KUBE-UP-PC-`...): two letters, so names stay under iptables' 28 characters. */
export const TREE_PREFIX: Readonly<Record<string, string>> = {
  [PORTALS_CONTAINER]: `${SUBCHAIN_PREFIX}PC-`,
  [PORTALS_HOST]: `${SUBCHAIN_PREFIX}PH-`,
  [NODEPORT_CONTAINER]: `${SUBCHAIN_PREFIX}NC-`,
  [NODEPORT_HOST]: `${SUBCHAIN_PREFIX}NH-`,
  [PROXY_PORTS_GUARD]: `${SUBCHAIN_PREFIX}PP-`,
  [NODEPORT_NON_LOCAL]: `${SUBCHAIN_PREFIX}NL-`,
};

const TREE_PREFIXES: Readonly<Record<Table, readonly string[]>> = {
  nat: OWN_CHAINS.nat.map((c) => TREE_PREFIX[c] as string),
  filter: OWN_CHAINS.filter.map((c) => TREE_PREFIX[c] as string),
};

/** A root chain of ours, or a chain of the tree below one (in the table that tree lives in). */
export function isOwnChain(table: string, chain: string): boolean {
  const t = table as Table;
  if ((OWN_CHAINS[t] ?? []).includes(chain)) return true;
  return chain.startsWith(SUBCHAIN_PREFIX) && (TREE_PREFIXES[t] ?? []).some((p) => chain.startsWith(p));
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
 * first listed stays first (they are disjoint today, so the order is for readers).
 *
 * The filter jumps carry conntrack conditions: INPUT sees every packet of every connection on the
 * node, ours or not, and a packet that fails the first match of a jump costs one comparison. Only
 * a connection's first packet (state NEW) can be refused or let in, and of those the guard wants
 * the ones no NAT rule sent (`! --ctstate DNAT`; REDIRECT counts as DNAT), the node-port ACCEPTs
 * the ones one did. (The nat jumps need no such condition: netfilter consults the nat table for a
 * connection's first packet only.)
 */
export const JUMPS: readonly Jump[] = [
  { table: 'nat', from: 'PREROUTING', to: PORTALS_CONTAINER, matches: '-m comment --comment "kube-userspace-proxy service portals; before node ports"', position: 'top' },
  { table: 'nat', from: 'OUTPUT', to: PORTALS_HOST, matches: '-m comment --comment "kube-userspace-proxy service portals; before node ports"', position: 'top' },
  { table: 'nat', from: 'PREROUTING', to: NODEPORT_CONTAINER, matches: `${LOCAL} -m comment --comment "kube-userspace-proxy node ports; keep last"`, position: 'bottom' },
  { table: 'nat', from: 'OUTPUT', to: NODEPORT_HOST, matches: `${LOCAL} -m comment --comment "kube-userspace-proxy node ports; keep last"`, position: 'bottom' },
  { table: 'filter', from: 'INPUT', to: PROXY_PORTS_GUARD, matches: '-m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -m comment --comment "kube-userspace-proxy proxy ports answer portal traffic only"', position: 'top' },
  { table: 'filter', from: 'INPUT', to: NODEPORT_NON_LOCAL, matches: '-m conntrack --ctstate NEW -m conntrack --ctstate DNAT -m comment --comment "kube-userspace-proxy node port traffic may enter"', position: 'top' },
];
