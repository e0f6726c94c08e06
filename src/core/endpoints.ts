import { compareEndpoints, inEndpointOrder, toEndpoint, type Endpoint, type EndpointInfo, type NodeInfo, type ServicePort } from './model.js';

/**
 * Which endpoints serve a Service port from this node: kube-proxy's CategorizeEndpoints
 * (pkg/proxy/topology.go), reshaped for a proxy that keeps one balancer for internal traffic
 * (cluster IPs) and one for external traffic (node ports, external and load-balancer IPs).
 *
 * spec.trafficDistribution is honoured the way current kube-proxy honours it: through the hints
 * the EndpointSlice controller writes for it (zone hints for PreferClose/PreferSameZone, node
 * hints for PreferSameNode). kube-proxy itself never reads the field, so neither does this.
 */

export interface CategorizedEndpoints {
  /** Where traffic to a cluster IP goes (internalTrafficPolicy applied). Empty: reset connections. */
  clusterEndpoints: Endpoint[];
  /** Where traffic to a node port, external IP or load-balancer IP goes (externalTrafficPolicy applied). */
  externalEndpoints: Endpoint[];
  /** Ready endpoints on this node: what the health check node port reports. */
  localReadyEndpoints: number;
  /** Whether topology hints narrowed the cluster-policy endpoints. */
  useTopology: boolean;
}

type TopologyMode = '' | 'PreferSameZone' | 'PreferSameNode';

export function categorizeEndpoints(sp: ServicePort, node: NodeInfo): CategorizedEndpoints {
  const all = sp.endpoints;
  const isLocal = (ep: EndpointInfo): boolean => node.name !== '' && ep.nodeName === node.name;
  const external = externallyAccessible(sp);
  const usesCluster = sp.internalTrafficPolicy === 'Cluster' || (external && sp.externalTrafficPolicy === 'Cluster');
  const usesLocal = sp.internalTrafficPolicy === 'Local' || (external && sp.externalTrafficPolicy === 'Local');

  const mode = usesCluster ? topologyModeFromHints(all, node) : '';
  const cluster = usesCluster ? clusterPolicyEndpoints(all, mode, node) : [];
  const local = usesLocal ? localPolicyEndpoints(all, isLocal) : [];

  const clusterEndpoints = toSorted(sp.internalTrafficPolicy === 'Local' ? local : cluster);
  return {
    clusterEndpoints,
    // One policy for both: the same list, made once (the units never change a list they are given).
    externalEndpoints: !external ? [] : sp.externalTrafficPolicy === sp.internalTrafficPolicy ? clusterEndpoints : toSorted(sp.externalTrafficPolicy === 'Local' ? local : cluster),
    localReadyEndpoints: all.filter((ep) => ep.ready && isLocal(ep)).length,
    useTopology: mode !== '',
  };
}

/**
 * kube-proxy's no-local-endpoints (sync_proxy_rules_no_local_endpoints_total): the port has
 * usable endpoints somewhere, but its Local internal (or external) traffic policy finds none on
 * this node, so that traffic is dropped.
 */
export function lacksLocalEndpoints(sp: ServicePort, sets: CategorizedEndpoints): { internal: boolean; external: boolean } {
  const usable = sp.endpoints.some((ep) => ep.ready || (ep.serving && ep.terminating));
  return {
    internal: usable && sp.internalTrafficPolicy === 'Local' && sets.clusterEndpoints.length === 0,
    external: usable && externallyAccessible(sp) && sp.externalTrafficPolicy === 'Local' && sets.externalEndpoints.length === 0,
  };
}

/** ServicePort.ExternallyAccessible: has some portal outside the cluster IPs. */
function externallyAccessible(sp: ServicePort): boolean {
  return sp.nodePort !== 0 || sp.externalIPs.length > 0 || sp.loadBalancerIPs.length > 0;
}

/**
 * Ready endpoints available under the topology mode; if there are none, serving-and-terminating
 * ones anywhere (topology has already been dropped if it would leave no ready endpoint, so the
 * fallback means no ready endpoint exists at all).
 */
function clusterPolicyEndpoints(all: readonly EndpointInfo[], mode: TopologyMode, node: NodeInfo): EndpointInfo[] {
  const ready = all.filter((ep) => ep.ready && availableForTopology(ep, mode, node));
  return ready.length > 0 ? ready : all.filter((ep) => ep.serving && ep.terminating);
}

/** Ready local endpoints; if none, serving-and-terminating local ones. Topology never applies. */
function localPolicyEndpoints(all: readonly EndpointInfo[], isLocal: (ep: EndpointInfo) => boolean): EndpointInfo[] {
  const ready = all.filter((ep) => isLocal(ep) && ep.ready);
  return ready.length > 0 ? ready : all.filter((ep) => isLocal(ep) && ep.serving && ep.terminating);
}

/**
 * topologyModeFromHints, with the PreferSameTrafficDistribution gate on (its default since
 * 1.34): node hints win when every ready endpoint has one and one names this node; else zone
 * hints when every ready endpoint has one and one names this node's zone; else no topology.
 * Hints are all or nothing, so a half-hinted slice set never strands traffic.
 */
function topologyModeFromHints(all: readonly EndpointInfo[], node: NodeInfo): TopologyMode {
  const ready = all.filter((ep) => ep.ready);
  if (ready.length === 0) return '';
  const zone = node.zone ?? '';
  const allNodeHints = ready.every((ep) => (ep.nodeHints?.length ?? 0) > 0);
  if (allNodeHints && ready.some((ep) => ep.nodeHints?.includes(node.name))) return 'PreferSameNode';
  const allZoneHints = ready.every((ep) => (ep.zoneHints?.length ?? 0) > 0);
  if (allZoneHints && ready.some((ep) => ep.zoneHints?.includes(zone))) return 'PreferSameZone';
  return '';
}

function availableForTopology(ep: EndpointInfo, mode: TopologyMode, node: NodeInfo): boolean {
  switch (mode) {
    case '':
      return true;
    case 'PreferSameNode':
      return ep.nodeHints?.includes(node.name) ?? false;
    case 'PreferSameZone':
      return ep.zoneHints?.includes(node.zone ?? '') ?? false;
  }
}

/**
 * In compareEndpoints' order, so callers can compare sets by position. Translation sorts a port's
 * endpoints so and the policies above only filter: mostly this is a check, cheaper than a sort,
 * which calls its comparator for every pair.
 */
function toSorted(eps: readonly EndpointInfo[]): Endpoint[] {
  const out = eps.map(toEndpoint);
  return inEndpointOrder(out) ? out : out.sort(compareEndpoints);
}
