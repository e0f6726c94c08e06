import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Server as NetServer, Socket } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';
import { FakePortForward } from './fake-port-forward.js';

/**
 * A Kubernetes API server in-process, over HTTP on loopback, speaking the protocol the proxy
 * uses as a real kube-apiserver speaks it (see ../../../shared/k8s-api-samples and
 * test/fixtures/kube, which the fidelity test compares it with):
 *
 * - `GET /api/v1/services`, `/apis/discovery.k8s.io/v1/endpointslices`, `/api/v1/nodes`: a typed
 *   list (`ServiceList`...) whose items carry no kind/apiVersion, `metadata.resourceVersion`,
 *   `labelSelector`/`fieldSelector`, and pages with `limit`/`continue`;
 * - `?watch=1|true`: HTTP 200, chunked, one JSON event per line (`ADDED`/`MODIFIED`/`DELETED`,
 *   objects with kind/apiVersion), replayed from `resourceVersion`; `BOOKMARK`s for watches that
 *   ask with `allowWatchBookmarks`; an object that starts or stops matching a selector arrives
 *   as `ADDED`/`DELETED`; the stream ends after `timeoutSeconds`;
 * - a resourceVersion older than the last compaction: HTTP 200 and one `ERROR` event whose
 *   object is a `Status` with code 410 (watch), or HTTP 410 with a Status body (list continue);
 * - a bearer token is required when `token` is set (401 Status otherwise);
 * - the namespaced collections (`/api/v1/namespaces/{ns}/services`...), and RBAC as a developer
 *   scoped to namespaces has it (`rbac`): 403 Status for a namespace not granted, for the cluster
 *   scope, and for nodes;
 * - pods/{name}/portforward over SPDY and WebSocket to loopback pods (`portForward`, see
 *   fake-port-forward.ts), with the discovery and pod GETs kubectl makes first.
 *
 * One resourceVersion counter spans all resources, as etcd's revision does. Faults are
 * injected on purpose: dropped watch connections, clean watch ends, compaction, failing or held
 * requests, and the whole server going down and coming back on the same port.
 */

export type ResourceName = 'services' | 'endpointslices' | 'nodes';
/** A listening socket to serve on: a net.Server or anything net.Server.listen(handle) takes. */
export type ListenHandle = Server | NetServer | { fd: number };
type Obj = Record<string, unknown>;
type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface ResourceInfo {
  path: string;
  kind: string;
  apiVersion: string;
  listKind: string;
  namespaced: boolean;
}

export const FAKE_RESOURCES: Record<ResourceName, ResourceInfo> = {
  services: { path: '/api/v1/services', kind: 'Service', apiVersion: 'v1', listKind: 'ServiceList', namespaced: true },
  endpointslices: { path: '/apis/discovery.k8s.io/v1/endpointslices', kind: 'EndpointSlice', apiVersion: 'discovery.k8s.io/v1', listKind: 'EndpointSliceList', namespaced: true },
  nodes: { path: '/api/v1/nodes', kind: 'Node', apiVersion: 'v1', listKind: 'NodeList', namespaced: false },
};

export interface RequestRecord {
  /** Index in `requests`. */
  n: number;
  resource: ResourceName | undefined;
  /** The namespace of a namespaced collection's path; undefined for all namespaces. */
  namespace?: string;
  watch: boolean;
  query: Record<string, string>;
  authorization: string | undefined;
  /** The client's port of the connection the request came on. */
  clientPort: number | undefined;
  /** The HTTP status answered (200 for a watch, even one that carries an ERROR event). */
  status?: number;
  /** A watch answered with the 410 ERROR event: its resourceVersion was compacted away. */
  expired?: boolean;
}

interface HistoryEvent {
  rv: number;
  resource: ResourceName;
  type: EventType;
  obj: Obj;
  prev: Obj | undefined;
}

