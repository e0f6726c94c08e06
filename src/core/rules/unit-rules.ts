import { cidrsOfFamily, cidrText, hostPort, ipFamily, ipText, ipToBigInt, type IPFamily } from '../address.js';
import type { PortalAddress, Protocol } from '../model.js';
import type { ProxyUnit } from '../units.js';
import type { AddressEntry, PortEntry } from './dispatch-tree.js';

/**
 * The rules one unit adds to the chains of one family (see render-iptables.ts for what they do
 * and why). Pure.
 */

/** What is the same for every unit of one render. */
export interface UnitRulesContext {
  family: IPFamily;
  /** `--bind-address`; a wildcard means REDIRECT. */
  bindAddress: string;
  wildcard: boolean;
  /** The family `--bind-address` is reached in. */
  bindFamily: IPFamily;
  hostIP: string;
  /** `[undefined]`: node ports on every local address; else one `-d` per CIDR (none: no node ports). */
  nodePortDests: ReadonlyArray<string | undefined>;
}

export interface UnitRules {
  portalsContainer: AddressEntry[];
  portalsHost: AddressEntry[];
  nodePortsContainer: PortEntry[];
  nodePortsHost: PortEntry[];
  /** Ports (of the unit's protocol) to refuse unless DNATed: its proxy port, its held node ports. */
  guarded: number[];
  /** Whether node-port traffic is redirected to the proxy port (KUBE-NODEPORT-NON-LOCAL lets it in). */
  nodePortTarget: boolean;
  /** Why the unit's portals cannot be programmed in this family. */
  error?: string;
}

function quote(text: string): string {
  return /["\\]/.test(text) ? `"${text.replace(/["\\]/g, (c) => `\\${c}`)}"` : `"${text}"`;
}

function lastByte(ip: string, family: IPFamily): number {
  if (family === 4) return Number(ip.slice(ip.lastIndexOf('.') + 1));
  return Number((ipToBigInt(ip)?.value ?? 0n) & 0xffn);
}

export function unitRules(ctx: UnitRulesContext, unit: ProxyUnit, proxyPort: number, families: readonly IPFamily[]): UnitRules {
  const out: UnitRules = { portalsContainer: [], portalsHost: [], nodePortsContainer: [], nodePortsHost: [], guarded: [], nodePortTarget: false };
  const inFamily = families.includes(ctx.family);
  // The proxy port is reachable in this family: on the wildcard of each of the unit's families,
  // or on --bind-address alone (see proxyPortHosts).
  if (ctx.wildcard ? inFamily : ctx.bindFamily === ctx.family) out.guarded.push(proxyPort);
  if (!inFamily) return out;
  for (const p of unit.portals) if (p.kind === 'nodePort') out.guarded.push(p.port);
  let containerTarget: string;
  if (ctx.wildcard) {
    containerTarget = `REDIRECT --to-ports ${proxyPort}`;
  } else if (ipFamily(ctx.bindAddress) !== ctx.family) {
    out.error = `${unit.id}: cannot program its IPv${ctx.family} portals: proxy ports listen on --bind-address ${ctx.bindAddress} only`;
    return out;
  } else {
    containerTarget = `DNAT --to-destination ${hostPort({ host: ctx.bindAddress, port: proxyPort })}`;
  }
  // The node's own traffic takes the arriving traffic's rules (the host chains jump there) where
  // the target would be the same or, for TCP, works as well: see hostSharesContainer.
  const shares = hostSharesContainer(ctx, unit.protocol);
  const hostTarget = shares ? undefined : `DNAT --to-destination ${hostPort({ host: ctx.hostIP, port: proxyPort })}`;
  // A node port is already one of the node's addresses (127.0.0.1 included): only the port
  // changes, so the proxy's wildcard socket answers from the address the client sent to.
  const hostNodePortTarget = shares ? undefined : `DNAT --to-destination :${proxyPort}`;
  const p = unit.protocol.toLowerCase();
  const matchPrefix = `-p ${p} -m comment --comment ${quote(unit.id)} -m ${p} --dport`;
  for (const portal of unit.portals) portalRules(ctx, unit, portal, matchPrefix, containerTarget, portal.kind === 'nodePort' ? hostNodePortTarget : hostTarget, out);
  return out;
}

/**
 * Whether the node's own traffic of `protocol` goes through the rules of arriving traffic: with
 * `--bind-address` both DNAT to it, and TCP is answered from the address it was sent to, so
 * REDIRECT (to 127.0.0.1 or ::1 in OUTPUT) serves it too (see render-iptables.ts).
 */
export function hostSharesContainer(ctx: Pick<UnitRulesContext, 'wildcard'>, protocol: Protocol): boolean {
  return !ctx.wildcard || protocol === 'TCP';
}

function portalRules(ctx: UnitRulesContext, unit: ProxyUnit, portal: PortalAddress, matchPrefix: string, containerTarget: string, hostTarget: string | undefined, out: UnitRules): void {
  if (portal.kind === 'nodePort') {
    const protocol = unit.protocol;
    for (const dest of ctx.nodePortDests) {
      const match = `${dest ? `-d ${dest} ` : ''}${matchPrefix} ${portal.port}`;
      out.nodePortsContainer.push({ protocol, port: portal.port, spec: `${match} -j ${containerTarget}` });
      if (hostTarget !== undefined) out.nodePortsHost.push({ protocol, port: portal.port, spec: `${match} -j ${hostTarget}` });
    }
    if (ctx.nodePortDests.length > 0) out.nodePortTarget = true;
    return;
  }
  const family = ipFamily(portal.ip);
  if (family !== ctx.family) return;
  // ClusterIPs, externalIPs and load-balancer IPs alike: from pods, from other hosts and from
  // the node itself. (The legacy mode skipped bridged pod traffic to a non-local externalIP;
  // today's kube-proxy serves it, and so do we.)
  const byte = lastByte(portal.ip, family);
  for (const source of sourceMatches(portal.sourceRanges, family)) {
    // As iptables-save writes the address back (`FD00:0::A` is `fd00::a`): see cidrText.
    const match = `${source}-d ${ipText(portal.ip)}/${family === 4 ? 32 : 128} ${matchPrefix} ${portal.port}`;
    out.portalsContainer.push({ lastByte: byte, spec: `${match} -j ${containerTarget}` });
    if (hostTarget !== undefined) out.portalsHost.push({ lastByte: byte, spec: `${match} -j ${hostTarget}` });
  }
}

const ANY_SOURCE: readonly string[] = [''];

/**
 * The `-s` matches of a portal: one rule per source range of this family (a load balancer's
 * spec.loadBalancerSourceRanges); the portal's traffic from elsewhere is not redirected (kube-proxy
 * drops it; unredirected, nothing serves it here). As kube-proxy, only the ranges of the portal's
 * family count: with none of it, the portal takes every source. Written as iptables-save writes
 * them back (cidrText; a /0 has no -s).
 */
function sourceMatches(ranges: readonly string[] | undefined, family: IPFamily): readonly string[] {
  // Nearly every portal: no ranges, and nothing made for it at each render.
  if (ranges === undefined) return ANY_SOURCE;
  const cidrs = cidrsOfFamily(ranges, family);
  if (cidrs.length === 0) return ANY_SOURCE;
  return [...new Set(cidrs.map((c) => (c.prefix === 0 ? '' : `-s ${cidrText(c)} `)))];
}
