import type { V1EndpointSlice, V1Node, V1Service } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import type { NodeInfo } from '../src/core/model.js';
import type { StateSink } from '../src/seams/state-sink.js';
import { HttpKubeApi } from '../src/io/kube/api-client.js';
import { PROXY_LABEL_SELECTOR } from '../src/io/kube/api-resources.js';
import { ApiSource, type ApiSourceOptions } from '../src/io/kube/api-source.js';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { waitFor } from './helpers/net.js';
import { endpointSlice, service } from './helpers/objects.js';
import { captureLogger, withDeadline, type LogRecord } from './helpers/proxy-fixtures.js';

/**
 * The API source against the fake API server, into a sink that records what it is told: the
 * protocol side (list, watch, resume, 410, outages) without sockets to proxy.
 */

/** Keeps what a source says, like the state cache minus validation. */
class RecordingSink implements StateSink {
  readonly services = new Map<string, V1Service>();
  readonly slices = new Map<string, V1EndpointSlice>();
  readonly calls: string[] = [];
  readonly nodes: NodeInfo[] = [];

  upsertService(o: V1Service): void {
    this.services.set(key(o), o);
    this.calls.push(`upsertService ${key(o)}`);
  }
  deleteService(ns: string, name: string): void {
    this.services.delete(`${ns}/${name}`);
    this.calls.push(`deleteService ${ns}/${name}`);
  }
  upsertEndpointSlice(o: V1EndpointSlice): void {
    this.slices.set(key(o), o);
    this.calls.push(`upsertEndpointSlice ${key(o)}`);
  }
  deleteEndpointSlice(ns: string, name: string): void {
    this.slices.delete(`${ns}/${name}`);
    this.calls.push(`deleteEndpointSlice ${ns}/${name}`);
  }
  replaceServices(objs: readonly V1Service[]): void {
    this.services.clear();
    for (const o of objs) this.services.set(key(o), o);
    this.calls.push(`replaceServices ${objs.length}`);
  }
  replaceEndpointSlices(objs: readonly V1EndpointSlice[]): void {
    this.slices.clear();
    for (const o of objs) this.slices.set(key(o), o);
    this.calls.push(`replaceEndpointSlices ${objs.length}`);
  }
  setNode(node: NodeInfo): void {
    this.nodes.push({ ...node });
  }
  serviceNames(): string[] {
    return [...this.services.keys()].sort();
  }
  rvOf(k: string): string | undefined {
    return this.services.get(k)?.metadata?.resourceVersion;
  }
}

function key(o: { metadata?: { namespace?: string; name?: string } }): string {
  return `${o.metadata?.namespace ?? 'default'}/${o.metadata?.name ?? ''}`;
}

const svc = (name: string, extra: Partial<Parameters<typeof service>[0]> = {}): Record<string, unknown> =>
  service({ name, clusterIP: '10.96.1.1', ports: [{ name: 'http', port: 80 }], ...extra });
const slice = (name: string, ips: string[]): Record<string, unknown> =>
  endpointSlice({ service: name, ports: [{ name: 'http', port: 8080 }], endpoints: ips.map((ip) => ({ ip })) });