interface WatchConn {
  resource: ResourceName;
  res: ServerResponse;
  socket: Socket;
  matches: (o: Obj) => boolean;
  bookmarks: boolean;
  timer: NodeJS.Timeout | undefined;
}

interface Gate {
  resource: ResourceName;
  watch: boolean;
  opened: Promise<void>;
}

interface Failure {
  resource: ResourceName;
  watch: boolean;
  status: number;
  remaining: number;
}

export class FakeApiServer {
  readonly requests: RequestRecord[] = [];
  /** pods/portforward: the pods, their loopback ports, and the faults to inject. */
  readonly portForward = new FakePortForward();
  /**
   * RBAC of a developer scoped to namespaces, when set: Services and EndpointSlices may be listed
   * and watched only in `namespaces` (403 elsewhere and at the cluster scope), Nodes only if `nodes`.
   */
  rbac: { namespaces: Set<string>; nodes: boolean } | undefined;
  /** Requires `Authorization: Bearer <token>` when set. */
  token: string | undefined = 'fake-token';
  /** Events POSTed to /api/v1/namespaces/{ns}/events, as sent. */
  readonly createdEvents: Obj[] = [];
  /** Answer Event creation 403 Forbidden (no RBAC create on events). */
  forbidEvents = false;
  private server: Server;
  private port = 0;
  private rv = 1000;
  private compactedRV = 0;
  private readonly store: Record<ResourceName, Map<string, Obj>> = { services: new Map(), endpointslices: new Map(), nodes: new Map() };
  private history: HistoryEvent[] = [];
  private readonly watches = new Set<WatchConn>();
  private readonly sockets = new Set<Socket>();
  private readonly events = new EventEmitter();
  private gates: Gate[] = [];
  private failures: Failure[] = [];
  private snapshots = new Map<string, { rv: number; items: Obj[] }>();
  private isUp = false;
  private host = '127.0.0.1';

  private constructor(private readonly listenHandle?: ListenHandle) {
    this.server = this.makeServer();
    this.events.setMaxListeners(100);
  }

  /**
   * Listens on a free port of 127.0.0.1, or on `handle`: a listening socket made elsewhere, e.g.
   * by a process inside a network namespace (sent over IPC), so that this server answers in that
   * namespace. With a handle, down() is final: up() cannot bind it again.
   */
  static async start(opts: { handle?: ListenHandle } = {}): Promise<FakeApiServer> {
    const api = new FakeApiServer(opts.handle);
    await api.up();
    return api;
  }

  get url(): string {
    return `http://${this.host}:${this.port}`;
  }

