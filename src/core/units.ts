import { isDeepStrictEqual } from 'node:util';
import { ipFamily, type IPFamily } from './address.js';
import { namespacedName } from './object-key.js';
import type { AffinityPolicy, BalancerAlgorithm, Endpoint, PortalAddress, Protocol, ProxyProtocolVersion, ServicePort } from './model.js';

/**
 * A proxy unit is what the proxier runs: one balancer and one set of listeners for the portals
 * that share an endpoint set. A service port is one unit, or two when its internal and external
 * traffic policies differ: then external traffic (node ports, externalIPs, load-balancer IPs)
 * needs its own proxy socket so it can be sent to node-local endpoints only.
 */
export type TrafficScope = 'all' | 'cluster' | 'external';

export interface ProxyUnit {
  /** `ns/name:port`, with ` (external)` for the external half of a split service port. */
  id: string;
  /** The service port's key (`ns/name:port`). */
  servicePort: string;
  /** The Service's key (`ns/name`). */
  service: string;
  protocol: Protocol;
  scope: TrafficScope;
  portals: PortalAddress[];
  endpoints: Endpoint[];
  affinity: AffinityPolicy;
  /** Absent: round-robin. */
  loadBalancer?: BalancerAlgorithm;
  /** Hold connections this long while there are no endpoints; absent: reset them at once. */
  holdWhenEmptyMs?: number;
  /** Begin every TCP connection to the endpoints with a PROXY protocol header; absent: none. */
  proxyProtocol?: ProxyProtocolVersion;
  /** Endpoints of the port the dialer cannot reach (core/reach.ts), with why; absent when none. */
  unreachable?: Array<{ endpoint: string; reason: string }>;
  /**
   * The Service's IP families, on the external half of a split service port with a node port:
   * the families its node port is served in, which its other portals (none, or load-balancer and
   * external IPs of one family) need not say. A change of them (a Service made dual-stack)
   * recreates the unit, so it listens in the new family too. Absent where the ClusterIPs are
   * among the unit's portals.
   */
  families?: IPFamily[];
}

export interface EndpointSets {
  clusterEndpoints: Endpoint[];
  externalEndpoints: Endpoint[];
}

export function clusterPortals(sp: ServicePort): PortalAddress[] {
  return sp.clusterIPs.map((ip) => ({ kind: 'clusterIP', ip, port: sp.port }));
}

export function externalPortals(sp: ServicePort): PortalAddress[] {
  const out: PortalAddress[] = [];
  for (const ip of sp.externalIPs) out.push({ kind: 'externalIP', ip, port: sp.port });
  const ranges = sp.loadBalancerSourceRanges;
  for (const ip of sp.loadBalancerIPs) out.push(ranges === undefined ? { kind: 'loadBalancer', ip, port: sp.port } : { kind: 'loadBalancer', ip, port: sp.port, sourceRanges: ranges });
  if (sp.nodePort > 0) out.push({ kind: 'nodePort', ip: '', port: sp.nodePort });
  return out;
}

export function planUnits(sp: ServicePort, sets: EndpointSets): ProxyUnit[] {
  const base: Pick<ProxyUnit, 'servicePort' | 'service' | 'protocol' | 'affinity' | 'loadBalancer' | 'holdWhenEmptyMs' | 'proxyProtocol'> = {
    servicePort: sp.key,
    service: namespacedName(sp.name.namespace, sp.name.name),
    protocol: sp.protocol,
    affinity: sp.affinity,
  };
  if (sp.loadBalancer !== undefined) base.loadBalancer = sp.loadBalancer;
  if (sp.holdWhenEmptyMs !== undefined) base.holdWhenEmptyMs = sp.holdWhenEmptyMs;
  if (sp.proxyProtocol !== undefined) base.proxyProtocol = sp.proxyProtocol;
  const external = externalPortals(sp);
  if (external.length === 0 || sp.internalTrafficPolicy === sp.externalTrafficPolicy) {
    return [{ ...base, id: sp.key, scope: 'all', portals: [...clusterPortals(sp), ...external], endpoints: sets.clusterEndpoints }];
  }
  const externalUnit: ProxyUnit = { ...base, id: `${sp.key} (external)`, scope: 'external', portals: external, endpoints: sets.externalEndpoints };
  if (external.some((p) => p.kind === 'nodePort')) {
    const families = [...new Set(sp.clusterIPs.map(ipFamily).filter((f) => f !== undefined))].sort();
    if (families.length > 0) externalUnit.families = families;
  }
  return [{ ...base, id: sp.key, scope: 'cluster', portals: clusterPortals(sp), endpoints: sets.clusterEndpoints }, externalUnit];
}

export function portalKey(p: PortalAddress): string {
  // Source ranges are part of what the portal programs: a change re-renders its rules.
  return p.sourceRanges === undefined ? `${p.kind}|${p.ip}|${p.port}` : `${p.kind}|${p.ip}|${p.port}|${p.sourceRanges.join(',')}`;
}

/** Whether two units need different sockets (protocol or portals changed): then the listener is recreated. */
export function needsRecreate(a: ProxyUnit, b: ProxyUnit): boolean {
  if (a.protocol !== b.protocol || a.portals.length !== b.portals.length) return true;
  if ((a.families ?? []).join() !== (b.families ?? []).join()) return true;
  const keys = new Set(a.portals.map(portalKey));
  return b.portals.some((p) => !keys.has(portalKey(p)));
}

export interface UnitDiff {
  /** `update` holds only units that differ in something but their sockets. */
  open: ProxyUnit[];
  close: ProxyUnit[];
  recreate: Array<{ from: ProxyUnit; to: ProxyUnit }>;
  update: Array<{ from: ProxyUnit; to: ProxyUnit }>;
}

/** Desired vs running units of one Service (or of all): what to open, close, recreate, update. */
export function diffUnits(running: readonly ProxyUnit[], desired: readonly ProxyUnit[]): UnitDiff {
  const diff: UnitDiff = { open: [], close: [], recreate: [], update: [] };
  const byId = new Map(running.map((u) => [u.id, u]));
  for (const to of desired) {
    const from = byId.get(to.id);
    if (!from) diff.open.push(to);
    else if (needsRecreate(from, to)) diff.recreate.push({ from, to });
    // Unchanged units are left out: a resync re-plans every Service and must not update (and log)
    // every unit. Any field may carry a change (endpoints, affinity, what annotations add).
    else if (!isDeepStrictEqual(from, to)) diff.update.push({ from, to });
    byId.delete(to.id);
  }
  diff.close.push(...byId.values());
  return diff;
}
