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

/** The text of a v1 List around its items, as kubectl prints it (key order and all): what goes before, between and after them. */
function listFrame(formatting: Formatting, empty: boolean): { head: string; between: string; tail: string } {
  if (formatting === 'compact') return { head: '{"apiVersion":"v1","items":[', between: ',', tail: '],"kind":"List","metadata":{"resourceVersion":""}}\n' };
  const tail = '\n    ],\n    "kind": "List",\n    "metadata": {\n        "resourceVersion": ""\n    }\n}\n';
  return empty ? { head: '{\n    "apiVersion": "v1",\n    "items": [', between: '', tail: tail.slice(5) } : { head: '{\n    "apiVersion": "v1",\n    "items": [\n        ', between: ',\n        ', tail };
}

function listText(items: readonly string[], formatting: Formatting): string {
  const f = listFrame(formatting, items.length === 0);
  return `${f.head}${items.join(f.between)}${f.tail}`;
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
 * The k-th of `n` endpoints of scale Service i (not the probe's) after `g` changes: a pod address
 * in 10.x.k.y, never dialed (nothing sends traffic to Services other than the probe's). Each
 * change moves one endpoint, the next in turn, to another address, as a rescheduled pod would be.
 */
function scaleEndpoint(i: number, k: number, n: number, g: number): Endpoint {
  const moves = Math.floor((g + n - 1 - k) / n);
  return { ip: `10.${200 + (moves % 50)}.${k}.${1 + (i % 250)}` };
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
 * Item texts are kept, and the file's bytes are patched where they changed (bytes()).
 */
export class ScaleState {
  readonly services: number;
  private readonly endpoints: number;
  private readonly targetPort: number;
  private readonly formatting: Formatting;
  private readonly items: string[] = [];
  private probe: { ip: string; port: number };
  /**
   * resourceVersion counter, as etcd's revision: every change takes the next one. Seven digits
   * from the start, so that a change keeps an item's length and bytes() can patch it in place.
   */
  private revision = 1_000_000;
  private readonly generation: number[];
  private readonly sliceVersion: string[];
  /** The whole file as last rendered, each item's byte offset in it, and the items changed since. */
  private file: Buffer | undefined;
  private offsets: number[] = [];
  private readonly pending = new Set<number>();

  constructor(o: ScaleStateOptions) {
    this.services = o.services;
    this.endpoints = o.endpoints ?? 1;
    this.targetPort = o.targetPort;
    this.formatting = o.formatting ?? 'compact';
    this.probe = o.probeEndpoint;
    this.generation = new Array<number>(o.services).fill(0);
    this.sliceVersion = new Array<string>(o.services).fill(String(this.revision));
    for (let i = 0; i < o.services; i++) {
      this.items.push(itemText(this.serviceObject(i), this.formatting));
      this.items.push(itemText(this.sliceObject(i), this.formatting));
    }
  }

  private ports(i: number): PortDef[] {
    return [{ name: 'http', protocol: 'TCP', port: SCALE_PORT, targetPort: i === 0 ? this.probe.port : this.targetPort }];
  }

  /** Service i as the API holds it now. */
  serviceObject(i: number): Obj {
    return service('scale', `svc-${i}`, scaleClusterIP(i), this.ports(i), '1');
  }

  /** Service i's slice as the API holds it now. */
  sliceObject(i: number): Obj {
    const eps = i === 0 ? [{ ip: this.probe.ip }] : Array.from({ length: this.endpoints }, (_, k) => scaleEndpoint(i, k, this.endpoints, this.generation[i] as number));
    return endpointSlice('scale', `svc-${i}`, this.ports(i), eps, this.sliceVersion[i] as string);
  }

  private changed(i: number): void {
    this.sliceVersion[i] = String(++this.revision);
    this.items[2 * i + 1] = itemText(this.sliceObject(i), this.formatting);
    this.pending.add(2 * i + 1);
  }

  /** Moves Service 0's endpoint (its target port stays). */
  moveProbe(ip: string): void {
    this.probe = { ip, port: this.probe.port };
    this.changed(0);
  }

  /** Moves one endpoint of each of these Services (never Service 0) to a new address. */
  churn(indices: Iterable<number>): void {
    for (const i of indices) {
      if (i <= 0 || i >= this.services) continue;
      this.generation[i] = (this.generation[i] as number) + 1;
      this.changed(i);
    }
  }

  text(): string {
    return listText(this.items, this.formatting);
  }

  /**
   * The file's bytes, valid until the next change. A change that keeps each item's length (an
   * address for another of the same length, the next resourceVersion) is patched into the last
   * rendering: rewriting a 40 MB file ten times a second must not cost the harness's core a join
   * and an encoding of the whole text each time.
   */
  bytes(): Buffer {
    if (this.file !== undefined) {
      for (const k of this.pending) {
        const at = this.offsets[k] as number;
        const len = (this.offsets[k + 1] ?? NaN) - at - (k + 1 < this.items.length ? this.betweenBytes : 0);
        const text = this.items[k] as string;
        if (Buffer.byteLength(text) !== len) {
          this.file = undefined;
          break;
        }
        this.file.write(text, at);
      }
    }
    this.pending.clear();
    if (this.file === undefined) {
      const f = listFrame(this.formatting, this.items.length === 0);
      this.file = Buffer.from(listText(this.items, this.formatting));
      this.offsets = [];
      let at = Buffer.byteLength(f.head);
      for (const item of this.items) {
        this.offsets.push(at);
        at += Buffer.byteLength(item) + this.betweenBytes;
      }
      // One past the last item, as if another followed: the tail starts a separator's length before it.
      this.offsets.push(at);
    }
    return this.file;
  }

  private get betweenBytes(): number {
    return Buffer.byteLength(listFrame(this.formatting, false).between);
  }
}
