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

interface Endpoint {
  ip: string;
}

function service(namespace: string, name: string, clusterIP: string, ports: PortDef[], resourceVersion: string, annotations?: Record<string, string>): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace, resourceVersion, uid: uid(`svc-${namespace}-${name}`), ...(annotations ? { annotations } : {}) },
    spec: {
      clusterIP,
      clusterIPs: [clusterIP],
      internalTrafficPolicy: 'Cluster',
      ipFamilies: ['IPv4'],
      ipFamilyPolicy: 'SingleStack',
      ports: ports.map((p) => ({ name: p.name, port: p.port, protocol: p.protocol, targetPort: p.targetPort })),
      selector: { app: name },
      sessionAffinity: 'None',
      type: 'ClusterIP',
    },
  };
}

function endpointSlice(namespace: string, serviceName: string, ports: PortDef[], endpoints: readonly Endpoint[], resourceVersion: string): Obj {
  return {
    addressType: 'IPv4',
    apiVersion: 'discovery.k8s.io/v1',
    endpoints: endpoints.map((e) => ({ addresses: [e.ip], conditions: { ready: true } })),
    kind: 'EndpointSlice',
    metadata: {
      labels: { 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io', 'kubernetes.io/service-name': serviceName },
      name: `${serviceName}-abcde`,
      namespace,
      resourceVersion,
      uid: uid(`eps-${namespace}-${serviceName}`),
    },
    ports: ports.map((p) => ({ name: p.name, port: p.targetPort, protocol: p.protocol })),
  };
}

/** A stable UUID-shaped uid per name (FNV-1a, spread over 32 hex digits). */
function uid(name: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  const hex = [h, h ^ 0x5bd1e995, h ^ 0x9e3779b9, h ^ 0x7f4a7c15].map((x) => (x >>> 0).toString(16).padStart(8, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`;
}

/** How the file is written: `pretty` as `kubectl get -o json` prints it (4-space indent), `compact` on one line. */
export type Formatting = 'pretty' | 'compact';
export const FORMATTINGS: readonly Formatting[] = ['pretty', 'compact'];

/** One list item's text, indented to sit in the list's `items` as kubectl prints it. */
function itemText(obj: Obj, formatting: Formatting): string {
  return formatting === 'compact' ? JSON.stringify(obj) : JSON.stringify(obj, null, 4).replace(/\n/g, '\n        ');
}

/** The v1 List around item texts (what kubectl prints, key order and all). */
function listText(items: readonly string[], formatting: Formatting): string {
  if (formatting === 'compact') return `{"apiVersion":"v1","items":[${items.join(',')}],"kind":"List","metadata":{"resourceVersion":""}}\n`;
  const body = items.length === 0 ? '[]' : `[\n        ${items.join(',\n        ')}\n    ]`;
  return `{\n    "apiVersion": "v1",\n    "items": ${body},\n    "kind": "List",\n    "metadata": {\n        "resourceVersion": ""\n    }\n}\n`;
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
  const items = [service('bench', 'bench', PROXY_CLUSTER_IP, ports, '1', byName), endpointSlice('bench', 'bench', ports, [{ ip: BACKEND_HOST }], '1')];
  return listText(items.map((o) => itemText(o, 'compact')), 'compact');
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

/**
 * The k-th endpoint of scale Service i (not the probe's) at generation g: a pod address in
 * 10.{200+k}.c.d, never dialed (nothing sends traffic to Services other than the probe's). A
 * new generation moves it to another address, as a rescheduled pod would be.
 */
function scaleEndpoint(i: number, k: number, g: number): Endpoint {
  const [c, d] = scaleOctets(i);
  return { ip: `10.${200 + ((k + g * 7) % 50)}.${c}.${d}` };
}

export interface ScaleStateOptions {
  /** Services (one TCP port each). */
  services: number;
  /** Endpoints of every Service but the probe's (default 1). */
  endpoints?: number;
  /** Target port of the Services other than the probe's. */
  targetPort: number;
  /** The one endpoint of Service 0, the one the endpoint-move run moves. */
  probeEndpoint: { ip: string; port: number };
  formatting?: Formatting;
}

/**
 * A state file of `services` Services, each with one slice, that can be changed and written again
 * as a user's script would: the whole file, with only the changed objects' text different and
 * their resourceVersions bumped, as `kubectl get -o json` would print them after the change.
 * Item texts are kept, so rewriting the file costs a join, not a JSON.stringify of every object
 * (the churn run rewrites a 10,000-Service file ten times a second from the harness's core).
 */
export class ScaleState {
  readonly services: number;
  private readonly endpoints: number;
  private readonly targetPort: number;
  private readonly formatting: Formatting;
  private readonly items: string[] = [];
  private probe: { ip: string; port: number };
  /** resourceVersion counter, as etcd's revision: every change takes the next one. */
  private revision = 1;
  private readonly generation: number[];

  constructor(o: ScaleStateOptions) {
    this.services = o.services;
    this.endpoints = o.endpoints ?? 1;
    this.targetPort = o.targetPort;
    this.formatting = o.formatting ?? 'compact';
    this.probe = o.probeEndpoint;
    this.generation = new Array<number>(o.services).fill(0);
    for (let i = 0; i < o.services; i++) {
      this.items.push(itemText(service('scale', `svc-${i}`, scaleClusterIP(i), this.ports(i), '1'), this.formatting));
      this.items.push(this.sliceText(i, '1'));
    }
  }

  private ports(i: number): PortDef[] {
    return [{ name: 'http', protocol: 'TCP', port: SCALE_PORT, targetPort: i === 0 ? this.probe.port : this.targetPort }];
  }

  private sliceText(i: number, resourceVersion: string): string {
    const eps = i === 0 ? [{ ip: this.probe.ip }] : Array.from({ length: this.endpoints }, (_, k) => scaleEndpoint(i, k, this.generation[i] as number));
    return itemText(endpointSlice('scale', `svc-${i}`, this.ports(i), eps, resourceVersion), this.formatting);
  }

  /** Moves Service 0's endpoint (its target port stays). */
  moveProbe(ip: string): void {
    this.probe = { ip, port: this.probe.port };
    this.items[1] = this.sliceText(0, String(++this.revision));
  }

  /** Moves one endpoint of each of these Services (never Service 0) to a new address. */
  churn(indices: Iterable<number>): void {
    for (const i of indices) {
      if (i <= 0 || i >= this.services) continue;
      this.generation[i] = (this.generation[i] as number) + 1;
      this.items[2 * i + 1] = this.sliceText(i, String(++this.revision));
    }
  }

  text(): string {
    return listText(this.items, this.formatting);
  }
}

/** `n` Services, one TCP port and one ready endpoint each; Service 0's endpoint is the probe's. */
export function scaleState(o: { ports: number; endpoint: { ip: string; port: number }; probeEndpoint: { ip: string; port: number }; probeVersion: number }): string {
  const state = new ScaleState({ services: o.ports, targetPort: o.endpoint.port, probeEndpoint: o.probeEndpoint });
  for (let v = 1; v < o.probeVersion; v++) state.moveProbe(o.probeEndpoint.ip);
  return state.text();
}
