import { hostPort, ipFamily, parseCidr, type IPFamily } from '../address.js';
import type { PortalAddress, Protocol } from '../model.js';
import type { ProxyUnit } from '../units.js';
import {
  NODEPORT_CONTAINER,
  NODEPORT_HOST,
  NODEPORT_NON_LOCAL,
  OWN_CHAINS,
  PORTALS_CONTAINER,
  PORTALS_HOST,
  PROXY_PORTS_GUARD,
  type Table,
} from './chains.js';
import { familyHints, unitFamilies } from './families.js';
import type { JumpPlan } from './iptables-save.js';

/**
 * The iptables portal's rules for one IP family, rendered as iptables-restore text. Pure: the
 * caller brings the proxy ports it bound and the node's address, and runs the text.
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
 * - Traffic the node itself sends (OUTPUT) cannot be REDIRECTed usefully: REDIRECT in OUTPUT
 *   means 127.0.0.1 (::1), and a reply from the proxy's wildcard socket to a local client leaves
 *   from the client's own address, not from loopback, so conntrack misses it and UDP clients drop
 *   it. It is DNATed to an address of the node (the default route's, which is also the source a
 *   local client picks for a portal address routed that way), where conntrack does match.
 * - Node ports arrive at any local address (the jump carries `--dst-type LOCAL`), or only at the
 *   `--nodeport-addresses` CIDRs (`-d CIDR` on each rule).
 *
 * Beyond the legacy layout, proxy ports answer portal traffic only: the filter chain
 * KUBE-PROXY-PORTS rejects a new connection to a proxy port (or to a held node port) unless
 * conntrack says it was DNATed, and REDIRECT counts as DNAT there. So `node-address:proxy-port`
 * from another host, or from a pod, is refused. The node-port ACCEPT in KUBE-NODEPORT-NON-LOCAL
 * requires DNAT too, so neither chain opens a proxy port on its own, whatever their order.
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
}

export interface RenderedRules {
  /** `-A` lines per table, in the order they are to be written. */
  rules: Record<Table, string[]>;
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


function quote(text: string): string {
  return `"${text.replace(/["\\]/g, (c) => `\\${c}`)}"`;
}

function match(protocol: Protocol, comment: string, dport: number, dest?: string): string {
  const p = protocol.toLowerCase();
  return `${dest ? `-d ${dest} ` : ''}-p ${p} -m comment --comment ${quote(comment)} -m ${p} --dport ${dport}`;
}

function hostPrefix(ip: string): string {
  return ip.includes(':') ? `${ip}/128` : `${ip}/32`;
}

interface UnitContext {
  family: IPFamily;
  unit: ProxyUnit;
  proxyPort: number;
  containerTarget: string;
  hostTarget: string;
  nodePortDests: Array<string | undefined>;
}

export function renderIptablesRules(input: IptablesRenderInput): RenderedRules {
  const out: RenderedRules = { rules: { nat: [], filter: [] }, errors: [] };
  const byChain = new Map<string, string[]>([...OWN_CHAINS.nat, ...OWN_CHAINS.filter].map((c) => [c, []]));
  const add = (chain: string, line: string): void => {
    byChain.get(chain)?.push(`-A ${chain} ${line}`);
  };
  const hints = familyHints(input.targets.map((t) => t.unit));
  const nodePortDests = nodePortDestinations(input.family, input.nodePortCIDRs);
  const guarded = new Set<string>();
  const guard = (protocol: Protocol, port: number, comment: string): void => {
    const key = `${protocol}/${port}`;
    if (guarded.has(key)) return;
    guarded.add(key);
    const reject = protocol === 'TCP' ? 'REJECT --reject-with tcp-reset' : 'REJECT';
    add(PROXY_PORTS_GUARD, `${match(protocol, comment, port)} -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j ${reject}`);
  };

  const targets = [...input.targets].sort((a, b) => (a.unit.id < b.unit.id ? -1 : a.unit.id > b.unit.id ? 1 : 0));
  for (const { unit, proxyPort } of targets) {
    if (proxyPort === undefined) continue;
    const families = unitFamilies(unit, hints);
    const comment = unit.id;
    if (proxyPortHosts(input.bindAddress, families).some((h) => hostFamily(h) === input.family)) guard(unit.protocol, proxyPort, comment);
    if (!families.includes(input.family)) continue;
    for (const p of unit.portals) if (p.kind === 'nodePort') guard(unit.protocol, p.port, `${comment} node port`);
    const ctx = unitContext(input, unit, proxyPort, nodePortDests);
    if (typeof ctx === 'string') {
      out.errors.push(ctx);
      continue;
    }
    for (const p of unit.portals) renderPortal(ctx, p, add);
  }
  for (const table of ['nat', 'filter'] as const) {
    for (const chain of OWN_CHAINS[table]) out.rules[table].push(...(byChain.get(chain) ?? []));
  }
  return out;
}

