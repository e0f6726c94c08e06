import { cidrText, ipFamily, ipText, parseCidr, type IPFamily } from '../address.js';
import type { Protocol } from '../model.js';
import type { ProxyUnit } from '../units.js';
import {
  NODEPORT_CONTAINER,
  NODEPORT_HOST,
  NODEPORT_NON_LOCAL,
  PORTALS_CONTAINER,
  PORTALS_HOST,
  PROXY_PORTS_GUARD,
  TREE_PREFIX,
  type ChainRules,
  type TableChains,
} from './chains.js';
import { addressTree, portTree, type AddressEntry, type PortEntry } from './dispatch-tree.js';
import { familyHints, unitFamilies, type FamilyHints } from './families.js';
import { hostSharesContainer, unitRules, type UnitRulesContext } from './unit-rules.js';

/**
 * The iptables portal's rules for one IP family: the contents of each of our chains, as
 * iptables-save prints them. Pure: the caller brings the proxy ports it bound and the node's
 * address, and writes the chains (sync-plan.ts turns them into an iptables-restore transaction).
 *
 * REDIRECT or DNAT, and why:
 * - Traffic arriving from pods or other hosts (PREROUTING) is REDIRECTed to the proxy port when
 *   proxy ports listen on every address: REDIRECT rewrites the destination to the primary address
 *   of the interface the packet came in on, and the reply leaves by that same interface from that
 *   same address, so conntrack maps it back to the portal address. That matters for UDP, where
 *   the client checks the reply's source. DNAT to one fixed node address would make the reply
 *   leave from whichever address routing picks, which need not match.
 * - When proxy ports listen on one address only (`--bind-address`), REDIRECT could pick an address
 *   nothing listens on, so pod traffic is DNATed to that address instead.
 * - UDP the node itself sends (OUTPUT) cannot be REDIRECTed usefully: REDIRECT in OUTPUT means
 *   127.0.0.1 (::1), and a reply from the proxy's wildcard socket to a local client leaves from
 *   the client's own address, not from loopback, so conntrack misses it and UDP clients drop it.
 *   It is DNATed to an address of the node (the default route's, which is also the source a
 *   local client picks for a portal address routed that way), where conntrack does match. A node
 *   port is one of the node's addresses already (127.0.0.1, or any other): there only the port is
 *   DNATed (`--to-destination :port`), and the reply leaves from the address the client sent to;
 *   DNAT to the default route's address would answer a client of 127.0.0.1 from that address.
 * - TCP the node sends is REDIRECTed like arriving traffic: an accepted TCP socket answers from
 *   the address it was reached at (127.0.0.1 or ::1), which is what conntrack expects. So
 *   KUBE-PORTALS-HOST and KUBE-NODEPORT-HOST first jump to their CONTAINER twins for TCP (for
 *   everything with `--bind-address`, where both DNAT to it) and hold rules of their own for UDP
 *   only: one rule per portal instead of two, which halves what a sync writes. (The legacy mode
 *   DNATed every protocol in OUTPUT; the reason it gave, DNS replies, is UDP's.)
 * - Node ports arrive at any local address (the jump carries `--dst-type LOCAL`), or only at the
 *   `--nodeport-addresses` CIDRs (`-d CIDR` on each rule).
 *
 * Beyond the legacy layout, proxy ports answer portal traffic only: the filter chain
 * KUBE-PROXY-PORTS rejects a new connection to a proxy port (or to a held node port) unless
 * conntrack says it was DNATed, and REDIRECT counts as DNAT there. So `node-address:proxy-port`
 * from another host, or from a pod, is refused. The node-port ACCEPT in KUBE-NODEPORT-NON-LOCAL
 * requires DNAT too. Both conditions sit on the jumps from INPUT (so that other traffic pays one
 * comparison, see chains.ts) and again on each rule, so neither chain opens a proxy port or
 * refuses portal traffic if someone jumps into it without them.
 *
 * The rules sit in trees below the six root chains (dispatch-tree.ts): the nat rules by portal
 * address or node port, each carrying its unit's id as comment; the filter rules by port, as
 * `-m multiport` rules of up to 15 ports each (no comment: one rule serves up to 15 units).
 */

export interface PortalTarget {
  unit: ProxyUnit;
  /** The proxy port bound for the unit; a unit without one has no rules yet. */
  proxyPort?: number;
}

export interface IptablesRenderInput {
  family: IPFamily;
  targets: readonly PortalTarget[];
  /** `--bind-address`: `0.0.0.0` or `::` means every address (REDIRECT); any other, DNAT to it. */
  bindAddress: string;
  /** An address of this node in `family`: where the node's own portal traffic is DNATed. */
  hostIP: string;
  /** `--nodeport-addresses`; empty: every local address. Only the CIDRs of `family` count. */
  nodePortCIDRs: readonly string[];
  /** The families of each service port (familyHints of `targets`), when the caller has them already. */
  hints?: FamilyHints;
}

