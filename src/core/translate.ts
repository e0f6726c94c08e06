import type { V1EndpointSlice, V1Service, V1ServicePort } from '@kubernetes/client-node';
import { PROXY_PROTOCOL_ANNOTATION, serviceAnnotations } from './annotations.js';
import {
  compareEndpoints,
  DEFAULT_AFFINITY_TIMEOUT_SECONDS,
  inEndpointOrder,
  servicePortNameString,
  type AffinityPolicy,
  type EndpointInfo,
  type Protocol,
  type ServicePort,
  type ServicePortName,
  type TrafficPolicy,
} from './model.js';
import { SERVICE_NAME_LABEL } from './validate.js';

/**
 * Service + its EndpointSlices -> the proxy's ServicePorts, following kube-proxy's
 * pkg/proxy/serviceport.go (newBaseServiceInfo) and endpointslicecache.go. Precondition: both
 * passed validate.ts, so field types can be trusted.
 */

/** Services carrying either label belong to another proxy (kube-proxy's list selector excludes them). */
export const SERVICE_PROXY_NAME_LABEL = 'service.kubernetes.io/service-proxy-name';
export const HEADLESS_LABEL = 'service.kubernetes.io/headless';
export const TRIGGER_TIME_ANNOTATION = 'endpoints.kubernetes.io/last-change-trigger-time';

export interface TranslateResult {
  ports: ServicePort[];
  /** Why the whole Service is not proxied, when it is not. */
  skipped?: string;
  /** Things worth one log line that do not stop the rest of the Service (e.g. an SCTP port). */
  notices: string[];
}

export function translateService(svc: V1Service, slices: readonly V1EndpointSlice[]): TranslateResult {
  const skipped = skipReason(svc);
  if (skipped !== undefined) return { ports: [], skipped, notices: [] };

  const namespace = svc.metadata?.namespace || 'default';
  const name = svc.metadata?.name ?? '';
  const own = ownSlices(slices, namespace, name);
  const triggerTime = lastChangeTriggerTime(own);
  const ports: ServicePort[] = [];
  const annotations = serviceAnnotations(svc);
  const notices: string[] = [...annotations.notices];
  for (const p of svc.spec?.ports ?? []) {
    const portName = p.name ?? '';
    const protocol = p.protocol ?? 'TCP';
    if (protocol !== 'TCP' && protocol !== 'UDP') {
      notices.push(`${protocol} port "${portName}" is not supported; skipped`);
      continue;
    }
    const spn: ServicePortName = { namespace, name, port: portName };
    const sp: ServicePort = {
      name: spn,
      key: servicePortNameString(spn),
      protocol,
      port: p.port,
      // Per port, so no two ServicePorts share an array.
      ...serviceLevelFields(svc),
      nodePort: nodePortOf(svc, p),
      endpoints: endpointsFor(own, portName, protocol),
    };
    if (triggerTime !== undefined) sp.lastChangeTriggerTime = triggerTime;
    if (annotations.loadBalancer !== undefined) sp.loadBalancer = annotations.loadBalancer;
    if (annotations.holdWhenEmptyMs !== undefined) sp.holdWhenEmptyMs = annotations.holdWhenEmptyMs;
    // A header in front of a datagram is not something UDP servers expect: TCP ports only.
    if (annotations.proxyProtocol !== undefined && protocol === 'TCP') sp.proxyProtocol = annotations.proxyProtocol;
    ports.push(sp);
  }
  if (annotations.proxyProtocol !== undefined && ports.length > 0 && ports.every((p) => p.protocol !== 'TCP')) {
    notices.push(`${PROXY_PROTOCOL_ANNOTATION}: the Service has no TCP port; a PROXY header goes in front of TCP connections only, so it has no effect here`);
  }
  return { ports, notices };
}

