import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort, tcpEchoServer, tcpRequest, waitFor } from './helpers/net.js';
import { endpointSlice, service, type EndpointSpec, type ServiceSpec } from './helpers/objects.js';
import { clientOutcome, connectTo, withDeadline } from './helpers/proxy-fixtures.js';
import { startHarness, type ClusterState, type Harness, type HarnessOptions, type Kind } from './helpers/watch-harness.js';

/**
 * Today's Service semantics end to end, on real loopback sockets, from both sources: the fake
 * API server (list + watch) and a --state file. One test body per behaviour runs against both,
 * since one translation path serves them; the watch's own troubles (dropped, 410, outage) are
 * API only. Waits are on observable state (the proxier's /services view, the health port, the
 * fake server's requests), each bounded.
 */

type Obj = Record<string, unknown>;
interface Ep extends EndpointSpec {
  name: string;
  hintZone?: string;
  hintNode?: string;
}

// This node is node1 in zone-a. Backends answer `name:` + what they receive.
const A: Ep = { name: 'a', ip: '127.0.31.1', nodeName: 'node1', zone: 'zone-a' };
const B: Ep = { name: 'b', ip: '127.0.31.2', nodeName: 'node2', zone: 'zone-b' };
const C: Ep = { name: 'c', ip: '127.0.31.3', nodeName: 'node3', zone: 'zone-a' };
const NODE = { name: 'node1', zone: 'zone-a' };

// Cluster IPs 10.99.0.x are served on 127.99.0.x by the loopback portal.
const WEB = '127.99.0.10';
const ITP = '127.99.0.11';
const ETP = '127.99.0.12';
const TOPO = '127.99.0.13';

let port: number; // every Service's port
let backendPort: number;
let nodePort: number;
let healthPort: number;
const closers: Array<() => Promise<void>> = [];

const unready = (e: Ep): Ep => ({ ...e, ready: false, serving: false, terminating: false });
const terminating = (e: Ep): Ep => ({ ...e, ready: false, serving: true, terminating: true });
const hinted = (e: Ep, zone: string): Ep => ({ ...e, hintZone: zone });
const nodeHinted = (e: Ep): Ep => ({ ...e, hintZone: e.zone, hintNode: e.nodeName });

function svc(name: string, clusterIP: string, extra: Partial<ServiceSpec> = {}): Obj {
  return service({ name, clusterIP, ports: [{ name: 'http', port }], ...extra });
}

function slice(service: string, eps: Ep[]): Obj {
  const s = endpointSlice({ service, ports: [{ name: 'http', port: backendPort }], endpoints: eps });
  const endpoints = s.endpoints as Obj[];
  eps.forEach((e, i) => {
    const hints: Obj = {};
    if (e.hintZone) hints.forZones = [{ name: e.hintZone }];
    if (e.hintNode) hints.forNodes = [{ name: e.hintNode }];
    if (e.hintZone || e.hintNode) (endpoints[i] as Obj).hints = hints;
  });
  return s;
}

function nodeObject(zone: string): Obj {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name: 'node1', labels: { 'kubernetes.io/hostname': 'node1', 'topology.kubernetes.io/zone': zone } }, spec: {}, status: {} };
}

const addrs = (eps: Ep[]): string[] => eps.map((e) => `${e.ip}:${backendPort}`).sort();

function endpointsOf(h: Harness, unit: string): string[] | undefined {
  return h.proxier.status().find((u) => u.name === unit)?.endpoints.slice().sort();
}

/** Wait until the unit's balancer holds exactly `eps` (undefined: the unit is gone). */
async function settle(h: Harness, unit: string, eps: Ep[] | undefined): Promise<void> {
  const want = eps === undefined ? undefined : addrs(eps).join();
  await waitFor(() => endpointsOf(h, unit)?.join() === want, `${unit} to have endpoints [${want ?? 'no unit'}]; has [${endpointsOf(h, unit)?.join() ?? 'no unit'}]`);
}

/** Backends that answer `n` new connections (round-robin visits each within one cycle). */
async function answering(host: string, p: number, n: number): Promise<string[]> {
  const names = new Set<string>();
  for (let i = 0; i < n; i++) names.add((await tcpRequest(host, p, 'x', 3000)).split(':')[0] as string);
  return [...names].sort();
}

