import { hostPort } from './address.js';

/**
 * The proxy's own vocabulary, mapped onto upstream kube-proxy names (pkg/proxy/types.go).
 * Everything here is plain data: translation produces it, the proxier consumes it.
 */

export type Protocol = 'TCP' | 'UDP';
export type TrafficPolicy = 'Cluster' | 'Local';
export type AffinityType = 'None' | 'ClientIP';
/** How a balancer picks among usable endpoints (annotation `kube-userspace-proxy.io/load-balancer`). */
export type BalancerAlgorithm = 'round-robin' | 'least-connections';

/** The PROXY protocol versions a TCP connection to the endpoints may begin with. */
export type ProxyProtocolVersion = 'v2';

/** Upstream's ServicePortName: a Service's port, named `namespace/name:portName`. */
export interface ServicePortName {
  namespace: string;
  name: string;
  /** The port's name; empty for a single unnamed port. */
  port: string;
}

/** `namespace/name:port`, as upstream prints a ServicePortName. */
export function servicePortNameString(n: ServicePortName): string {
  return `${n.namespace}/${n.name}:${n.port}`;
}

/** One backend as the EndpointSlices describe it, before any selection. */
export interface EndpointInfo {
  ip: string;
  port: number;
  /** `ready` condition; absent in the slice counts as true. */
  ready: boolean;
  /** `serving` condition; absent counts as the value of `ready`. */
  serving: boolean;
  /** `terminating` condition; absent counts as false. */
  terminating: boolean;
  nodeName?: string;
  zone?: string;
  /** `hints.forZones[].name`, when the slice carries hints. */
  zoneHints?: string[];
  /** `hints.forNodes[].name`, when the slice carries them. */
  nodeHints?: string[];
  /** The Pod behind the endpoint (`targetRef` of kind Pod), when the slice names one. */
  targetPod?: PodRef;
}

/** A Pod by name: what a dialer that reaches pods through the API server (port-forward) needs. */
export interface PodRef {
  namespace: string;
  name: string;
}

/** An endpoint chosen to receive traffic: what a balancer hands out and a dialer dials. */
export interface Endpoint {
  ip: string;
  port: number;
  /** `ip:port`, or `[ip]:port` for IPv6: the endpoint's identity in balancers and logs. */
  addr: string;
  nodeName?: string;
  /** The Pod behind it, when the EndpointSlice names one (`targetRef`). */
  targetPod?: PodRef;
}

/** What endpoints are ordered by: EndpointInfo and Endpoint both have it. */
type IPPort = Pick<Endpoint, 'ip' | 'port'>;

/**
 * The order of a port's endpoints everywhere: by IP as text, then by port. Translation sorts by
 * it and sets of endpoints are compared by position in it. Not by `addr`: a string concatenated
 * per endpoint is copied flat on its first comparison, and building and ordering those strings
 * took 60 ms of a 10,000-Service start's profile (bench/README.md).
 */
export function compareEndpoints(a: IPPort, b: IPPort): number {
  return a.ip < b.ip ? -1 : a.ip > b.ip ? 1 : a.port - b.port;
}

/** Whether the endpoints are in the order of compareEndpoints (copies side by side). */
export function inEndpointOrder(eps: readonly IPPort[]): boolean {
  for (let i = 1; i < eps.length; i++) if (compareEndpoints(eps[i - 1] as IPPort, eps[i] as IPPort) > 0) return false;
  return true;
}

export function toEndpoint(e: Pick<EndpointInfo, 'ip' | 'port' | 'nodeName' | 'targetPod'>): Endpoint {
  const ep: Endpoint = { ip: e.ip, port: e.port, addr: hostPort({ host: e.ip, port: e.port }) };
  if (e.nodeName !== undefined) ep.nodeName = e.nodeName;
  if (e.targetPod !== undefined) ep.targetPod = e.targetPod;
  return ep;
}

export interface AffinityPolicy {
  type: AffinityType;
  /** `sessionAffinityConfig.clientIP.timeoutSeconds`; 10800 when unset. */
  timeoutSeconds: number;
}

export const DEFAULT_AFFINITY_TIMEOUT_SECONDS = 10800;

/** One port of one Service, with everything the proxy needs to serve it. */
export interface ServicePort {
  name: ServicePortName;
  /** servicePortNameString(name): the key everywhere. */
  key: string;
  protocol: Protocol;
  /** The Service's port (`spec.ports[].port`). */
  port: number;
  /** `spec.clusterIPs` (falls back to `[spec.clusterIP]`): IPv4 and IPv6. */
  clusterIPs: string[];
  /** `spec.ports[].nodePort`, 0 when none. */
  nodePort: number;
  externalIPs: string[];
  /** `status.loadBalancer.ingress[].ip`. */
  loadBalancerIPs: string[];
  /**
   * `spec.loadBalancerSourceRanges` (CIDRs): traffic to the load-balancer IPs is served only from
   * these sources. Absent when the Service has none (every source).
   */
  loadBalancerSourceRanges?: string[];
  affinity: AffinityPolicy;
  internalTrafficPolicy: TrafficPolicy;
  externalTrafficPolicy: TrafficPolicy;
  /** `spec.healthCheckNodePort`, 0 when none. */
  healthCheckNodePort: number;
  /** `spec.trafficDistribution`, when set. */
  trafficDistribution?: string;
  /** Every endpoint the slices name for this port, merged across slices and deduplicated. */
  endpoints: EndpointInfo[];
  /** `kube-userspace-proxy.io/load-balancer`, when set to other than round-robin. */
  loadBalancer?: BalancerAlgorithm;
  /** `kube-userspace-proxy.io/hold-when-empty` in ms, when set and above 0. */
  holdWhenEmptyMs?: number;
  /** `kube-userspace-proxy.io/proxy-protocol`, when set (TCP ports only: UDP is relayed as ever). */
  proxyProtocol?: ProxyProtocolVersion;
  /** Trigger time of the newest change (EndpointSlice annotation `endpoints.kubernetes.io/last-change-trigger-time`), ms since epoch. */
  lastChangeTriggerTime?: number;
}

/** What this node is, for traffic policies and topology. */
export interface NodeInfo {
  name: string;
  /** The Node's `topology.kubernetes.io/zone` label. */
  zone?: string;
}

/** Where a Service port is reached: its portals. */
export type PortalKind = 'clusterIP' | 'externalIP' | 'loadBalancer' | 'nodePort';

export interface PortalAddress {
  kind: PortalKind;
  /** The portal IP; for node ports, empty: "every node address the portal allows". */
  ip: string;
  port: number;
  /** A load-balancer portal's `spec.loadBalancerSourceRanges`: served only from these sources. */
  sourceRanges?: string[];
}

/** A problem with one object's field: reported as one line, the object skipped or kept at its last good version. */
export interface ObjectProblem {
  /** e.g. `Service default/web` or `EndpointSlice default/web-abc12`. */
  object: string;
  /** The field path, e.g. `spec.ports[0].port`. */
  field: string;
  message: string;
  /** The file the object came from, when it came from a file. */
  file?: string;
}

export function problemString(p: ObjectProblem): string {
  const where = p.file ? `${p.file}: ` : '';
  return `${where}${p.object}: ${p.field}: ${p.message}`;
}