/** kube-proxy's ShouldSkipService, plus the labels its list/watch selector filters out. */
export function skipReason(svc: V1Service): string | undefined {
  const labels = svc.metadata?.labels ?? {};
  if (labels[SERVICE_PROXY_NAME_LABEL] !== undefined) {
    return `labelled ${SERVICE_PROXY_NAME_LABEL}=${labels[SERVICE_PROXY_NAME_LABEL]}: served by another proxy`;
  }
  if (labels[HEADLESS_LABEL] !== undefined) return `labelled ${HEADLESS_LABEL}`;
  if (svc.spec?.type === 'ExternalName') return 'type ExternalName: resolved by DNS, not proxied';
  const clusterIP = svc.spec?.clusterIPs?.[0] ?? svc.spec?.clusterIP ?? '';
  if (clusterIP === 'None') return 'headless (clusterIP None)';
  if (clusterIP === '') return 'no clusterIP';
  return undefined;
}

type ServiceLevel = Pick<
  ServicePort,
  | 'clusterIPs'
  | 'externalIPs'
  | 'loadBalancerIPs'
  | 'loadBalancerSourceRanges'
  | 'affinity'
  | 'internalTrafficPolicy'
  | 'externalTrafficPolicy'
  | 'healthCheckNodePort'
  | 'trafficDistribution'
>;

/** The fields every port of a Service shares. */
function serviceLevelFields(svc: V1Service): ServiceLevel {
  const spec = svc.spec ?? {};
  const externalPolicy: TrafficPolicy =
    externallyAccessible(svc) && spec.externalTrafficPolicy === 'Local' ? 'Local' : 'Cluster';
  const fields: ServiceLevel = {
    clusterIPs: spec.clusterIPs?.length ? [...spec.clusterIPs] : [spec.clusterIP ?? ''],
    externalIPs: [...(spec.externalIPs ?? [])],
    loadBalancerIPs: loadBalancerIPs(svc),
    affinity: affinityOf(svc),
    internalTrafficPolicy: spec.internalTrafficPolicy === 'Local' ? 'Local' : 'Cluster',
    externalTrafficPolicy: externalPolicy,
    // Only a LoadBalancer with Local external policy has a health check port (NeedsHealthCheck).
    healthCheckNodePort: spec.type === 'LoadBalancer' && externalPolicy === 'Local' ? (spec.healthCheckNodePort ?? 0) : 0,
  };
  if (spec.trafficDistribution) fields.trafficDistribution = spec.trafficDistribution;
  // Blanks around a range are forgiven, as kube-proxy trims them (validate.ts checks the rest).
  const ranges = (spec.loadBalancerSourceRanges ?? []).map((r) => r.trim()).filter((r) => r !== '');
  if (ranges.length > 0) fields.loadBalancerSourceRanges = ranges;
  return fields;
}

/**
 * apiservice.ExternallyAccessible: external traffic policy means nothing to a Service that
 * takes no traffic from outside the cluster.
 */
function externallyAccessible(svc: V1Service): boolean {
  const type = svc.spec?.type ?? 'ClusterIP';
  if (type === 'NodePort' || type === 'LoadBalancer') return true;
  return type === 'ClusterIP' && (svc.spec?.externalIPs?.length ?? 0) > 0;
}

/** The API server clears node ports for other types; a hand-written file may not have. */
function nodePortOf(svc: V1Service, p: V1ServicePort): number {
  const type = svc.spec?.type;
  return type === 'NodePort' || type === 'LoadBalancer' ? (p.nodePort ?? 0) : 0;
}

/** Ingress IPs in `ipMode: Proxy` are reached through the load balancer, never this node (IsVIPMode). */
function loadBalancerIPs(svc: V1Service): string[] {
  const ips: string[] = [];
  for (const ing of svc.status?.loadBalancer?.ingress ?? []) {
    if (ing?.ip && ing.ipMode !== 'Proxy') ips.push(ing.ip);
  }
  return ips;
}

function affinityOf(svc: V1Service): AffinityPolicy {
  const timeout = svc.spec?.sessionAffinityConfig?.clientIP?.timeoutSeconds ?? DEFAULT_AFFINITY_TIMEOUT_SECONDS;
  return { type: svc.spec?.sessionAffinity === 'ClientIP' ? 'ClientIP' : 'None', timeoutSeconds: timeout };
}