async function refused(host: string, p: number): Promise<boolean> {
  return (await clientOutcome(p, host, undefined, 3000)).code === 'ECONNREFUSED';
}

async function healthCheck(p: number): Promise<{ status: number; body: unknown; weight: string | null }> {
  const res = await fetch(`http://127.0.0.1:${p}/`);
  return { status: res.status, body: JSON.parse(await res.text()) as unknown, weight: res.headers.get('x-load-balancing-endpoint-weight') };
}

function harnessOptions(kind: Kind, initial: ClusterState, extra: Partial<HarnessOptions> = {}): HarnessOptions {
  return { node: NODE, initial, ...(kind === 'api' ? { nodeObject: nodeObject('zone-a') } : {}), ...extra };
}

beforeAll(async () => {
  port = await freePort(WEB);
  nodePort = await freePort('127.0.0.1');
  healthPort = await freePort('127.0.0.1');
  backendPort = await freePort(A.ip);
  for (const e of [A, B, C]) {
    const s = await tcpEchoServer(e.ip, e.name, backendPort);
    closers.push(() => s.close());
  }
});

afterAll(async () => {
  for (const c of closers) await c();
});

describe.each(['api', 'file'] as const)('Service semantics from the %s source', (kind) => {
  let h: Harness;
  const logLines = (): string[] => h.logs.map((l) => l.msg);

  beforeAll(async () => {
    h = await startHarness(kind, harnessOptions(kind, { services: [svc('web', '10.99.0.10')], slices: [slice('web', [A])] }));
  });

  afterAll(async () => {
    await h?.stop();
  });

  it('serves an endpoint added, made unready, made terminating and removed, leaving established connections alone', async () => {
    const state = (eps: Ep[]): ClusterState => ({ services: [svc('web', '10.99.0.10')], slices: [slice('web', eps)] });
    await h.setState(state([A]));
    await settle(h, 'default/web:http', [A]);
    expect(await answering(WEB, port, 3)).toEqual(['a']);
    const held = await connectTo(port, WEB);
    held.socket.write('one');
    await held.got.until('a:one'.length);

    await h.setState(state([A, B]));
    await settle(h, 'default/web:http', [A, B]);
    expect(await answering(WEB, port, 6)).toEqual(['a', 'b']);

    await h.setState(state([A, unready(B)]));
    await settle(h, 'default/web:http', [A]);
    expect(await answering(WEB, port, 4)).toEqual(['a']);

    // Ready endpoints exist: a terminating one takes no new connections, but keeps its old ones.
    await h.setState(state([terminating(A), B]));
    await settle(h, 'default/web:http', [B]);
    expect(await answering(WEB, port, 4)).toEqual(['b']);
    held.socket.write('two');
    await held.got.until('a:onetwo'.length);

    // No ready endpoint left: the serving-and-terminating ones take traffic.
    await h.setState(state([terminating(A), unready(B)]));
    await settle(h, 'default/web:http', [A]);
    expect(await answering(WEB, port, 4)).toEqual(['a']);

    await h.setState(state([]));
    await settle(h, 'default/web:http', []);
    expect((await clientOutcome(port, WEB, 'x', 3000)).code).toBe('ECONNRESET');
    held.socket.write('three');
    await held.got.until('a:onetwothree'.length);
    expect(held.got.bytes().toString()).toBe('a:onetwothree');
    held.socket.destroy();
  });

  it('moves the listener when the Service\'s port changes, and stops serving a deleted Service', async () => {
    const newPort = await freePort(WEB);
    await h.setState({ services: [svc('web', '10.99.0.10')], slices: [slice('web', [A])] });
    await settle(h, 'default/web:http', [A]);
    const held = await connectTo(port, WEB);
    held.socket.write('kept');
    await held.got.until('a:kept'.length);

    await h.setState({ services: [service({ name: 'web', clusterIP: '10.99.0.10', ports: [{ name: 'http', port: newPort }] })], slices: [slice('web', [A])] });
    await waitFor(() => h.proxier.status().find((u) => u.name === 'default/web:http')?.reachable.includes(`${WEB}:${newPort}`), 'the new port');
    expect(await answering(WEB, newPort, 2)).toEqual(['a']);
    expect(await refused(WEB, port)).toBe(true);

    await h.setState({ services: [], slices: [slice('web', [A])] });
    await settle(h, 'default/web:http', undefined);
    expect(await refused(WEB, newPort)).toBe(true);
    held.socket.write('-still');
    await held.got.until('a:kept-still'.length);
    held.socket.destroy();
  });

  it('internalTrafficPolicy Local: cluster IP traffic goes to this node\'s endpoints only, and is reset when it has none', async () => {
    const state = (eps: Ep[]): ClusterState => ({ services: [svc('itp', '10.99.0.11', { internalTrafficPolicy: 'Local' })], slices: [slice('itp', eps)] });
    await h.setState(state([A, B]));
    await settle(h, 'default/itp:http', [A]);
    expect(await answering(ITP, port, 4)).toEqual(['a']);
    await h.setState(state([B, C]));
    await settle(h, 'default/itp:http', []);
    // Never sent elsewhere: the connection is reset.
    expect((await clientOutcome(port, ITP, 'x', 3000)).code).toBe('ECONNRESET');
  });

  it('externalTrafficPolicy Local: node port traffic to local endpoints only, cluster IP to all; the health check node port reports them', async () => {
    const lb = (): Obj => {
      const s = svc('lb', '10.99.0.12', { type: 'LoadBalancer', ports: [{ name: 'http', port, nodePort }], externalIPs: ['192.0.2.10'], externalTrafficPolicy: 'Local' });
      (s.spec as Obj).healthCheckNodePort = healthPort;
      s.status = { loadBalancer: { ingress: [{ ip: '192.0.2.50', ipMode: 'VIP' }] } };
      return s;
    };
    const state = (eps: Ep[]): ClusterState => ({ services: [lb()], slices: [slice('lb', eps)] });
    await h.setState(state([A, B]));
    await settle(h, 'default/lb:http', [A, B]);
    await settle(h, 'default/lb:http (external)', [A]);
    const external = h.proxier.status().find((u) => u.name === 'default/lb:http (external)');
    expect(external?.portals).toEqual([
      { kind: 'externalIP', ip: '192.0.2.10', port },
      { kind: 'loadBalancer', ip: '192.0.2.50', port },
      { kind: 'nodePort', ip: '', port: nodePort },
    ]);
    expect(await answering(ETP, port, 6)).toEqual(['a', 'b']);
    expect(await answering('127.0.0.1', nodePort, 4)).toEqual(['a']);
    await waitFor(async () => (await healthCheck(healthPort).catch(() => undefined))?.status === 200, 'the health check port');
    expect(await healthCheck(healthPort)).toEqual({ status: 200, weight: '1', body: { service: { namespace: 'default', name: 'lb' }, localEndpoints: 1, serviceProxyHealthy: true } });

    // The local endpoint terminates: external traffic still reaches it (no ready local one is
    // left), but the load balancer is told to drain this node.
    await h.setState(state([terminating(A), B]));
    await settle(h, 'default/lb:http (external)', [A]);
    await settle(h, 'default/lb:http', [B]);
    await waitFor(async () => (await healthCheck(healthPort)).status === 503, 'the health check to fail');
    expect((await healthCheck(healthPort)).body).toMatchObject({ localEndpoints: 0 });
    expect(await answering('127.0.0.1', nodePort, 2)).toEqual(['a']);

    await h.setState(state([B]));
    await settle(h, 'default/lb:http (external)', []);
    expect((await clientOutcome(nodePort, '127.0.0.1', 'x', 3000)).code).toBe('ECONNRESET');
    expect(await answering(ETP, port, 2)).toEqual(['b']);

    await h.setState({ services: [], slices: [] });
    await waitFor(() => h.health.serving().length === 0, 'the health check port to close');
  });

  it('topology hints: same-zone endpoints while every ready one carries hints and one matches, else all', async () => {
    const state = (eps: Ep[]): ClusterState => ({ services: [svc('topo', '10.99.0.13', {})].map(withTrafficDistribution), slices: [slice('topo', eps)] });
    await h.setState(state([hinted(A, 'zone-a'), hinted(B, 'zone-b'), hinted(C, 'zone-a')]));
    await settle(h, 'default/topo:http', [A, C]);
    expect(await answering(TOPO, port, 6)).toEqual(['a', 'c']);
    // One ready endpoint without hints: hints are all or nothing.
    await h.setState(state([hinted(A, 'zone-a'), B, hinted(C, 'zone-a')]));
    await settle(h, 'default/topo:http', [A, B, C]);
    // Hints everywhere, none for this zone: no topology.
    await h.setState(state([hinted(A, 'zone-b'), hinted(B, 'zone-b'), hinted(C, 'zone-b')]));
    await settle(h, 'default/topo:http', [A, B, C]);
    // An unready endpoint's missing hint does not count.
    await h.setState(state([hinted(A, 'zone-a'), unready(B), hinted(C, 'zone-b')]));
    await settle(h, 'default/topo:http', [A]);
    // PreferSameNode: the controller adds node hints; one names this node.
    const sameNode = state([nodeHinted(A), nodeHinted(B), nodeHinted(C)]);
    (sameNode.services[0]?.spec as Obj).trafficDistribution = 'PreferSameNode';
    await h.setState(sameNode);
    await settle(h, 'default/topo:http', [A]);
    expect(await answering(TOPO, port, 3)).toEqual(['a']);
  });

  it('follows the session affinity timeout as the Service changes', async () => {
    const state = (timeoutSeconds: number): ClusterState => ({ services: [svc('web', '10.99.0.10', { sessionAffinity: 'ClientIP', timeoutSeconds })], slices: [slice('web', [A, B])] });
    const affinity = (): unknown => h.units.stats().find((u) => u.unit.id === 'default/web:http')?.unit.affinity;
    await h.setState(state(10800));
    await waitFor(() => JSON.stringify(affinity()) === JSON.stringify({ type: 'ClientIP', timeoutSeconds: 10800 }), 'ClientIP affinity');
    const first = await answering(WEB, port, 4);
    expect(first).toHaveLength(1); // sticky
    await h.setState(state(60));
    await waitFor(() => JSON.stringify(affinity()) === JSON.stringify({ type: 'ClientIP', timeoutSeconds: 60 }), 'the new timeout');
  });

  it('skips a malformed object with one line naming it and the field, and serves the rest', async () => {
    const bad = svc('bad', '10.99.0.14', { ports: [{ name: 'http', port: 70000, targetPort: 8080 }] });
    await h.setState({ services: [svc('web', '10.99.0.10'), bad], slices: [slice('web', [A]), slice('bad', [A])] });
    await settle(h, 'default/web:http', [A]);
    await waitFor(() => logLines().some((m) => m.includes('Service default/bad') && m.includes('spec.ports[0].port')), 'the problem to be reported');
    expect(h.proxier.status().some((u) => u.name.startsWith('default/bad'))).toBe(false);
    expect(await answering(WEB, port, 2)).toEqual(['a']);
    // A later change elsewhere does not repeat the line.
    await h.setState({ services: [svc('web', '10.99.0.10'), bad], slices: [slice('web', [A, B]), slice('bad', [A])] });
    await settle(h, 'default/web:http', [A, B]);
    expect(logLines().filter((m) => m.includes('Service default/bad')).length).toBe(1);
  });
});

