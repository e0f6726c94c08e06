import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProxierHealth, TO_BE_DELETED_TAINT } from '../src/core/proxier-health.js';
import { Topic } from '../src/core/topic.js';
import { followProxier, startHealthServer } from '../src/io/http/healthz.js';
import type { HttpServer } from '../src/io/http/http-server.js';
import { silentLogger } from '../src/log.js';
import type { ChangeEvent, SyncEvent, SyncSummary } from '../src/seams/proxier-events.js';

/** kube-proxy's /healthz and /livez: the state machine with a fake clock, then over HTTP. */

const TIMEOUT = 60_000; // 2 x a 30 s sync period
const EPOCH = Date.parse('2026-11-22T10:00:00Z');

function fakeClocks(): { clock: { now(): number }; wallNow: () => number; advance(ms: number): void } {
  let t = 0;
  return { clock: { now: () => t }, wallNow: () => EPOCH + t, advance: (ms) => { t += ms; } };
}

const iso = (offsetMs: number): string => new Date(EPOCH + offsetMs).toISOString();

function summary(portalErrors = 0): SyncSummary {
  return { services: 0, units: 0, opened: 0, closed: 0, recreated: 0, updated: 0, listenErrors: 0, portalErrors, durationMs: 1 };
}

function syncEvent(portalErrors = 0): SyncEvent {
  return { summary: summary(portalErrors), periodic: false, first: false, complete: true, startedAt: 0, finishedAt: 1, serviceHealth: [], noLocalEndpoints: { internal: 0, external: 0 }, listeners: 0, listenersFailed: 0 };
}

describe('health transitions', () => {
  it('is healthy when fresh, before any update, and reports now as lastUpdated', () => {
    const c = fakeClocks();
    const h = new ProxierHealth(TIMEOUT, c);
    c.advance(10 * TIMEOUT);
    expect(h.livez()).toEqual({ status: 200, body: { lastUpdated: iso(10 * TIMEOUT), currentTime: iso(10 * TIMEOUT) } });
    expect(h.healthz()).toEqual({ status: 200, body: { lastUpdated: iso(10 * TIMEOUT), currentTime: iso(10 * TIMEOUT), nodeEligible: true } });
  });

  it('stays healthy while a queued update is younger than the timeout', () => {
    const c = fakeClocks();
    const h = new ProxierHealth(TIMEOUT, c);
    h.queuedUpdate();
    c.advance(TIMEOUT - 1);
    h.queuedUpdate(); // a later change does not move the oldest one
    expect(h.livez().status).toBe(200);
    expect(h.healthz().status).toBe(200);
  });

  it('turns stale (503) when the oldest queued update waits for the timeout, and recovers on the next update', () => {
    const c = fakeClocks();
    const h = new ProxierHealth(TIMEOUT, c);
    h.queuedUpdate();
    c.advance(TIMEOUT);
    // Never updated: lastUpdated is Go's zero time, as kube-proxy reports it.
    expect(h.livez()).toEqual({ status: 503, body: { lastUpdated: '0001-01-01T00:00:00Z', currentTime: iso(TIMEOUT) } });
    h.updated();
    const updatedAt = TIMEOUT;
    expect(h.livez().status).toBe(200);
    h.queuedUpdate();
    c.advance(TIMEOUT + 5);
    expect(h.livez()).toEqual({ status: 503, body: { lastUpdated: iso(updatedAt), currentTime: iso(2 * TIMEOUT + 5) } });
    expect(h.healthz()).toEqual({ status: 503, body: { lastUpdated: iso(updatedAt), currentTime: iso(2 * TIMEOUT + 5), nodeEligible: true } });
    h.updated();
    expect(h.healthz().status).toBe(200);
  });

  it('/healthz turns 503 while the Node is being deleted or tainted for deletion; /livez does not', () => {
    const c = fakeClocks();
    const h = new ProxierHealth(TIMEOUT, c);
    h.setNode({ metadata: { deletionTimestamp: new Date(EPOCH) } });
    expect(h.healthz()).toEqual({ status: 503, body: { lastUpdated: '0001-01-01T00:00:00Z', currentTime: iso(0), nodeEligible: false } });
    expect(h.livez().status).toBe(200);

    h.setNode({ metadata: {}, spec: { taints: [{ key: 'node.kubernetes.io/unschedulable' }] } });
    expect(h.healthz().status).toBe(200);

    h.setNode({ metadata: {}, spec: { taints: [{ key: TO_BE_DELETED_TAINT }] } });
    expect(h.healthz().body.nodeEligible).toBe(false);
    expect(h.healthz().status).toBe(503);
    expect(h.livez().status).toBe(200);

    h.setNode({ metadata: { deletionTimestamp: null }, spec: { taints: null } });
    expect(h.healthz().status).toBe(200);

    h.setNode(undefined); // the Node object is gone
    expect(h.healthz().status).toBe(503);
  });

  it('/readyz says not ready while a hand-over is under way, naming the other process (--handover-socket); /healthz and /livez stay kube-proxy\'s; as before once it is over', () => {
    const c = fakeClocks();
    const h = new ProxierHealth(TIMEOUT, c);
    const ok = { status: 200, body: { lastUpdated: iso(0), currentTime: iso(0), nodeEligible: true } };
    expect(h.readyz()).toEqual(ok);
    h.setHandingOver(4242);
    expect(h.readyz()).toEqual({ status: 503, body: { ...ok.body, message: 'handing over to pid 4242' } });
    expect(h.healthz()).toEqual(ok);
    expect(h.livez()).toEqual({ status: 200, body: { lastUpdated: iso(0), currentTime: iso(0) } });
    h.setHandingOver(undefined);
    expect(h.readyz()).toEqual(ok);
    h.setTakingOver(17);
    expect(h.readyz()).toEqual({ status: 503, body: { ...ok.body, message: 'taking over from pid 17' } });
    expect(h.healthz()).toEqual(ok);
    h.setTakingOver(undefined);
    expect(h.readyz()).toEqual(ok);
  });
});