  /** A KubeConfig pointing at this server with its token (plain HTTP, so TLS checks are off). */
  kubeConfig(): KubeConfig {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'fake', server: this.url, skipTLSVerify: true }],
      users: [{ name: 'fake', ...(this.token ? { token: this.token } : {}) }],
      contexts: [{ name: 'fake', cluster: 'fake', user: 'fake' }],
      currentContext: 'fake',
    });
    return kc;
  }

  /** The same, as a kubeconfig file's text. */
  kubeconfigYaml(): string {
    return [
      'apiVersion: v1',
      'kind: Config',
      'clusters:',
      `- name: fake`,
      `  cluster: {server: "${this.url}", insecure-skip-tls-verify: true}`,
      'users:',
      `- name: fake`,
      `  user: {token: "${this.token ?? ''}"}`,
      'contexts:',
      '- name: fake',
      '  context: {cluster: fake, user: fake}',
      'current-context: fake',
      '',
    ].join('\n');
  }

  // ---- state, changed as the API would change it ----

  /** Create or replace an object; the server sets resourceVersion, uid and creationTimestamp. */
  apply(resource: ResourceName, input: object): Obj {
    const info = FAKE_RESOURCES[resource];
    const { kind: _k, apiVersion: _a, ...rest } = structuredClone(input) as Obj;
    const meta = { ...(rest.metadata as Obj | undefined) };
    if (info.namespaced) meta.namespace = (meta.namespace) || 'default';
    const key = keyOf(resource, meta);
    const prev = this.store[resource].get(key);
    const prevMeta = (prev?.metadata ?? {}) as Obj;
    const rv = ++this.rv;
    const obj: Obj = {
      ...rest,
      metadata: {
        ...meta,
        uid: prevMeta.uid ?? meta.uid ?? randomUUID(),
        resourceVersion: String(rv),
        creationTimestamp: prevMeta.creationTimestamp ?? meta.creationTimestamp ?? new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
      },
    };
    this.store[resource].set(key, obj);
    this.record({ rv, resource, type: prev ? 'MODIFIED' : 'ADDED', obj, prev });
    return obj;
  }

  /** Delete an object (no-op when absent). The DELETED event carries the deletion's resourceVersion. */
  remove(resource: ResourceName, namespace: string, name: string): void {
    const key = keyOf(resource, { namespace: namespace || 'default', name });
    const prev = this.store[resource].get(key);
    if (!prev) return;
    this.store[resource].delete(key);
    const rv = ++this.rv;
    const obj = { ...prev, metadata: { ...(prev.metadata as Obj), resourceVersion: String(rv) } };
    this.record({ rv, resource, type: 'DELETED', obj, prev });
  }

  /** The stored object (a copy), as a GET would return it. */
  get(resource: ResourceName, namespace: string, name: string): Obj | undefined {
    const o = this.store[resource].get(keyOf(resource, { namespace: namespace || 'default', name }));
    return o ? withKind(resource, o) : undefined;
  }

  /** Keys (`namespace/name`, or `name` for nodes) of the stored objects. */
  keys(resource: ResourceName): string[] {
    return [...this.store[resource].keys()];
  }

  currentResourceVersion(): string {
    return String(this.rv);
  }

  /** etcd compaction: every resourceVersion before now expires (watches from them get 410). */
  compact(): void {
    this.compactedRV = this.rv;
    this.history = [];
    this.snapshots.clear();
  }

  // ---- faults ----

  /** Cut open watch connections mid-stream, as a restarting server or a broken network does. */
  dropWatches(resource?: ResourceName): number {
    let n = 0;
    for (const w of [...this.watches]) {
      if (resource && w.resource !== resource) continue;
      this.closeWatch(w);
      w.socket.destroy();
      n++;
    }
    return n;
  }

  /** End open watches cleanly, as the server does at timeoutSeconds (a BOOKMARK first, when asked). */
  endWatches(resource?: ResourceName): number {
    let n = 0;
    for (const w of [...this.watches]) {
      if (resource && w.resource !== resource) continue;
      if (w.bookmarks) this.send(w, 'BOOKMARK', this.bookmarkObject(w.resource));
      this.closeWatch(w);
      w.res.end();
      n++;
    }
    return n;
  }

  /** Send a BOOKMARK with the current resourceVersion to every watch that asked for them. */
  bookmark(resource?: ResourceName): void {
    for (const w of this.watches) {
      if ((!resource || w.resource === resource) && w.bookmarks) this.send(w, 'BOOKMARK', this.bookmarkObject(w.resource));
    }
  }

  /** Write `line` as is to open watches of `resource`: what a broken proxy in between might send. */
  injectRaw(resource: ResourceName, line: string): void {
    for (const w of this.watches) if (w.resource === resource && !w.res.writableEnded) w.res.write(`${line}\n`);
  }

  /** Answer the next `times` list (or watch) requests for `resource` with an error Status. */
  fail(resource: ResourceName, opts: { status: number; times?: number; watch?: boolean }): void {
    this.failures.push({ resource, watch: opts.watch ?? false, status: opts.status, remaining: opts.times ?? 1 });
  }

  /** Hold list (or watch) requests for `resource` until the returned function is called. */
  hold(resource: ResourceName, opts: { watch?: boolean } = {}): () => void {
    let release: () => void = () => {};
    const opened = new Promise<void>((resolve) => {
      release = resolve;
    });
    const gate: Gate = { resource, watch: opts.watch ?? false, opened };
    this.gates.push(gate);
    return () => {
      this.gates = this.gates.filter((g) => g !== gate);
      release();
    };
  }

  /** The server goes away: the port stops listening and every connection is cut. */
  async down(): Promise<void> {
    if (!this.isUp) return;
    this.isUp = false;
    for (const w of [...this.watches]) this.closeWatch(w);
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const s of this.sockets) s.destroy();
    await closed;
  }

  /** The server comes back on the same port, with the same state. */
  async up(): Promise<void> {
    if (this.isUp) return;
    this.server = this.makeServer();
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      const listening = (): void => {
        this.server.off('error', reject);
        resolve();
      };
      if (this.listenHandle) this.server.listen(this.listenHandle, listening);
      else this.server.listen(this.port, '127.0.0.1', listening);
    });
    const addr = this.server.address() as AddressInfo;
    this.port = addr.port;
    this.host = addr.address;
    this.isUp = true;
  }

  async close(): Promise<void> {
    this.portForward.close();
    await this.down();
    this.events.removeAllListeners();
  }

  // ---- observation ----

  /** Open watches, per resource or in all. */
  watchCount(resource?: ResourceName): number {
    return [...this.watches].filter((w) => !resource || w.resource === resource).length;
  }

  /** The client's port of each open watch connection, per resource or in all: what a test blackholes. */
  watchClientPorts(resource?: ResourceName): number[] {
    return [...this.watches].filter((w) => !resource || w.resource === resource).map((w) => w.socket.remotePort ?? 0);
  }

  /** The first request from index `from` on that satisfies `pred` (bounded wait). */
  waitForRequest(pred: (r: RequestRecord) => boolean, opts: { from?: number; timeoutMs?: number; what?: string } = {}): Promise<RequestRecord> {
    const from = opts.from ?? 0;
    const found = this.requests.slice(from).find(pred);
    if (found) return Promise.resolve(found);
    return new Promise((resolve, reject) => {
      const onRequest = (r: RequestRecord): void => {
        if (r.n < from || !pred(r)) return;
        clearTimeout(timer);
        this.events.off('request', onRequest);
        resolve(r);
      };
      const timer = setTimeout(() => {
        this.events.off('request', onRequest);
        reject(new Error(`timed out waiting for a request: ${opts.what ?? 'matching'}`));
      }, opts.timeoutMs ?? 10_000);
      this.events.on('request', onRequest);
    });
  }

  /** Resolves when `resource` has an open watch (that started at or after request `from`). */
  waitForWatch(resource: ResourceName, opts: { from?: number; timeoutMs?: number } = {}): Promise<RequestRecord> {
    return this.waitForRequest((r) => r.resource === resource && r.watch && r.status === 200 && !r.expired, { ...opts, what: `a watch of ${resource}` });
  }

  // ---- the HTTP side ----

  private makeServer(): Server {
    const server = createServer((req, res) => void this.handle(req, res));
    server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
      if (this.token && req.headers.authorization !== `Bearer ${this.token}`) {
        socket.end('HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}');
        return;
      }
      if (!this.portForward.handleUpgrade(req, socket, head)) socket.destroy();
    });
    server.on('connection', (s: Socket) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
    return server;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://fake');
    const { resource, namespace } = resourceOf(url.pathname);
    const query = Object.fromEntries(url.searchParams);
    const watch = query.watch === '1' || query.watch === 'true';
    const rec: RequestRecord = { n: this.requests.length, resource, watch, query, authorization: req.headers.authorization, clientPort: req.socket.remotePort, ...(namespace !== undefined ? { namespace } : {}) };
    this.requests.push(rec);
    // Once on arrival (a held request is visible), once answered (with its status).
    this.events.emit('request', rec);
    const answer = (status: number): void => {
      rec.status = status;
      this.events.emit('request', rec);
    };
    if (this.token && req.headers.authorization !== `Bearer ${this.token}`) {
      sendStatus(res, 401, 'Unauthorized', 'Unauthorized');
      return answer(401);
    }
    const eventsOf = /^\/api\/v1\/namespaces\/([^/]+)\/events$/.exec(url.pathname);
    if (eventsOf && req.method === 'POST') {
      const status = this.forbidEvents ? 403 : await this.createEvent(req, res, eventsOf[1] as string);
      if (status === 403) sendStatus(res, 403, 'Forbidden', 'events is forbidden: cannot create resource "events"');
      return answer(status);
    }
    if (!resource && this.portForward.handleRequest(req, res)) return answer(res.statusCode);
    if (!resource || req.method !== 'GET') {
      sendStatus(res, 404, 'NotFound', 'the server could not find the requested resource');
      return answer(404);
    }
    const denied = this.forbidden(resource, namespace, watch ? 'watch' : 'list');
    if (denied !== undefined) {
      sendStatus(res, 403, 'Forbidden', denied);
      return answer(403);
    }
    // A namespaced path serves that namespace's objects: its own field selector, in effect.
    const served = namespace === undefined ? query : { ...query, fieldSelector: [query.fieldSelector, `metadata.namespace=${namespace}`].filter(Boolean).join(',') };
    for (const gate of this.gates.filter((g) => g.resource === resource && g.watch === watch)) await gate.opened;
    if (!this.isUp || res.destroyed) return;
    const failure = this.failures.find((f) => f.resource === resource && f.watch === watch && f.remaining > 0);
    if (failure) {
      failure.remaining--;
      this.failures = this.failures.filter((f) => f.remaining > 0);
      sendStatus(res, failure.status, reasonOf(failure.status), `injected failure ${failure.status}`);
      return answer(failure.status);
    }
    let status: number;
    try {
      status = watch ? this.serveWatch(resource, served, req, res, rec) : this.serveList(resource, served, res);
    } catch (err) {
      sendStatus(res, 400, 'BadRequest', (err as Error).message);
      status = 400;
    }
    answer(status);
  }

  private async createEvent(req: IncomingMessage, res: ServerResponse, namespace: string): Promise<number> {
    let body = '';
    for await (const chunk of req) body += (chunk as Buffer).toString();
    const event = JSON.parse(body) as Obj;
    this.createdEvents.push(event);
    const meta = (event.metadata ?? {}) as Obj;
    const created = { ...event, metadata: { ...meta, namespace, name: `${String(meta.generateName ?? 'event.')}${this.createdEvents.length}`, resourceVersion: String(++this.rv) } };
    res.writeHead(201, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify(created));
    return 201;
  }

  /** RBAC's answer, as the API server words it, when `rbac` denies the request. */
  private forbidden(resource: ResourceName, namespace: string | undefined, verb: 'list' | 'watch'): string | undefined {
    const rbac = this.rbac;
    if (rbac === undefined) return undefined;
    const info = FAKE_RESOURCES[resource];
    const group = info.apiVersion.includes('/') ? info.apiVersion.split('/')[0] : '';
    const who = `User "developer" cannot ${verb} resource "${resource}" in API group "${group}"`;
    if (resource === 'nodes') return rbac.nodes ? undefined : `${resource} is forbidden: ${who} at the cluster scope`;
    if (namespace === undefined) return `${resource} is forbidden: ${who} at the cluster scope`;
    return rbac.namespaces.has(namespace) ? undefined : `${resource} is forbidden: ${who} in the namespace "${namespace}"`;
  }

  private serveList(resource: ResourceName, query: Record<string, string>, res: ServerResponse): number {
    const info = FAKE_RESOURCES[resource];
    let snapshot: { rv: number; items: Obj[] };
    let offset = 0;
    if (query.continue) {
      const token = decodeContinue(query.continue);
      const found = this.snapshots.get(token.id);
      if (!found || found.rv < this.compactedRV) {
        sendStatus(res, 410, 'Expired', 'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.');
        return 410;
      }
      snapshot = found;
      offset = token.offset;
    } else {
      const matches = selectorMatcher(query);
      const items = [...this.store[resource].entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, o]) => o).filter(matches);
      snapshot = { rv: this.rv, items };
    }
    const limit = query.limit ? Number(query.limit) : 0;
    const end = limit > 0 ? Math.min(snapshot.items.length, offset + limit) : snapshot.items.length;
    const metadata: Obj = { resourceVersion: String(snapshot.rv) };
    if (end < snapshot.items.length) {
      const id = query.continue ? decodeContinue(query.continue).id : randomUUID();
      this.snapshots.set(id, snapshot);
      metadata.continue = encodeContinue({ id, offset: end });
      metadata.remainingItemCount = snapshot.items.length - end;
    }
    // List items carry no kind or apiVersion: the list's kind says it.
    const body = { kind: info.listKind, apiVersion: info.apiVersion, metadata, items: snapshot.items.slice(offset, end) };
    const text = JSON.stringify(body);
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(text);
    return 200;
  }

  private serveWatch(resource: ResourceName, query: Record<string, string>, req: IncomingMessage, res: ServerResponse, rec: RequestRecord): number {
    const from = query.resourceVersion ?? '';
    if (from !== '' && !/^\d+$/.test(from)) throw new Error(`invalid resourceVersion "${from}"`);
    res.writeHead(200, { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' });
    res.flushHeaders();
    const w: WatchConn = { resource, res, socket: req.socket, matches: selectorMatcher(query), bookmarks: query.allowWatchBookmarks === 'true', timer: undefined };
    if (from !== '' && from !== '0' && Number(from) < this.compactedRV) {
      rec.expired = true;
      res.end(`${JSON.stringify({ type: 'ERROR', object: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'The resourceVersion for the provided watch is too old.', reason: 'Expired', code: 410 } })}\n`);
      return 200;
    }
    this.watches.add(w);
    res.on('close', () => this.closeWatch(w));
    if (from === '' || from === '0') {
      // "Start at most recent": the current state as ADDED events, then changes.
      for (const o of this.store[resource].values()) if (w.matches(o)) this.send(w, 'ADDED', o);
    } else {
      for (const ev of this.history) if (ev.resource === resource && ev.rv > Number(from)) this.deliver(w, ev);
    }
    const seconds = Number(query.timeoutSeconds ?? '0');
    if (seconds > 0) {
      w.timer = setTimeout(() => {
        if (w.bookmarks) this.send(w, 'BOOKMARK', this.bookmarkObject(resource));
        this.closeWatch(w);
        res.end();
      }, seconds * 1000);
      w.timer.unref();
    }
    return 200;
  }

  private record(ev: HistoryEvent): void {
    this.history.push(ev);
    for (const w of this.watches) if (w.resource === ev.resource) this.deliver(w, ev);
  }

  /** Selector transitions: starts matching -> ADDED, stops -> DELETED, neither -> nothing. */
  private deliver(w: WatchConn, ev: HistoryEvent): void {
    const now = w.matches(ev.obj);
    const before = ev.prev !== undefined && w.matches(ev.prev);
    if (ev.type === 'DELETED') {
      if (before) this.send(w, 'DELETED', ev.obj);
    } else if (now && before) this.send(w, 'MODIFIED', ev.obj);
    else if (now) this.send(w, 'ADDED', ev.obj);
    else if (before) this.send(w, 'DELETED', ev.obj);
  }

  private send(w: WatchConn, type: string, obj: Obj): void {
    if (w.res.writableEnded || w.res.destroyed) return;
    const object = type === 'BOOKMARK' ? obj : withKind(w.resource, obj);
    w.res.write(`${JSON.stringify({ type, object })}\n`);
  }

  private bookmarkObject(resource: ResourceName): Obj {
    const info = FAKE_RESOURCES[resource];
    return { kind: info.kind, apiVersion: info.apiVersion, metadata: { resourceVersion: String(this.rv) } };
  }

  private closeWatch(w: WatchConn): void {
    if (w.timer) clearTimeout(w.timer);
    this.watches.delete(w);
  }
}

function keyOf(resource: ResourceName, meta: Obj): string {
  const name = String(meta.name ?? '');
  return FAKE_RESOURCES[resource].namespaced ? `${String(meta.namespace ?? 'default')}/${name}` : name;
}

/** Watch events and GETs carry kind and apiVersion first, as the server writes them. */
function withKind(resource: ResourceName, o: Obj): Obj {
  const info = FAKE_RESOURCES[resource];
  return { kind: info.kind, apiVersion: info.apiVersion, ...structuredClone(o) };
}

function sendStatus(res: ServerResponse, code: number, reason: string, message: string): void {
  const body = JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code });
  res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