export interface RenderedRules {
  chains: TableChains;
  /** One line per portal that cannot be programmed in this family. */
  errors: string[];
}

export function isWildcard(address: string): boolean {
  return address === '0.0.0.0' || address === '::' || address === '';
}

/** The wildcard address of a family. Listeners on `::` are IPv6-only (src/io/net), so a family each. */
export function wildcardOf(family: IPFamily): string {
  return family === 4 ? '0.0.0.0' : '::';
}

/**
 * Where a unit's proxy port listens: the wildcard of each of its families (one port number for
 * all of them), or `--bind-address` alone.
 */
export function proxyPortHosts(bindAddress: string, families: readonly IPFamily[]): string[] {
  return isWildcard(bindAddress) ? families.map(wildcardOf) : [bindAddress];
}

/** Where a node port is held open: the wildcard of each of the Service's families. */
export function nodePortHoldHosts(families: readonly IPFamily[]): string[] {
  return families.map(wildcardOf);
}

/** The family a socket on `host` is reached in. */
export function hostFamily(host: string): IPFamily {
  return host === '' ? 4 : (ipFamily(host) ?? 4);
}

/** Ports per `-m multiport` rule: the match takes at most 15. */
const MULTIPORT_MAX = 15;

/** The same REJECT as iptables-save prints it back, so a dump compares equal to what was written. */
function rejectTarget(protocol: Protocol, family: IPFamily): string {
  if (protocol === 'TCP') return 'REJECT --reject-with tcp-reset';
  return family === 4 ? 'REJECT --reject-with icmp-port-unreachable' : 'REJECT --reject-with icmp6-port-unreachable';
}

/**
 * Runs of up to 15 ports (ascending, of one protocol) inside one block of 1,024, so each
 * multiport rule falls into exactly one leaf of a one-level port tree.
 */
export function multiportRuns(sorted: readonly number[]): number[][] {
  const runs: number[][] = [];
  let i = 0;
  while (i < sorted.length) {
    const block = (sorted[i] as number) >> 10;
    const run: number[] = [];
    while (i < sorted.length && run.length < MULTIPORT_MAX && (sorted[i] as number) >> 10 === block) run.push(sorted[i++] as number);
    runs.push(run);
  }
  return runs;
}

/** One multiport rule per run of multiportRuns; `specOf` writes the rule. */
function multiportEntries(ports: ReadonlyMap<Protocol, Set<number>>, specOf: (protocol: Protocol, ports: string) => string): PortEntry[] {
  const out: PortEntry[] = [];
  for (const [protocol, set] of ports) {
    for (const run of multiportRuns([...set].sort((a, b) => a - b))) out.push({ protocol, port: run[0] as number, spec: specOf(protocol, run.join(',')) });
  }
  return out;
}

/** KUBE-PROXY-PORTS: a new connection to these ports that no NAT rule sent there is refused. */
export function guardRule(family: IPFamily, protocol: Protocol, ports: string): string {
  const p = protocol.toLowerCase();
  return `-p ${p} -m multiport --dports ${ports} -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j ${rejectTarget(protocol, family)}`;
}

/** KUBE-NODEPORT-NON-LOCAL: node-port traffic redirected to these proxy ports may enter. */
export function acceptRule(protocol: Protocol, ports: string): string {
  const p = protocol.toLowerCase();
  return `-p ${p} -m multiport --dports ${ports} -m conntrack --ctstate NEW -m conntrack --ctstate DNAT -j ACCEPT`;
}

/**
 * The first rule of KUBE-PORTALS-HOST and KUBE-NODEPORT-HOST: the node's own traffic takes the
 * arriving traffic's rules (`into`) where they serve it (all of it with --bind-address, TCP
 * otherwise), then its own tree for the rest.
 */
export function hostRootJump(ctx: UnitRulesContext, into: string): string {
  return `${hostSharesContainer(ctx, 'UDP') ? '' : '-p tcp '}-j ${into}`;
}

/** What every unit's rules of one render share. */
export function renderContext(input: IptablesRenderInput): UnitRulesContext {
  return {
    family: input.family,
    // Addresses and CIDRs as iptables-save writes them back, so a dump of what was written compares equal.
    bindAddress: ipText(input.bindAddress),
    wildcard: isWildcard(input.bindAddress),
    bindFamily: hostFamily(input.bindAddress),
    hostIP: ipText(input.hostIP),
    nodePortDests: nodePortDestinations(input.family, input.nodePortCIDRs),
  };
}