function withTrafficDistribution(s: Obj): Obj {
  (s.spec as Obj).trafficDistribution = 'PreferClose';
  return s;
}

describe('from the API only: the first lists gate programming', () => {
  it('programs nothing until both lists are in, then everything at once', async () => {
    let release: () => void = () => {};
    const h = await startHarness('api', {
      ...harnessOptions('api', { services: [svc('web', '10.99.0.10')], slices: [slice('web', [A])] }),
      manualSync: true,
      beforeStart: (api) => {
        release = api.hold('endpointslices');
      },
    });
    try {
      const api = h.api!;
      await api.waitForRequest((q) => q.resource === 'services' && q.watch);
      await api.waitForRequest((q) => q.resource === 'endpointslices' && !q.watch);
      // The Services are in the cache, but nothing is programmed.
      expect(h.proxier.cache.serviceKeys()).toEqual(['default/web']);
      expect(h.proxier.status()).toEqual([]);
      expect(await refused(WEB, port)).toBe(true);
      release();
      await withDeadline(h.source.synced, 10_000, 'the first lists');
      await h.proxier.setSynced();
      expect(endpointsOf(h, 'default/web:http')).toEqual(addrs([A]));
      expect(await answering(WEB, port, 2)).toEqual(['a']);
    } finally {
      release();
      await h.stop();
    }
  });
});

