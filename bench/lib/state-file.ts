import { BACKEND_HOST, PROXY_CLUSTER_IP, SCALE_CLUSTER_PREFIX, SCALE_PORT, SERVICES, type BenchService } from './plan.js';

/**
 * State files for the proxy's `--state`, shaped as `kubectl get svc,endpointslices -A -o json`
 * prints them (a `v1 List`). Pure: objects in, text out.
 */

type Obj = Record<string, unknown>;

interface PortDef {
  name: string;
  protocol: 'TCP' | 'UDP';
  port: number;
  targetPort: number;
}

function service(namespace: string, name: string, clusterIP: string, ports: PortDef[], resourceVersion: string, annotations?: Record<string, string>): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace, uid: `uid-${namespace}-${name}`, resourceVersion, ...(annotations ? { annotations } : {}) },
    spec: {
      type: 'ClusterIP',
      clusterIP,
      clusterIPs: [clusterIP],
      ipFamilies: ['IPv4'],
      ipFamilyPolicy: 'SingleStack',
      selector: { app: name },
      ports: ports.map((p) => ({ name: p.name, protocol: p.protocol, port: p.port, targetPort: p.targetPort })),
      sessionAffinity: 'None',
      internalTrafficPolicy: 'Cluster',
    },
  };
}

function endpointSlice(namespace: string, serviceName: string, ports: PortDef[], ip: string, resourceVersion: string): Obj {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: `${serviceName}-abcde`,
      namespace,
      resourceVersion,
      labels: { 'kubernetes.io/service-name': serviceName, 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io' },
    },
    addressType: 'IPv4',
    ports: ports.map((p) => ({ name: p.name, protocol: p.protocol, port: p.targetPort })),
    endpoints: [{ addresses: [ip], conditions: { ready: true, serving: true, terminating: false }, nodeName: 'bench-node' }],
  };
}

function list(items: Obj[]): string {
  return `${JSON.stringify({ apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items })}\n`;
}

/** The benchmark Service: one port per backend service, all to the one backend; `annotations` as NAME=VALUE. */
export function benchState(annotations: readonly string[] = []): string {
  const ports: PortDef[] = (Object.keys(SERVICES) as BenchService[]).map((name) => ({
    name,
    protocol: SERVICES[name].protocol,
    port: SERVICES[name].port,
    targetPort: SERVICES[name].port,
  }));
  const byName = annotations.length === 0 ? undefined : Object.fromEntries(annotations.map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]));
  return list([service('bench', 'bench', PROXY_CLUSTER_IP, ports, '1', byName), endpointSlice('bench', 'bench', ports, BACKEND_HOST, '1')]);
}

/** The c.d of the i-th scale Service (0-based): 10.78.c.d with c and d in 1..254 (no .0, no .255). */
export function scaleOctets(i: number): [number, number] {
  if (i < 0 || i >= 254 * 254) throw new RangeError(`scale Service index ${i} out of range`);
  return [1 + Math.floor(i / 254), 1 + (i % 254)];
}

export function scaleClusterIP(i: number): string {
  const [c, d] = scaleOctets(i);
  return `${SCALE_CLUSTER_PREFIX}.${c}.${d}`;
}

export interface ScaleStateOptions {
  /** Service ports (one Service with one TCP port each). */
  ports: number;
  /** Endpoint of every Service but the probe's. */
  endpoint: { ip: string; port: number };
  /** Endpoint of Service 0, the one the endpoint-move run moves. */
  probeEndpoint: { ip: string; port: number };
  /** resourceVersion of Service 0's slice: a move bumps it, as the API would. */
  probeVersion: number;
}

/** `ports` Services, one TCP port each, one ready endpoint each. */
export function scaleState(o: ScaleStateOptions): string {
  const items: Obj[] = [];
  for (let i = 0; i < o.ports; i++) {
    const name = `svc-${i}`;
    const ep = i === 0 ? o.probeEndpoint : o.endpoint;
    const ports: PortDef[] = [{ name: 'http', protocol: 'TCP', port: SCALE_PORT, targetPort: ep.port }];
    items.push(service('scale', name, scaleClusterIP(i), ports, '1'));
    items.push(endpointSlice('scale', name, ports, ep.ip, i === 0 ? String(o.probeVersion) : '1'));
  }
  return list(items);
}
