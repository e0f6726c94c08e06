/**
 * Builders of Service and EndpointSlice objects shaped as the API serves them (see
 * test/fixtures and ../shared/k8s-api-samples): only the fields a test varies are parameters.
 */
export interface PortSpec {
  name?: string;
  port: number;
  protocol?: 'TCP' | 'UDP' | 'SCTP';
  targetPort?: number;
  nodePort?: number;
}

export interface ServiceSpec {
  namespace?: string;
  name: string;
  clusterIP?: string;
  clusterIPs?: string[];
  type?: string;
  ports: PortSpec[];
  sessionAffinity?: 'None' | 'ClientIP';
  timeoutSeconds?: number;
  externalIPs?: string[];
  internalTrafficPolicy?: 'Cluster' | 'Local';
  externalTrafficPolicy?: 'Cluster' | 'Local';
  labels?: Record<string, string>;
  resourceVersion?: string;
}

export function service(s: ServiceSpec): Record<string, unknown> {
  const clusterIPs = s.clusterIPs ?? [s.clusterIP ?? '10.96.0.10'];
  const spec: Record<string, unknown> = {
    type: s.type ?? (s.ports.some((p) => p.nodePort) ? 'NodePort' : 'ClusterIP'),
    clusterIP: clusterIPs[0],
    clusterIPs,
    ipFamilies: clusterIPs.map((ip) => (ip.includes(':') ? 'IPv6' : 'IPv4')),
    ipFamilyPolicy: clusterIPs.length > 1 ? 'RequireDualStack' : 'SingleStack',
    ports: s.ports.map((p) => ({
      ...(p.name !== undefined ? { name: p.name } : {}),
      protocol: p.protocol ?? 'TCP',
      port: p.port,
      targetPort: p.targetPort ?? p.port,
      ...(p.nodePort ? { nodePort: p.nodePort } : {}),
    })),
    selector: { app: s.name },
    sessionAffinity: s.sessionAffinity ?? 'None',
    internalTrafficPolicy: s.internalTrafficPolicy ?? 'Cluster',
  };
  if (s.sessionAffinity === 'ClientIP') spec.sessionAffinityConfig = { clientIP: { timeoutSeconds: s.timeoutSeconds ?? 10800 } };
  if (s.externalIPs) spec.externalIPs = s.externalIPs;
  if (spec.type === 'NodePort' || spec.type === 'LoadBalancer') spec.externalTrafficPolicy = s.externalTrafficPolicy ?? 'Cluster';
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name: s.name,
      namespace: s.namespace ?? 'default',
      uid: `uid-${s.name}`,
      resourceVersion: s.resourceVersion ?? '1',
      creationTimestamp: '2026-11-22T10:00:00Z',
      ...(s.labels ? { labels: s.labels } : {}),
    },
    spec,
    status: { loadBalancer: {} },
  };
}

export interface EndpointSpec {
  ip: string;
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
  nodeName?: string;
  zone?: string;
  /** The pod behind it (`targetRef`, in the slice's namespace); none for a selector-less Service's. */
  pod?: string;
}

export interface SliceSpec {
  namespace?: string;
  service: string;
  name?: string;
  addressType?: 'IPv4' | 'IPv6';
  ports: Array<{ name?: string; port: number; protocol?: 'TCP' | 'UDP' }>;
  endpoints: EndpointSpec[];
  resourceVersion?: string;
}

export function endpointSlice(s: SliceSpec): Record<string, unknown> {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: s.name ?? `${s.service}-abcde`,
      namespace: s.namespace ?? 'default',
      generateName: `${s.service}-`,
      resourceVersion: s.resourceVersion ?? '1',
      labels: { 'kubernetes.io/service-name': s.service, 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io' },
    },
    addressType: s.addressType ?? 'IPv4',
    ports: s.ports.map((p) => ({ ...(p.name !== undefined ? { name: p.name } : {}), protocol: p.protocol ?? 'TCP', port: p.port })),
    endpoints: s.endpoints.map((e) => ({
      addresses: [e.ip],
      conditions: {
        ready: e.ready ?? true,
        serving: e.serving ?? e.ready ?? true,
        terminating: e.terminating ?? false,
      },
      ...(e.nodeName ? { nodeName: e.nodeName } : {}),
      ...(e.zone ? { zone: e.zone } : {}),
      ...(e.pod ? { targetRef: { kind: 'Pod', namespace: s.namespace ?? 'default', name: e.pod, uid: `uid-${e.pod}` } } : {}),
    })),
  };
}

/** Objects as a `v1 List`, as `kubectl get svc,endpointslices -o json` prints them. */
export function list(items: unknown[]): string {
  return JSON.stringify({ apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items }, null, 2);
}