interface Rig {
  api: FakeApiServer;
  source: ApiSource;
  sink: RecordingSink;
  logs: LogRecord[];
  nodes: Array<V1Node | undefined>;
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function rig(opts: { seed?: (api: FakeApiServer) => void; source?: Partial<ApiSourceOptions>; start?: boolean } = {}): Promise<Rig> {
  const api = await FakeApiServer.start();
  cleanups.push(() => api.close());
  opts.seed?.(api);
  const { logger, records } = captureLogger('debug');
  const nodes: Array<V1Node | undefined> = [];
  const source = new ApiSource({
    api: new HttpKubeApi(api.kubeConfig(), { requestTimeoutMs: 5000 }),
    nodeName: 'node1',
    logger,
    onNode: (n) => nodes.push(n),
    backoff: { initialMs: 20, maxMs: 200 },
    ...opts.source,
  });
  cleanups.push(() => source.stop());
  const sink = new RecordingSink();
  if (opts.start !== false) await source.start(sink);
  return { api, source, sink, logs: records, nodes };
}

const synced = (r: Rig): Promise<void> => withDeadline(r.source.synced, 10_000, 'the first lists');

describe('the API source', () => {
  it('lists with kube-proxy\'s label selector, then watches from the list\'s resourceVersion with bookmarks', async () => {
    const r = await rig({
      seed: (api) => {
        api.apply('services', svc('web'));
        api.apply('services', svc('other-proxy', { labels: { 'service.kubernetes.io/service-proxy-name': 'cilium' } }));
        api.apply('services', svc('headless-label', { labels: { 'service.kubernetes.io/headless': '' } }));
        api.apply('endpointslices', slice('web', ['10.0.0.1']));
      },
    });
    await synced(r);
    expect(r.sink.serviceNames()).toEqual(['default/web']);
    const list = r.api.requests.find((q) => q.resource === 'services' && !q.watch);
    expect(list?.query).toMatchObject({ labelSelector: PROXY_LABEL_SELECTOR, limit: '500' });
    expect(list?.authorization).toBe('Bearer fake-token');
    const watch = await r.api.waitForWatch('services');
    expect(watch.query).toMatchObject({ watch: 'true', labelSelector: PROXY_LABEL_SELECTOR, allowWatchBookmarks: 'true', resourceVersion: r.api.currentResourceVersion() });
    expect(Number(watch.query.timeoutSeconds)).toBeGreaterThanOrEqual(300);
    const sliceList = r.api.requests.find((q) => q.resource === 'endpointslices' && !q.watch);
    expect(sliceList?.query.labelSelector).toBe(PROXY_LABEL_SELECTOR);
    const nodeList = await r.api.waitForRequest((q) => q.resource === 'nodes' && !q.watch);
    expect(nodeList.query.fieldSelector).toBe('metadata.name=node1');
  });

  it('resolves synced only once both Services and EndpointSlices are listed', async () => {
    const r = await rig({ start: false, seed: (api) => api.apply('services', svc('web')) });
    const release = r.api.hold('endpointslices');
    let done = false;
    void r.source.synced.then(() => (done = true));
    await r.source.start(r.sink);
    await waitFor(() => r.sink.calls.includes('replaceServices 1'), 'the Services list');
    await r.api.waitForRequest((q) => q.resource === 'services' && q.watch);
    expect(done).toBe(false);
    release();
    await synced(r);
    expect(r.sink.calls).toContain('replaceEndpointSlices 0');
  });

  it('applies ADDED, MODIFIED and DELETED in order, and resumes from a BOOKMARK\'s resourceVersion', async () => {
    const r = await rig({ seed: (api) => api.apply('services', svc('web')) });
    await synced(r);
    await r.api.waitForWatch('services');
    r.api.apply('services', svc('late'));
    r.api.apply('services', svc('web', { ports: [{ name: 'http', port: 81 }] }));
    r.api.remove('services', 'default', 'late');
    await waitFor(() => r.sink.calls.includes('deleteService default/late'), 'the deletion');
    expect(r.sink.calls.slice(-3)).toEqual(['upsertService default/late', 'upsertService default/web', 'deleteService default/late']);
    expect(r.sink.services.get('default/web')?.spec?.ports?.[0]?.port).toBe(81);
    // Other resources move the resourceVersion on; a bookmark tells this watch where it is.
    r.api.apply('endpointslices', slice('web', ['10.0.0.9']));
    r.api.bookmark('services');
    const bookmarked = r.api.currentResourceVersion();
    await waitFor(() => r.source.stats().services?.resourceVersion === bookmarked, 'the bookmark');
    const from = r.api.requests.length;
    r.api.dropWatches('services');
    const resumed = await r.api.waitForWatch('services', { from });
    expect(resumed.query.resourceVersion).toBe(bookmarked);
  });

  it('resumes a dropped watch from the last resourceVersion without listing again, and gets what happened meanwhile', async () => {
    const r = await rig({ seed: (api) => api.apply('services', svc('web')) });
    await synced(r);
    await r.api.waitForWatch('services');
    const lastSeen = r.sink.rvOf('default/web');
    const release = r.api.hold('services', { watch: true });
    const from = r.api.requests.length;
    expect(r.api.dropWatches('services')).toBe(1);
    await r.api.waitForRequest((q) => q.resource === 'services' && q.watch, { from, what: 'the resumed watch, held' });
    r.api.apply('services', svc('while-away'));
    release();
    await waitFor(() => r.sink.services.has('default/while-away'), 'the change made while the watch was down');
    const resumed = r.api.requests.slice(from).find((q) => q.resource === 'services' && q.watch);
    expect(resumed?.query.resourceVersion).toBe(lastSeen);
    expect(r.source.stats().services?.lists).toBe(1);
    expect(r.api.requests.slice(from).some((q) => q.resource === 'services' && !q.watch)).toBe(false);
  });

  it('watches again when the server ends a watch at its timeout', async () => {
    const r = await rig({ seed: (api) => api.apply('services', svc('web')) });
    await synced(r);
    await r.api.waitForWatch('services');
    const from = r.api.requests.length;
    r.api.endWatches('services');
    await r.api.waitForWatch('services', { from });
    r.api.apply('services', svc('after-timeout'));
    await waitFor(() => r.sink.services.has('default/after-timeout'), 'the change on the new watch');
    expect(r.source.stats().services).toMatchObject({ lists: 1, failures: 0 });
  });

  it('lists again on 410 Gone, replacing the state so that deletions missed meanwhile apply', async () => {
    const r = await rig({
      seed: (api) => {
        api.apply('services', svc('web'));
        api.apply('services', svc('doomed'));
      },
    });
    await synced(r);
    await r.api.waitForWatch('services');
    const release = r.api.hold('services', { watch: true });
    const from = r.api.requests.length;
    r.api.dropWatches('services');
    await r.api.waitForRequest((q) => q.resource === 'services' && q.watch, { from });
    r.api.remove('services', 'default', 'doomed');
    r.api.apply('services', svc('newcomer'));
    r.api.compact();
    release();
    await waitFor(() => r.sink.serviceNames().join() === 'default/newcomer,default/web', 'the re-list');
    expect(r.api.requests.slice(from).some((q) => q.expired)).toBe(true);
    expect(r.source.stats().services).toMatchObject({ lists: 2, expired: 1 });
    expect(r.sink.calls).not.toContain('deleteService default/doomed'); // it went by the replace
    expect(r.logs.some((l) => l.msg.includes('expired (410 Gone); listing again'))).toBe(true);
    await r.api.waitForWatch('services', { from: r.api.requests.length - 1 });
  });

  it('keeps what it has through an outage and converges when the API is back, without a restart', async () => {
    const r = await rig({
      seed: (api) => {
        api.apply('services', svc('web'));
        api.apply('services', svc('gone-while-down'));
        api.apply('endpointslices', slice('web', ['10.0.0.1']));
      },
    });
    await synced(r);
    await r.api.waitForWatch('services');
    await r.api.down();
    await waitFor(() => r.logs.some((l) => l.level === 40 && l.msg.startsWith('watch of services failed')), 'the failure to be reported');
    expect(r.sink.serviceNames()).toEqual(['default/gone-while-down', 'default/web']);
    r.api.remove('services', 'default', 'gone-while-down');
    r.api.apply('endpointslices', slice('web', ['10.0.0.1', '10.0.0.2']));
    await r.api.up();
    await waitFor(() => !r.sink.services.has('default/gone-while-down'), 'the deletion made during the outage');
    await waitFor(() => r.sink.slices.get('default/web-abcde')?.endpoints?.length === 2, 'the slice changed during the outage');
    expect(r.logs.some((l) => l.msg === 'services: API reachable again')).toBe(true);
    // One loud line per outage and resource; the repeats are quiet.
    expect(r.logs.filter((l) => l.level === 40 && l.resource === 'services').length).toBe(1);
  });

  it('converges by re-listing when the outage outlived the server\'s history', async () => {
    const r = await rig({ seed: (api) => api.apply('services', svc('web')) });
    await synced(r);
    await r.api.waitForWatch('services');
    await r.api.down();
    await waitFor(() => r.logs.some((l) => l.msg.startsWith('watch of services failed')), 'the failure to be reported');
    r.api.remove('services', 'default', 'web');
    r.api.apply('services', svc('fresh'));
    r.api.compact();
    await r.api.up();
    await waitFor(() => r.sink.serviceNames().join() === 'default/fresh', 'the re-listed state');
    expect(r.source.stats().services?.expired).toBeGreaterThanOrEqual(1);
  });

  it('retries error statuses with backoff and reports the failure once', async () => {
    const r = await rig({
      start: false,
      seed: (api) => {
        api.apply('services', svc('web'));
        api.fail('services', { status: 503, times: 3 });
      },
    });
    await r.source.start(r.sink);
    await synced(r);
    expect(r.sink.serviceNames()).toEqual(['default/web']);
    const failures = r.logs.filter((l) => l.resource === 'services' && l.msg.startsWith('list of services failed'));
    expect(failures.map((l) => l.level)).toEqual([40, 20, 20]);
    expect(failures[0]?.err).toMatchObject({ status: 503, failure: 'Status' });
    expect(r.source.stats().services?.failures).toBe(3);
  });

  it('pages large lists and hands them over whole', async () => {
    const r = await rig({
      source: { pageSize: 2 },
      seed: (api) => {
        for (let i = 0; i < 5; i++) api.apply('services', svc(`s${i}`));
      },
    });
    await synced(r);
    expect(r.sink.serviceNames()).toHaveLength(5);
    const lists = r.api.requests.filter((q) => q.resource === 'services' && !q.watch);
    expect(lists.map((q) => q.query.continue !== undefined)).toEqual([false, true, true]);
    expect(r.sink.calls.filter((c) => c.startsWith('replaceServices'))).toEqual(['replaceServices 5']);
  });

  it('takes a line that is not JSON for a broken watch and resumes from the last good resourceVersion', async () => {
    const r = await rig({ seed: (api) => api.apply('services', svc('web')) });
    await synced(r);
    await r.api.waitForWatch('services');
    const lastSeen = r.sink.rvOf('default/web');
    const from = r.api.requests.length;
    r.api.injectRaw('services', '{"type":"MODIFIED","object":{"kind":"Serv');
    const resumed = await r.api.waitForWatch('services', { from });
    expect(resumed.query.resourceVersion).toBe(lastSeen);
    expect(r.logs.some((l) => l.msg.startsWith('watch of services failed') && (l.err as { failure?: string }).failure === 'BadResponse')).toBe(true);
  });

  it('takes an ERROR event other than 410 for a failed watch: backs off and resumes from the same resourceVersion', async () => {
    const r = await rig({ seed: (api) => api.apply('services', svc('web')) });
    await synced(r);
    await r.api.waitForWatch('services');
    const lastSeen = r.sink.rvOf('default/web');
    const from = r.api.requests.length;
    r.api.injectRaw('services', JSON.stringify({ type: 'ERROR', object: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'etcdserver: request timed out', reason: 'InternalError', code: 500 } }));
    const resumed = await r.api.waitForWatch('services', { from });
    expect(resumed.query.resourceVersion).toBe(lastSeen);
    const failure = r.logs.find((l) => l.msg.startsWith('watch of services failed'));
    expect(failure?.err).toMatchObject({ status: 500, failure: 'Status' });
    expect(r.source.stats().services).toMatchObject({ lists: 1, expired: 0 });
  });

  it('gives up on a watch that hangs and watches again', async () => {
    const r = await rig({ source: { watchTimeoutSeconds: () => 1, watchGraceMs: 100 }, seed: (api) => api.apply('services', svc('web')) });
    await synced(r);
    await r.api.waitForWatch('services');
    const release = r.api.hold('services', { watch: true });
    r.api.dropWatches('services');
    await waitFor(() => r.logs.some((l) => l.msg.startsWith('watch of services failed') && (l.err as { failure?: string }).failure === 'Timeout'), 'the hung watch to time out');
    const from = r.api.requests.length;
    release();
    await r.api.waitForWatch('services', { from });
    r.api.apply('services', svc('later'));
    await waitFor(() => r.sink.services.has('default/later'), 'the change after the hang');
  });

  it('follows this Node: its zone to the sink when it changes, the object to onNode, a deletion as undefined', async () => {
    const node = (zone: string, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
      apiVersion: 'v1',
      kind: 'Node',
      metadata: { name: 'node1', labels: { 'kubernetes.io/hostname': 'node1', 'topology.kubernetes.io/zone': zone } },
      spec: {},
      ...extra,
    });
    const r = await rig({
      seed: (api) => {
        api.apply('nodes', node('zone-a'));
        api.apply('nodes', { ...node('zone-z'), metadata: { name: 'node2', labels: { 'topology.kubernetes.io/zone': 'zone-z' } } });
      },
    });
    await synced(r);
    await waitFor(() => r.sink.nodes.length === 1, 'the Node');
    expect(r.sink.nodes).toEqual([{ name: 'node1', zone: 'zone-a' }]);
    await r.api.waitForWatch('nodes');
    r.api.apply('nodes', node('zone-a', { spec: { taints: [{ key: 'ToBeDeletedByClusterAutoscaler', effect: 'NoSchedule' }] } }));
    await waitFor(() => r.nodes.length === 2, 'the tainted Node');
    expect(r.nodes[1]?.spec?.taints?.[0]?.key).toBe('ToBeDeletedByClusterAutoscaler');
    expect(r.sink.nodes).toHaveLength(1); // the zone did not change: nothing to re-program
    r.api.apply('nodes', node('zone-b'));
    await waitFor(() => r.sink.nodes.length === 2, 'the new zone');
    expect(r.sink.nodes[1]).toEqual({ name: 'node1', zone: 'zone-b' });
    r.api.remove('nodes', '', 'node1');
    await waitFor(() => r.nodes.length === 4 && r.nodes[3] === undefined, 'the deletion');
    expect(r.sink.nodes[2]).toEqual({ name: 'node1' });
    expect(r.nodes.every((n) => n === undefined || n.metadata?.name === 'node1')).toBe(true);
  });

  it('stops promptly, even with a request held by the server', async () => {
    const r = await rig({ start: false, seed: (api) => api.apply('services', svc('web')) });
    r.api.hold('services');
    await r.source.start(r.sink);
    await r.api.waitForRequest((q) => q.resource === 'services');
    await withDeadline(r.source.stop(), 2000, 'stop');
  });
});