function reasonOf(status: number): string {
  const reasons: Record<number, string> = { 403: 'Forbidden', 410: 'Expired', 429: 'TooManyRequests', 500: 'InternalError', 503: 'ServiceUnavailable', 504: 'Timeout' };
  return reasons[status] ?? 'Unknown';
}

function encodeContinue(t: { id: string; offset: number }): string {
  return Buffer.from(JSON.stringify(t)).toString('base64url');
}

function decodeContinue(text: string): { id: string; offset: number } {
  try {
    return JSON.parse(Buffer.from(text, 'base64url').toString()) as { id: string; offset: number };
  } catch {
    throw new Error('invalid continue token');
  }
}

/** The resource a collection path names, and its namespace when the path is namespaced. */
function resourceOf(path: string): { resource: ResourceName | undefined; namespace: string | undefined } {
  for (const r of Object.keys(FAKE_RESOURCES) as ResourceName[]) {
    const info = FAKE_RESOURCES[r];
    if (info.path === path) return { resource: r, namespace: undefined };
    if (!info.namespaced) continue;
    const base = info.path.slice(0, info.path.lastIndexOf('/'));
    const m = path.startsWith(`${base}/namespaces/`) ? /^([^/]+)\/([^/]+)$/.exec(path.slice(`${base}/namespaces/`.length)) : null;
    if (m && m[2] === r) return { resource: r, namespace: decodeURIComponent(m[1] as string) };
  }
  return { resource: undefined, namespace: undefined };
}

