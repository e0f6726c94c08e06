import { readFileSync } from 'node:fs';
import { get } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { PROXY_LABEL_SELECTOR } from '../src/io/kube/api-resources.js';

/**
 * The fake API server against what a real kube-apiserver sent (test/fixtures/kube, captured
 * from v1.20.2): if these hold, the API source's tests meet a cluster's real shapes.
 */
type Obj = Record<string, unknown>;
const fixture = (name: string): string => readFileSync(new URL(`./fixtures/kube/${name}`, import.meta.url), 'utf8');
const servicesList = JSON.parse(fixture('services-list.json')) as { items: Obj[] };
const slicesList = JSON.parse(fixture('endpointslices-v1-list.json')) as { items: Obj[] };
const node = JSON.parse(fixture('node.json')) as Obj;
const streamLines = fixture('services-watch-stream.ndjson').trim().split('\n');
const expiredLine = fixture('services-watch-410-error.ndjson').trim();

let api: FakeApiServer;

/** GET with the fake's token; the whole body, or the first `lines` lines of a stream. */
function rawGet(path: string, opts: { lines?: number; token?: string | null } = {}): Promise<{ status: number; headers: Record<string, unknown>; body: string; lines: string[] }> {
  const token = opts.token === undefined ? api.token : opts.token;
  return new Promise((resolve, reject) => {
    const req = get(`${api.url}${path}`, { headers: token ? { Authorization: `Bearer ${token}` } : {} }, (res) => {
      let body = '';
      const timer = setTimeout(() => {
        req.destroy();
        reject(new Error(`no complete answer from ${path}; got ${body}`));
      }, 5000);
      const finish = (): void => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body, lines: body.trim().split('\n').filter(Boolean) });
      };
      res.on('data', (d: Buffer) => {
        body += d.toString();
        if (opts.lines !== undefined && body.split('\n').length > opts.lines) {
          finish();
          req.destroy();
        }
      });
      res.on('end', finish);
    });
    req.on('error', reject);
  });
}

/** Objects compared without the server-assigned resourceVersion. */
function withoutRV(o: Obj): Obj {
  const meta = { ...(o.metadata as Obj) };
  delete meta.resourceVersion;
  return { ...o, metadata: meta };
}

beforeAll(async () => {
  api = await FakeApiServer.start();
  for (const s of servicesList.items) api.apply('services', s);
  for (const s of slicesList.items) api.apply('endpointslices', s);
  api.apply('nodes', node);
});

afterAll(async () => {
  await api?.close();
});

