import { ipFamily, ipText, type IPFamily } from '../address.js';
import type { Protocol } from '../model.js';
import type { ProxyUnit } from '../units.js';

/**
 * Stale conntrack entries of the iptables portal, found in `conntrack -L` output, pure.
 *
 * Why: netfilter NATs only the first packet of a flow; later packets follow its conntrack entry.
 * A UDP client that keeps sending keeps its entry alive for good, so when the proxy port behind a
 * portal changes (a restart that could not keep its port, a listener recreated) its packets keep
 * going to the old port, where nothing answers, or where another Service's socket now listens.
 * Entries made before our rules existed (the packets went nowhere) are stuck the same way.
 * kube-proxy deletes stale UDP entries for the same reason. The deletion is what lets the next
 * packet be NATed afresh, to the current proxy port.
 *
 * TCP mostly heals itself (a new SYN on a closed entry re-opens it), but a SYN on an entry the
 * kernel still holds as established or closing is let through to the old port. Its entries are
 * deleted only when they point at a proxy port this process has never bound, so no connection it
 * serves (a retired listener's connections run on until they end) can lose its entry; entries
 * that were not NATed to this node are left alone, as they may be real connections elsewhere.
 */

export interface FlowTuple {
  src: string;
  dst: string;
  sport: number;
  dport: number;
}

export interface ConntrackEntry {
  /** `tcp` or `udp`, as conntrack prints it. */
  protocol: string;
  /** The flow as the client sent it: the portal address is `orig.dst:orig.dport`. */
  orig: FlowTuple;
  /** The flow as the answer comes back: after our NAT, `reply.src:reply.sport` is the proxy port. */
  reply: FlowTuple;
}

const TUPLE_KEYS = ['src', 'dst', 'sport', 'dport'] as const;

/** Parses `conntrack -L` lines (plain or `-o extended`); lines it cannot read are skipped. */
export function parseConntrackList(text: string): ConntrackEntry[] {
  const out: ConntrackEntry[] = [];
  for (const line of text.split('\n')) {
    const words = line.trim().split(/\s+/);
    const protocol = words.find((w) => w === 'tcp' || w === 'udp');
    if (protocol === undefined) continue;
    // The first src/dst/sport/dport are the original direction, the second the reply's.
    const tuples: Array<Partial<Record<(typeof TUPLE_KEYS)[number], string>>> = [{}, {}];
    for (const w of words) {
      const eq = w.indexOf('=');
      const key = w.slice(0, eq) as (typeof TUPLE_KEYS)[number];
      if (eq < 0 || !TUPLE_KEYS.includes(key)) continue;
      const t = tuples[0]?.[key] === undefined ? tuples[0] : tuples[1];
      if (t && t[key] === undefined) t[key] = w.slice(eq + 1);
    }
    const [orig, reply] = tuples.map(toTuple);
    if (orig && reply) out.push({ protocol, orig, reply });
  }
  return out;
}

function toTuple(t: Partial<Record<(typeof TUPLE_KEYS)[number], string>> | undefined): FlowTuple | undefined {
  if (!t?.src || !t.dst || !t.sport || !t.dport) return undefined;
  const sport = Number(t.sport);
  const dport = Number(t.dport);
  if (!Number.isInteger(sport) || !Number.isInteger(dport)) return undefined;
  return { src: t.src.toLowerCase(), dst: t.dst.toLowerCase(), sport, dport };
}

export interface ConntrackTarget {
  unit: ProxyUnit;
  /** The proxy port the unit's portal rules point at now. */
  proxyPort: number;
}

export interface StaleQuery {
  /** The family of the dump the entries come from: only portals of this family (and node ports) count. */
  family: IPFamily;
  /** Units whose portals to look at, with their current proxy ports. */
  targets: readonly ConntrackTarget[];
  /** This node's addresses: our REDIRECT and DNAT send traffic to one of them. */
  localAddresses: ReadonlySet<string>;
  /** Every TCP proxy port this process has bound: connections on those may still be served. */
  servedTcpPorts: ReadonlySet<number>;
}

/**
 * One `conntrack -D` filter (protocol, original destination, reply source): each entry it
 * matches is stale by the rules above, since they depend on these fields only.
 */
export interface StaleFlows {
  protocol: Protocol;
  family: IPFamily;
  origDst: string;
  origDport: number;
  replySrc: string;
  replySport: number;
  /** How many entries the listing showed, and whose portal they were sent to: for the log. */
  entries: number;
  unit: string;
}

/** The stale entries among `entries`, grouped into as few delete filters as their fields allow. */
export function staleFlows(entries: readonly ConntrackEntry[], q: StaleQuery): StaleFlows[] {
  // The usual answer at a first sync; not worth indexing every target's portals for.
  if (entries.length === 0) return [];
  const byPortal = new Map<string, ConntrackTarget>();
  const byNodePort = new Map<string, ConntrackTarget>();
  for (const t of q.targets) {
    const proto = t.unit.protocol.toLowerCase();
    for (const p of t.unit.portals) {
      if (p.kind === 'nodePort') byNodePort.set(`${proto}|${p.port}`, t);
      // conntrack writes addresses as inet_ntop does (`fd00::b`, not `fd00:0:0::B`).
      else if (ipFamily(p.ip) === q.family) byPortal.set(`${proto}|${ipText(p.ip)}|${p.port}`, t);
    }
  }
  const groups = new Map<string, StaleFlows>();
  for (const e of entries) {
    const local = q.localAddresses.has(e.reply.src);
    const exact = byPortal.get(`${e.protocol}|${e.orig.dst}|${e.orig.dport}`);
    // A node port is reached at any local address: only entries our rules sent to this node count.
    const target = exact ?? (local ? byNodePort.get(`${e.protocol}|${e.orig.dport}`) : undefined);
    if (!target || !isStale(e, target, exact === undefined, local, q.servedTcpPorts)) continue;
    const key = `${e.protocol}|${e.orig.dst}|${e.orig.dport}|${e.reply.src}|${e.reply.sport}`;
    const group = groups.get(key);
    if (group) group.entries++;
    else groups.set(key, { protocol: target.unit.protocol, family: q.family, origDst: e.orig.dst, origDport: e.orig.dport, replySrc: e.reply.src, replySport: e.reply.sport, entries: 1, unit: target.unit.id });
  }
  return [...groups.values()];
}

function isStale(e: ConntrackEntry, t: ConntrackTarget, nodePort: boolean, local: boolean, servedTcpPorts: ReadonlySet<number>): boolean {
  if (e.reply.sport === t.proxyPort) return false;
  // Not NATed: to a node port that is the proxy's own held socket, which serves it.
  const natted = e.reply.sport !== e.orig.dport;
  if (t.unit.protocol === 'UDP') return natted || !nodePort;
  return natted && local && !servedTcpPorts.has(e.reply.sport);
}