/** `[undefined]` for "every local address", else one `-d` per CIDR of the family (none: no node ports in it). */
function nodePortDestinations(family: IPFamily, cidrs: readonly string[]): Array<string | undefined> {
  if (cidrs.length === 0) return [undefined];
  return cidrs.flatMap((text) => {
    const c = parseCidr(text);
    return c && c.family === family ? [c.text] : [];
  });
}

function unitContext(input: IptablesRenderInput, unit: ProxyUnit, proxyPort: number, nodePortDests: Array<string | undefined>): UnitContext | string {
  if (isWildcard(input.bindAddress)) {
    return { family: input.family, unit, proxyPort, containerTarget: `REDIRECT --to-ports ${proxyPort}`, hostTarget: `DNAT --to-destination ${hostPort({ host: input.hostIP, port: proxyPort })}`, nodePortDests };
  }
  if (ipFamily(input.bindAddress) !== input.family) {
    return `${unit.id}: cannot program its IPv${input.family} portals: proxy ports listen on --bind-address ${input.bindAddress} only`;
  }
  const target = `DNAT --to-destination ${hostPort({ host: input.bindAddress, port: proxyPort })}`;
  return { family: input.family, unit, proxyPort, containerTarget: target, hostTarget: target, nodePortDests };
}

function renderPortal(ctx: UnitContext, p: PortalAddress, add: (chain: string, line: string) => void): void {
  const { unit, proxyPort } = ctx;
  const comment = unit.id;
  if (p.kind === 'nodePort') {
    for (const dest of ctx.nodePortDests) {
      add(NODEPORT_CONTAINER, `${match(unit.protocol, comment, p.port, dest)} -j ${ctx.containerTarget}`);
      add(NODEPORT_HOST, `${match(unit.protocol, comment, p.port, dest)} -j ${ctx.hostTarget}`);
    }
    if (ctx.nodePortDests.length > 0) {
      add(NODEPORT_NON_LOCAL, `${match(unit.protocol, comment, proxyPort)} -m conntrack --ctstate NEW -m conntrack --ctstate DNAT -j ACCEPT`);
    }
    return;
  }
  if (ipFamily(p.ip) !== ctx.family) return;
  // ClusterIPs, externalIPs and load-balancer IPs alike: from pods, from other hosts and from
  // the node itself. (The legacy mode skipped bridged pod traffic to a non-local externalIP;
  // today's kube-proxy serves it, and so do we.)
  add(PORTALS_CONTAINER, `${match(unit.protocol, comment, p.port, hostPrefix(p.ip))} -j ${ctx.containerTarget}`);
  add(PORTALS_HOST, `${match(unit.protocol, comment, p.port, hostPrefix(p.ip))} -j ${ctx.hostTarget}`);
}

/**
 * One iptables-restore `--noflush` transaction: declaring each of our chains empties it (or
 * creates it), so the rules below replace its contents whole; jumps are fixed in the same
 * transaction; no other chain is touched.
 */
export function restorePayload(rendered: RenderedRules, jumps: JumpPlan): string {
  const lines: string[] = [];
  for (const table of ['nat', 'filter'] as const) {
    lines.push(`*${table}`);
    for (const chain of OWN_CHAINS[table]) lines.push(`:${chain} - [0:0]`);
    lines.push(...jumps[table], ...rendered.rules[table], 'COMMIT');
  }
  return `${lines.join('\n')}\n`;
}

/** Whether a family has anything to program: a unit served in it, or a proxy port reachable in it. */
export function familyInUse(family: IPFamily, targets: readonly PortalTarget[], bindAddress: string): boolean {
  const hints = familyHints(targets.map((t) => t.unit));
  return targets.some((t) => {
    const families = unitFamilies(t.unit, hints);
    return families.includes(family) || proxyPortHosts(bindAddress, families).some((h) => hostFamily(h) === family);
  });
}