describe('the fake API server speaks as the captured kube-apiserver', () => {
  it('lists as a typed list whose items carry no kind, with the list resourceVersion', async () => {
    const res = await rawGet(`/api/v1/services?labelSelector=${encodeURIComponent(PROXY_LABEL_SELECTOR)}`);
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toBe('application/json');
    const body = JSON.parse(res.body) as { kind: string; apiVersion: string; metadata: Obj; items: Obj[] };
    expect(Object.keys(body)).toEqual(['kind', 'apiVersion', 'metadata', 'items']);
    expect(body).toMatchObject({ kind: 'ServiceList', apiVersion: 'v1', metadata: { resourceVersion: api.currentResourceVersion() } });
    expect(body.items.map(withoutRV)).toEqual(servicesList.items.map(withoutRV));
    for (const item of body.items) expect(typeof (item.metadata as Obj).resourceVersion).toBe('string');

    const slices = JSON.parse((await rawGet('/apis/discovery.k8s.io/v1/endpointslices')).body) as { kind: string; apiVersion: string; items: Obj[] };
    expect(slices).toMatchObject({ kind: 'EndpointSliceList', apiVersion: 'discovery.k8s.io/v1' });
    expect(slices.items.map(withoutRV)).toEqual(slicesList.items.map(withoutRV));
  });

  it('serves one Node by field selector', async () => {
    const body = JSON.parse((await rawGet('/api/v1/nodes?fieldSelector=metadata.name%3Dnode1')).body) as { kind: string; items: Obj[] };
    const { kind: _k, apiVersion: _a, ...item } = node;
    expect(body.kind).toBe('NodeList');
    expect(body.items.map(withoutRV)).toEqual([withoutRV(item)]);
    expect((JSON.parse((await rawGet('/api/v1/nodes?fieldSelector=metadata.name%3Dnode9')).body) as { items: Obj[] }).items).toEqual([]);
  });

  it('streams ADDED, MODIFIED, DELETED as the captured watch did, objects with kind and apiVersion first', async () => {
    const from = api.currentResourceVersion();
    const captured = streamLines.map((l) => JSON.parse(l) as { type: string; object: Obj });
    const [added, modified] = captured as [{ type: string; object: Obj }, { type: string; object: Obj }];
    api.apply('services', added.object);
    api.apply('services', modified.object);
    api.remove('services', 'default', 'late');
    const res = await rawGet(`/api/v1/services?watch=1&allowWatchBookmarks=true&resourceVersion=${from}`, { lines: 3 });
    expect(res.status).toBe(200);
    expect(res.headers['transfer-encoding']).toBe('chunked');
    const got = res.lines.map((l) => JSON.parse(l) as { type: string; object: Obj });
    expect(got.map((e) => e.type)).toEqual(captured.map((e) => e.type));
    for (const [i, e] of got.entries()) {
      expect(Object.keys(e)).toEqual(['type', 'object']);
      expect(Object.keys(e.object).slice(0, 2)).toEqual(['kind', 'apiVersion']);
      expect(withoutRV(e.object)).toEqual(withoutRV((captured[i] as { object: Obj }).object));
    }
    // Each event carries a newer resourceVersion, the deletion's own included.
    const rvs = got.map((e) => Number((e.object.metadata as Obj).resourceVersion));
    expect(rvs).toEqual([...rvs].sort((a, b) => a - b));
    expect(rvs[0]).toBeGreaterThan(Number(from));
  });

  it('answers a watch from a compacted resourceVersion with HTTP 200 and the captured 410 ERROR line, byte for byte', async () => {
    const old = api.currentResourceVersion();
    api.apply('services', { ...(servicesList.items[2] as Obj) });
    api.compact();
    const res = await rawGet(`/api/v1/services?watch=1&resourceVersion=${old}`);
    expect(res.status).toBe(200);
    expect(res.lines).toEqual([expiredLine]);
  });

  it('sends BOOKMARKs only to watches that ask, in the documented shape', async () => {
    const rv = api.currentResourceVersion();
    const asked = rawGet(`/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion=${rv}`, { lines: 1 });
    await api.waitForWatch('services', { from: api.requests.length - 1 });
    api.bookmark();
    const line = JSON.parse((await asked).lines[0] as string) as Obj;
    expect(line).toEqual({ type: 'BOOKMARK', object: { kind: 'Service', apiVersion: 'v1', metadata: { resourceVersion: rv } } });
    api.endWatches();
  });

  it('pages lists with limit and continue, and expires a continue token at compaction with the 410 Status', async () => {
    const first = JSON.parse((await rawGet('/api/v1/services?limit=2')).body) as { metadata: { continue?: string; remainingItemCount?: number; resourceVersion: string }; items: Obj[] };
    expect(first.items).toHaveLength(2);
    expect(first.metadata.remainingItemCount).toBe(servicesList.items.length - 2);
    const second = JSON.parse((await rawGet(`/api/v1/services?limit=2&continue=${first.metadata.continue}`)).body) as { metadata: { continue?: string; resourceVersion: string }; items: Obj[] };
    expect(second.metadata.resourceVersion).toBe(first.metadata.resourceVersion);
    expect(second.metadata.continue).toBeUndefined();
    const again = JSON.parse((await rawGet('/api/v1/services?limit=2')).body) as { metadata: { continue: string } };
    api.compact();
    const expired = await rawGet(`/api/v1/services?limit=2&continue=${again.metadata.continue}`);
    expect(expired.status).toBe(410);
    expect(JSON.parse(expired.body)).toMatchObject({ kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'Expired', code: 410 });
  });

  it('turns an object that stops matching the selector into DELETED, and one that starts into ADDED', async () => {
    const rv = api.currentResourceVersion();
    const web = api.get('services', 'default', 'web') as Obj;
    api.apply('services', { ...web, metadata: { ...(web.metadata as Obj), labels: { 'service.kubernetes.io/service-proxy-name': 'other' } } });
    api.apply('services', web);
    const res = await rawGet(`/api/v1/services?watch=1&resourceVersion=${rv}&labelSelector=${encodeURIComponent(PROXY_LABEL_SELECTOR)}`, { lines: 2 });
    expect(res.lines.map((l) => (JSON.parse(l) as { type: string }).type)).toEqual(['DELETED', 'ADDED']);
  });

  it('refuses a request without the token, with a Status', async () => {
    const res = await rawGet('/api/v1/services', { token: null });
    expect(res.status).toBe(401);
    expect(JSON.parse(res.body)).toMatchObject({ kind: 'Status', reason: 'Unauthorized', code: 401 });
  });
});