describe('following the proxier', () => {
  it('queues nothing before the first sync, then follows changes and syncs', () => {
    const c = fakeClocks();
    const h = new ProxierHealth(TIMEOUT, c);
    const rethrow = (err: unknown): never => {
      throw err;
    };
    const changes = new Topic<ChangeEvent>(rethrow);
    const syncs = new Topic<SyncEvent>(rethrow);
    followProxier(h, { onChange: (l) => changes.subscribe(l), onSync: (l) => syncs.subscribe(l) });

    // The initial list, however slow, arrives before the first sync.
    changes.publish({ change: { kind: 'replaceServices', objects: [] }, changed: 500, initialized: false });
    c.advance(2 * TIMEOUT);
    expect(h.livez().status).toBe(200);

    syncs.publish(syncEvent());
    changes.publish({ change: { kind: 'deleteEndpointSlice', namespace: 'default', name: 'web-1' }, changed: 1, initialized: true });
    c.advance(TIMEOUT);
    expect(h.livez().status).toBe(503);

    // A sync whose portal failed does not count as an update.
    syncs.publish(syncEvent(1));
    expect(h.livez().status).toBe(503);
    syncs.publish(syncEvent(0));
    expect(h.livez().status).toBe(200);
  });
});

describe('over HTTP', () => {
  const c = fakeClocks();
  const health = new ProxierHealth(TIMEOUT, c);
  const probes: Array<[string, number]> = [];
  let server: HttpServer;
  let base: string;
  let port: number;

  beforeAll(async () => {
    const started = await startHealthServer({ host: '127.0.0.1', port: 0, health, logger: silentLogger(), probes: { probed: (p, s) => probes.push([p, s]) } });
    server = started.server;
    port = started.address.port;
    base = `http://127.0.0.1:${port}`;
  });

  afterAll(async () => {
    await server.close();
  });

  it('serves kube-proxy\'s JSON body with its headers, and counts each answer', async () => {
    const res = await fetch(`${base}/healthz`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/json');
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
    const text = await res.text();
    expect(Object.keys(JSON.parse(text) as object)).toEqual(['lastUpdated', 'currentTime', 'nodeEligible']);
    expect(text).not.toContain('\n');

    health.queuedUpdate();
    c.advance(TIMEOUT);
    const live = await fetch(`${base}/livez`);
    expect(live.status).toBe(503);
    expect(await live.json()).toEqual({ lastUpdated: '0001-01-01T00:00:00Z', currentTime: iso(TIMEOUT) });
    expect((await fetch(`${base}/healthz`)).status).toBe(503);
    expect(probes).toEqual([['healthz', 200], ['livez', 503], ['healthz', 503]]);

    health.updated();
    health.setNode({ spec: { taints: [{ key: TO_BE_DELETED_TAINT }] } });
    const res2 = await fetch(`${base}/healthz`);
    expect(res2.status).toBe(503);
    expect(((await res2.json()) as { nodeEligible: boolean }).nodeEligible).toBe(false);
    expect((await fetch(`${base}/livez`)).status).toBe(200);
  });

  it('routes a request in absolute form by its path, as Go\'s server does', async () => {
    const head = await new Promise<string>((resolve, reject) => {
      const sock = connect({ host: '127.0.0.1', port }, () => sock.write(`GET http://127.0.0.1:${port}/livez?verbose HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nConnection: close\r\n\r\n`));
      let got = '';
      sock.on('data', (d: Buffer) => (got += d.toString()));
      sock.on('end', () => resolve(got));
      sock.on('error', reject);
    });
    expect(head.split('\r\n')[0]).toBe('HTTP/1.1 200 OK');
  });
});