/** labelSelector (`k`, `!k`, `k=v`, `k==v`, `k!=v`) and fieldSelector (metadata.name / metadata.namespace). */
function selectorMatcher(query: Record<string, string>): (o: Obj) => boolean {
  const label = parseSelector(query.labelSelector ?? '');
  const field = parseSelector(query.fieldSelector ?? '');
  return (o) => {
    const meta = (o.metadata ?? {}) as Obj;
    const labels = (meta.labels ?? {}) as Record<string, string>;
    const fields: Record<string, string> = { 'metadata.name': String(meta.name ?? ''), 'metadata.namespace': String(meta.namespace ?? '') };
    return label.every((r) => r(labels)) && field.every((r) => r(fields));
  };
}

function parseSelector(text: string): Array<(values: Record<string, string>) => boolean> {
  return text
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((req) => {
      let m: RegExpMatchArray | null;
      if ((m = req.match(/^!([^=!]+)$/))) {
        const k = m[1] as string;
        return (v) => v[k] === undefined;
      }
      if ((m = req.match(/^([^=!]+)!=(.*)$/))) {
        const [, k, val] = m as [string, string, string];
        return (v) => v[k] !== val;
      }
      if ((m = req.match(/^([^=!]+)==?(.*)$/))) {
        const [, k, val] = m as [string, string, string];
        return (v) => v[k] === val;
      }
      if ((m = req.match(/^([^=!]+)$/))) {
        const k = m[1] as string;
        return (v) => v[k] !== undefined;
      }
      throw new Error(`unable to parse requirement: "${req}"`);
    });
}