describe('from the API only: watch trouble', () => {
  let h: Harness;
  const state = (eps: Ep[], more: Obj[] = []): ClusterState => ({ services: [svc('web', '10.99.0.10'), ...more], slices: [slice('web', eps)] });
  const failed = (resource: string): boolean => h.logs.some((l) => l.level === 40 && l.resource === resource && l.msg.startsWith('watch of'));

  beforeAll(async () => {
    h = await startHarness('api', harnessOptions('api', state([A])));
  });

  afterAll(async () => {
    await h?.stop();
  });

  it('resumes a dropped watch from where it was and applies what changed', async () => {
    const api = h.api!;
    await settle(h, 'default/web:http', [A]);
    await waitFor(() => api.watchCount() === 3, 'the three watches');
    const from = api.requests.length;
    expect(api.dropWatches()).toBe(3);
    await h.setState(state([A, B]));
    await settle(h, 'default/web:http', [A, B]);
    expect(await answering(WEB, port, 6)).toEqual(['a', 'b']);
    const resumed = api.requests.slice(from).filter((q) => q.watch);
    expect(resumed.length).toBeGreaterThanOrEqual(3);
    expect(resumed.every((q) => q.query.resourceVersion !== undefined && q.query.resourceVersion !== '')).toBe(true);
    expect(api.requests.slice(from).some((q) => !q.watch)).toBe(false);
  });

  it('lists again after 410 Gone and applies the deletions it missed', async () => {
    const api = h.api!;
    await h.setState(state([A, B], [svc('doomed', '10.99.0.15')]));
    await settle(h, 'default/doomed:http', []);
    const releaseServices = api.hold('services', { watch: true });
    const releaseSlices = api.hold('endpointslices', { watch: true });
    const from = api.requests.length;
    api.dropWatches();
    await api.waitForRequest((q) => q.resource === 'services' && q.watch, { from });
    await api.waitForRequest((q) => q.resource === 'endpointslices' && q.watch, { from });
    await h.setState(state([B]));
    api.compact();
    releaseServices();
    releaseSlices();
    await settle(h, 'default/doomed:http', undefined);
    await settle(h, 'default/web:http', [B]);
    const expired = api.requests.slice(from).filter((q) => q.expired).map((q) => q.resource);
    expect(expired).toContain('services');
    expect(expired).toContain('endpointslices');
    expect(await refused('127.99.0.15', port)).toBe(true);
    expect(await answering(WEB, port, 3)).toEqual(['b']);
  });

  it('keeps serving the last good state while the API is down, and converges once it is back', async () => {
    const api = h.api!;
    await h.setState(state([A, B]));
    await settle(h, 'default/web:http', [A, B]);
    await api.down();
    await waitFor(() => failed('services') && failed('endpointslices'), 'both watches to fail');
    // Traffic flows through the outage, to the endpoints last known.
    for (let round = 0; round < 3; round++) expect(await answering(WEB, port, 4)).toEqual(['a', 'b']);
    // Meanwhile the cluster moves on.
    await h.setState(state([B], [svc('late', '10.99.0.16')]));
    await api.up();
    await settle(h, 'default/web:http', [B]);
    await settle(h, 'default/late:http', []);
    expect(await answering(WEB, port, 3)).toEqual(['b']);
    expect(h.logs.some((l) => l.msg === 'endpointslices: API reachable again')).toBe(true);
    // A quiet watch (nothing changed on the Node) reports its return too.
    await waitFor(() => h.logs.some((l) => l.msg === 'nodes: API reachable again'), 'the Node watch to come back');
  });

  it('follows this Node\'s zone for topology hints', async () => {
    const api = h.api!;
    const topo = (): ClusterState => ({ services: [withTrafficDistribution(svc('topo', '10.99.0.13'))], slices: [slice('topo', [hinted(A, 'zone-a'), hinted(B, 'zone-b'), hinted(C, 'zone-a')])] });
    await h.setState(topo());
    await settle(h, 'default/topo:http', [A, C]);
    api.apply('nodes', nodeObject('zone-b'));
    await settle(h, 'default/topo:http', [B]);
    expect(await answering(TOPO, port, 3)).toEqual(['b']);
    api.apply('nodes', nodeObject('zone-a'));
    await settle(h, 'default/topo:http', [A, C]);
  });
});
