import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { WebSocketPipe, websocketAccept } from '../../src/io/port-forward/websocket-pipe.js';
import { FakeKubeletSession, type KubeletCounters, type PodTarget } from './fake-kubelet.js';

/**
 * pods/{name}/portforward as a kube-apiserver with its kubelets behind it answers it, on any
 * node:http server (FakeApiServer mounts it), to loopback "pods":
 *
 * - the SPDY/3.1 upgrade (POST, `Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version`), which every API
 *   server answers; a request without a protocol this server speaks gets 403, as
 *   httpstream.Handshake answers it;
 * - the WebSocket tunnel of KEP-4006 (GET, subprotocol `SPDY/3.1+portforward.k8s.io`), which API
 *   servers from 1.30/1.31 answer; `websockets = false` answers it 400 as older ones do (the
 *   kubelet's legacy WebSocket handler wants a `ports` parameter);
 * - 404 (Status NotFound) for a pod that does not exist, 403 for a namespace in `forbidden`;
 * - what kubectl asks before it forwards: discovery (/api, /apis, /api/v1) and GET of the pod.
 *
 * Behind the upgrade, FakeKubeletSession is the kubelet's end of the SPDY connection.
 */
export class FakePortForward {
  readonly pods = new Map<string, PodTarget>();
  /** Namespaces where pods/portforward is forbidden (403), as RBAC would. */
  readonly forbidden = new Set<string>();
  /** Namespaces where only the WebSocket (GET: `get` verb) is forbidden, SPDY (POST: `create`) allowed. */
  readonly forbiddenGet = new Set<string>();
  /** False: answer WebSocket upgrades as an API server before 1.30 does (400). */
  websockets = true;
  readonly counters: KubeletCounters = { pairs: 0, forwards: 0, errors: 0, pings: 0 };
  /** Tunnels opened, by transport. */
  readonly opened = { spdy: 0, websocket: 0 };
  readonly refused: Array<{ transport: 'spdy' | 'websocket'; status: number; pod: string }> = [];
  private readonly sessions = new Map<string, Set<FakeKubeletSession>>();

  /** A pod whose ports map to loopback ports (pod port -> backend port). */
  addPod(namespace: string, name: string, ports: Record<number, number>, host = '127.0.0.1'): PodTarget {
    const target: PodTarget = { host, ports: new Map(Object.entries(ports).map(([k, v]) => [Number(k), v])), failNext: [], deleted: false };
    this.pods.set(`${namespace}/${name}`, target);
    return target;
  }

  /** Delete a pod: its forwards die, new streams on open tunnels fail, new tunnels get 404. */
  deletePod(namespace: string, name: string): void {
    const key = `${namespace}/${name}`;
    const target = this.pods.get(key);
    if (!target) return;
    target.deleted = true;
    this.pods.delete(key);
    for (const s of this.sessions.get(key) ?? []) s.podDeleted();
  }

  /** Cut every tunnel (to one pod, or all). */
  dropTunnels(pod?: string): number {
    let n = 0;
    for (const [key, set] of this.sessions) {
      if (pod !== undefined && key !== pod) continue;
      for (const s of set) {
        s.destroy();
        n++;
      }
    }
    return n;
  }

  /** Tunnels open now (to one pod, or all). */
  tunnelCount(pod?: string): number {
    let n = 0;
    for (const [key, set] of this.sessions) if (pod === undefined || key === pod) for (const s of set) if (!s.closed) n++;
    return n;
  }

  /** Stop reading and answering every open tunnel to `pod`: a peer that went silent. */
  freeze(pod: string): void {
    for (const s of this.sessions.get(pod) ?? []) s.frozen = true;
  }

  /** Pod connections open now through every tunnel. */
  forwardCount(): number {
    let n = 0;
    for (const set of this.sessions.values()) for (const s of set) n += s.forwardCount();
    return n;
  }

  close(): void {
    for (const set of this.sessions.values()) for (const s of set) s.destroy();
  }