/** The caller should pass only this Service's slices; checking again costs nothing. FQDN slices are never proxied. */
function ownSlices(slices: readonly V1EndpointSlice[], namespace: string, name: string): V1EndpointSlice[] {
  return slices
    .filter(
      (s) =>
        (s.metadata?.namespace || 'default') === namespace &&
        s.metadata?.labels?.[SERVICE_NAME_LABEL] === name &&
        (s.addressType === 'IPv4' || s.addressType === 'IPv6'),
    )
    .sort((a, b) => compare(a.metadata?.name ?? '', b.metadata?.name ?? ''));
}

/**
 * Endpoints of one service port, merged across slices. A slice port matches by name (absent
 * matches the unnamed port) and protocol. Like kube-proxy, only an endpoint's first address is
 * used. The same ip:port in two slices (e.g. while the controller moves it) counts once,
 * preferring a ready copy.
 */
function endpointsFor(slices: readonly V1EndpointSlice[], portName: string, protocol: Protocol): EndpointInfo[] {
  // Collected in slice order, then ordered by IP and port (ties in slice order) and deduplicated
  // side by side: no table keyed by address, which every port of every Service paid at start-up.
  const infos: EndpointInfo[] = [];
  for (const slice of slices) {
    for (const sp of slice.ports ?? []) {
      if ((sp.name ?? '') !== portName || (sp.protocol ?? 'TCP') !== protocol || sp.port === undefined || sp.port === null) {
        continue;
      }
      for (const ep of slice.endpoints ?? []) {
        const info = endpointInfo(ep, sp.port, slice.metadata?.namespace || 'default');
        if (info === undefined) continue;
        infos.push(info);
      }
    }
  }
  // Array.prototype.sort is stable: copies of one address stay in slice order. Slices often list
  // their endpoints in order already: then the sort, a call of the comparator per pair, is skipped.
  if (!inEndpointOrder(infos)) infos.sort(compareEndpoints);
  const out: EndpointInfo[] = [];
  for (const info of infos) {
    const prev = out[out.length - 1];
    if (prev === undefined || prev.ip !== info.ip || prev.port !== info.port) out.push(info);
    // The first copy stays unless a later one is ready and it is not.
    else if (!prev.ready && info.ready) out[out.length - 1] = info;
  }
  return out;
}

type SliceEndpoint = NonNullable<V1EndpointSlice['endpoints']>[number];

function endpointInfo(ep: SliceEndpoint, port: number, namespace: string): EndpointInfo | undefined {
  const ip = ep.addresses?.[0];
  if (ip === undefined) return undefined;
  const c = ep.conditions ?? {};
  const ready = c.ready ?? true;
  // Absent conditions as kube-proxy reads them (endpointslicecache.go) and the API now documents
  // them: ready and serving true, terminating false. (An older API text had serving defer to ready:
  // a terminating endpoint without `serving` was then no fallback, where kube-proxy uses it.)
  const info: EndpointInfo = { ip, port, ready, serving: c.serving ?? true, terminating: c.terminating ?? false };
  if (ep.nodeName) info.nodeName = ep.nodeName;
  if (ep.zone) info.zone = ep.zone;
  if (ep.hints?.forZones?.length) info.zoneHints = ep.hints.forZones.map((h) => h.name);
  if (ep.hints?.forNodes?.length) info.nodeHints = ep.hints.forNodes.map((h) => h.name);
  const ref = ep.targetRef;
  // A targetRef without a namespace is in the slice's own (the controller always sets it).
  if (ref?.kind === 'Pod' && ref.name) info.targetPod = { namespace: ref.namespace || namespace, name: ref.name };
  return info;
}

/** The newest trigger time over the slices, in ms since epoch; unparsable annotations are ignored. */
function lastChangeTriggerTime(slices: readonly V1EndpointSlice[]): number | undefined {
  let newest: number | undefined;
  for (const s of slices) {
    const text = s.metadata?.annotations?.[TRIGGER_TIME_ANNOTATION];
    const t = typeof text === 'string' ? Date.parse(text) : NaN;
    if (!Number.isNaN(t) && (newest === undefined || t > newest)) newest = t;
  }
  return newest;
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