function addPort(into: Map<Protocol, Set<number>>, protocol: Protocol, port: number): void {
  const set = into.get(protocol);
  if (set) set.add(port);
  else into.set(protocol, new Set([port]));
}

/**
 * Every chain, rendered from scratch. The portal renders with IncrementalRender instead
 * (incremental-render.ts), which keeps the trees from one sync to the next and must give exactly
 * this; this is the reference it is tested against, and what the goldens show.
 */
export function renderIptablesRules(input: IptablesRenderInput): RenderedRules {
  const errors: string[] = [];
  const portalsContainer: AddressEntry[] = [];
  const portalsHost: AddressEntry[] = [];
  const nodePortsContainer: PortEntry[] = [];
  const nodePortsHost: PortEntry[] = [];
  const guarded = new Map<Protocol, Set<number>>();
  const nodePortTargets = new Map<Protocol, Set<number>>();
  const hints = input.hints ?? familyHints(input.targets.map((t) => t.unit));
  const ctx = renderContext(input);
  const targets = [...input.targets].sort((a, b) => compareIds(a.unit.id, b.unit.id));
  for (const { unit, proxyPort } of targets) {
    if (proxyPort === undefined) continue;
    const r = unitRules(ctx, unit, proxyPort, unitFamilies(unit, hints));
    for (const port of r.guarded) addPort(guarded, unit.protocol, port);
    if (r.error !== undefined) errors.push(r.error);
    if (r.nodePortTarget) addPort(nodePortTargets, unit.protocol, proxyPort);
    for (const e of r.portalsContainer) portalsContainer.push(e);
    for (const e of r.portalsHost) portalsHost.push(e);
    for (const e of r.nodePortsContainer) nodePortsContainer.push(e);
    for (const e of r.nodePortsHost) nodePortsHost.push(e);
  }
  const tree = (root: string): string => TREE_PREFIX[root] as string;
  const hostTree = (root: string, into: string, chains: ChainRules): ChainRules => {
    chains.get(root)?.unshift(hostRootJump(ctx, into));
    return chains;
  };
  return {
    chains: {
      nat: new Map([
        ...addressTree(PORTALS_CONTAINER, tree(PORTALS_CONTAINER), input.family, portalsContainer),
        ...hostTree(PORTALS_HOST, PORTALS_CONTAINER, addressTree(PORTALS_HOST, tree(PORTALS_HOST), input.family, portalsHost)),
        ...portTree(NODEPORT_CONTAINER, tree(NODEPORT_CONTAINER), nodePortsContainer, 2),
        ...hostTree(NODEPORT_HOST, NODEPORT_CONTAINER, portTree(NODEPORT_HOST, tree(NODEPORT_HOST), nodePortsHost, 2)),
      ]),
      filter: new Map([
        ...portTree(PROXY_PORTS_GUARD, tree(PROXY_PORTS_GUARD), multiportEntries(guarded, (protocol, ports) => guardRule(input.family, protocol, ports)), 1),
        ...portTree(NODEPORT_NON_LOCAL, tree(NODEPORT_NON_LOCAL), multiportEntries(nodePortTargets, acceptRule), 1),
      ]),
    },
    errors,
  };
}

/** The order units are rendered in (and their rules listed in a leaf): by id, as code units compare. */
export function compareIds(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** `[undefined]` for "every local address", else one `-d` per CIDR of the family (none: no node ports in it). */
function nodePortDestinations(family: IPFamily, cidrs: readonly string[]): Array<string | undefined> {
  if (cidrs.length === 0) return [undefined];
  return cidrs.flatMap((text) => {
    const c = parseCidr(text);
    return c && c.family === family ? [cidrText(c)] : [];
  });
}

/** Whether a family has anything to program: a unit served in it, or a proxy port reachable in it. */
export function familyInUse(family: IPFamily, targets: readonly PortalTarget[], bindAddress: string, known?: FamilyHints): boolean {
  // What proxyPortHosts says, without making its list for every unit: the wildcards of the unit's
  // families, or --bind-address.
  if (!isWildcard(bindAddress) && hostFamily(bindAddress) === family) return targets.length > 0;
  const hints = known ?? familyHints(targets.map((t) => t.unit));
  // A family other than IPv4 (the default of a unit with no address of its own) is served by a
  // unit only through the addresses of its service port, which the hints hold: no need to look at
  // every unit, which a v4-only node would do for IPv6 at every sync.
  if (family !== 4) return [...hints.values()].some((f) => f.includes(family));
  return targets.some((t) => unitFamilies(t.unit, hints).includes(family));
}