  /**
   * Plain requests this serves (discovery, GET pod, a portforward without an upgrade): true when
   * answered. Call after authentication.
   */
  handleRequest(req: IncomingMessage, res: ServerResponse): boolean {
    const url = new URL(req.url ?? '/', 'http://fake');
    if (url.pathname === '/api') return json(res, 200, { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: '127.0.0.1:443' }] });
    if (url.pathname === '/apis') return json(res, 200, { kind: 'APIGroupList', apiVersion: 'v1', groups: [] });
    if (url.pathname === '/api/v1') return json(res, 200, API_V1_RESOURCES);
    if (url.pathname === '/version') return json(res, 200, { major: '1', minor: '32', gitVersion: 'v1.32.0' });
    const m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)(\/portforward)?$/.exec(url.pathname);
    if (!m) return false;
    const [, ns, name, sub] = m as unknown as [string, string, string, string | undefined];
    const target = this.pods.get(`${ns}/${name}`);
    if (!target) return status(res, 404, 'NotFound', `pods "${name}" not found`, { name, kind: 'pods' });
    if (sub) return status(res, 400, 'BadRequest', 'Upgrade request required');
    return json(res, 200, podObject(ns, name, target));
  }

  /** A node:http 'upgrade': true when it was ours (answered either way). */
  handleUpgrade(req: IncomingMessage, socket: Socket, head: Buffer): boolean {
    const url = new URL(req.url ?? '/', 'http://fake');
    const m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)\/portforward$/.exec(url.pathname);
    if (!m) return false;
    const [, ns, name] = m as unknown as [string, string, string];
    const key = `${ns}/${name}`;
    const websocket = String(req.headers.upgrade ?? '').toLowerCase() === 'websocket';
    const transport = websocket ? 'websocket' : 'spdy';
    const refuse = (code: number, reason: string, message: string, details?: object): true => {
      this.refused.push({ transport, status: code, pod: key });
      rawStatus(socket, code, reason, message, details);
      return true;
    };
    if (this.forbidden.has(ns) || (websocket && this.forbiddenGet.has(ns))) {
      const verb = websocket ? 'get' : 'create';
      return refuse(403, 'Forbidden', `pods "${name}" is forbidden: User "developer" cannot ${verb} resource "pods/portforward" in API group "" in the namespace "${ns}"`, { name, kind: 'pods' });
    }
    const target = this.pods.get(key);
    if (!target) return refuse(404, 'NotFound', `pods "${name}" not found`, { name, kind: 'pods' });
    if (websocket) {
      if (!this.websockets || req.method !== 'GET') return refuse(400, 'BadRequest', 'query parameter "port" is required');
      if (!String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim()).includes('SPDY/3.1+portforward.k8s.io')) {
        return refuse(400, 'BadRequest', 'unable to upgrade: no tunneling spdy protocols provided');
      }
      const wsKey = String(req.headers['sec-websocket-key'] ?? '');
      if (req.headers['sec-websocket-version'] !== '13' || wsKey === '') return refuse(400, 'BadRequest', 'websocket: not a websocket handshake');
      // gorilla/websocket's Upgrader, as the API server's tunnelling handler answers.
      socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${websocketAccept(wsKey)}\r\nSec-WebSocket-Protocol: SPDY/3.1+portforward.k8s.io\r\n\r\n`);
      socket.setNoDelay(true);
      this.opened.websocket++;
      this.start(key, target, new WebSocketPipe({ socket, head, role: 'server' }), undefined);
      return true;
    }
    const connection = String(req.headers.connection ?? '').toLowerCase();
    const upgrade = String(req.headers.upgrade ?? '').toLowerCase();
    if (req.method !== 'POST' || !connection.includes('upgrade') || !upgrade.includes('spdy/3.1')) {
      return refuse(400, 'BadRequest', 'unable to upgrade: missing upgrade headers in request');
    }
    const protocols = ([] as string[]).concat(req.headers['x-stream-protocol-version'] ?? []).flatMap((p) => p.split(',')).map((p) => p.trim());
    if (!protocols.includes('portforward.k8s.io')) {
      return refuse(403, 'Forbidden', `unable to upgrade: unable to negotiate protocol: client supports [${protocols.join(' ')}], server accepts [portforward.k8s.io]`);
    }
    socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n');
    socket.setNoDelay(true);
    this.opened.spdy++;
    this.start(key, target, socket, head);
    return true;
  }

  private start(key: string, target: PodTarget, pipe: Duplex, head: Buffer | undefined): void {
    const session = new FakeKubeletSession(pipe, target, key.split('/')[1] as string, this.counters, head);
    let set = this.sessions.get(key);
    if (!set) {
      set = new Set();
      this.sessions.set(key, set);
    }
    set.add(session);
    const forget = (): void => {
      set.delete(session);
    };
    pipe.once('close', forget);
  }
}

const API_V1_RESOURCES = {
  kind: 'APIResourceList',
  groupVersion: 'v1',
  resources: [
    { name: 'pods', singularName: 'pod', namespaced: true, kind: 'Pod', verbs: ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'], shortNames: ['po'] },
    { name: 'pods/portforward', singularName: '', namespaced: true, kind: 'PodPortForwardOptions', verbs: ['create', 'get'] },
    { name: 'services', singularName: 'service', namespaced: true, kind: 'Service', verbs: ['get', 'list', 'watch'], shortNames: ['svc'] },
    { name: 'nodes', singularName: 'node', namespaced: false, kind: 'Node', verbs: ['get', 'list', 'watch'], shortNames: ['no'] },
  ],
};

function podObject(ns: string, name: string, target: PodTarget): object {
  return {
    kind: 'Pod',
    apiVersion: 'v1',
    metadata: { name, namespace: ns, uid: `uid-${ns}-${name}`, resourceVersion: '1' },
    spec: { containers: [{ name: 'app', image: 'app', ports: [...target.ports.keys()].map((p) => ({ containerPort: p, protocol: 'TCP' })) }] },
    status: { phase: 'Running', podIP: target.host },
  };
}

function json(res: ServerResponse, code: number, body: object): true {
  res.writeHead(code, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify(body));
  return true;
}

function statusBody(code: number, reason: string, message: string, details?: object): string {
  return JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, ...(details ? { details } : {}), code });
}

function status(res: ServerResponse, code: number, reason: string, message: string, details?: object): true {
  res.writeHead(code, { 'Content-Type': 'application/json' });
  res.end(statusBody(code, reason, message, details));
  return true;
}

/** An HTTP answer written on an upgrade's raw socket, which then closes. */
function rawStatus(socket: Socket, code: number, reason: string, message: string, details?: object): void {
  const body = statusBody(code, reason, message, details);
  const phrase = code === 400 ? 'Bad Request' : code === 401 ? 'Unauthorized' : code === 403 ? 'Forbidden' : code === 404 ? 'Not Found' : 'Error';
  socket.end(`HTTP/1.1 ${code} ${phrase}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
}
