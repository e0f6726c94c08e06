import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Socket as UdpSocket } from 'node:dgram';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { roundRobinFactory } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { PortAllocator } from '../src/core/port-allocator.js';
import { ServicePortStats } from '../src/core/stats.js';
import { StatsLedger } from '../src/core/stats-ledger.js';
import { TRIGGER_TIME_ANNOTATION } from '../src/core/translate.js';
import { HttpServer } from '../src/io/http/http-server.js';
import { attachMetrics, type ProxyMetrics } from '../src/io/http/metrics.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { UdpProxySocket } from '../src/io/net/udp-proxy.js';
import { LISTENER_RECV_BUFFER_BYTES, UdpReceiveBuffers } from '../src/io/net/udp-receive-buffers.js';
import { LoopbackPortal } from '../src/io/portal/loopback-portal.js';
import { silentLogger } from '../src/log.js';
import type { StateSink } from '../src/seams/state-sink.js';
import type { Proxier } from '../src/proxier/proxier.js';
import type { LocalUnitSet } from '../src/proxier/unit-set.js';
import { Topic } from '../src/core/topic.js';
import type { SyncEvent, SyncSummary } from '../src/seams/proxier-events.js';
import { makeProxier } from './helpers/make-proxier.js';
import { endpointSlice, service } from './helpers/objects.js';
import { freePort } from './helpers/net.js';
import { boundUdp, clientOutcome, closedTcpPort, connectTo, tcpBackend, udpAsk, udpEcho, withDeadline, type TcpBackend } from './helpers/proxy-fixtures.js';

/**
 * Every metric moves when its event happens: a real Proxier with real TCP and UDP proxy sockets
 * on loopback, changes fed through the sync loop's sink, /metrics scraped over HTTP.
 */

const NODE = 'node-a';
/** The wall clock metrics see: moved by hand, so latencies from trigger times are exact. */
const WALL0 = Date.parse('2026-11-22T10:00:00Z');
let wall = WALL0;
const logger = silentLogger();
let proxier: Proxier;
let units: LocalUnitSet;
let metrics: ProxyMetrics;
let sink: StateSink;
let admin: HttpServer;
let base: string;
let port: number;
let backend: TcpBackend;
let udpBackend: Awaited<ReturnType<typeof udpEcho>>;
const clients: UdpSocket[] = [];
const receiveBuffers = new UdpReceiveBuffers({ logger });

// Loopback portal: ClusterIP 10.96.50.x is served on 127.96.50.x.
const WEB = '127.96.50.1';
const DEAD = '127.96.50.2';
const EMPTY = '127.96.50.3';
const DNS = '127.96.50.4';

/** The next sync's summary. The callback stays registered (a no-op once resolved): removing it while the proxier iterates would skip the next one. */
function nextSync(): Promise<SyncSummary> {
  return withDeadline(
    new Promise<SyncSummary>((resolve) => {
      const off = proxier.onSync((e) => {
        off();
        resolve(e.summary);
      });
    }),
    5000,
    'a sync',
  );
}

async function scrape(): Promise<string> {
  const res = await fetch(`${base}/metrics`);
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return res.text();
}

/** The value of the one series of `name` whose labels include `labels` (0 when there is none). */
function value(text: string, name: string, labels: Record<string, string> = {}): number {
  let found: number | undefined;
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = new Map([...(m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => have.get(k) === v)) {
      if (found !== undefined) throw new Error(`more than one series of ${name} matches ${JSON.stringify(labels)}`);
      found = Number(m[3]);
    }
  }
  return found ?? 0;
}

const web = { service_port: 'default/web:http', protocol: 'TCP', scope: 'all' };
const dead = { service_port: 'default/dead:http', protocol: 'TCP', scope: 'all' };
const empty = { service_port: 'default/empty:http', protocol: 'TCP', scope: 'all' };
const dns = { service_port: 'default/dns:dns', protocol: 'UDP', scope: 'all' };

function objects(deadPort: number): { services: V1Service[]; slices: V1EndpointSlice[] } {
  const services = [
    service({ name: 'web', clusterIP: '10.96.50.1', ports: [{ name: 'http', port }] }),
    service({ name: 'dead', clusterIP: '10.96.50.2', ports: [{ name: 'http', port }] }),
    service({ name: 'empty', clusterIP: '10.96.50.3', ports: [{ name: 'http', port }] }),
    service({ name: 'dns', clusterIP: '10.96.50.4', ports: [{ name: 'dns', port, protocol: 'UDP' }] }),
    // Local internal traffic policy, endpoints on another node only: no local endpoints.
    service({ name: 'local', clusterIP: '10.96.50.5', internalTrafficPolicy: 'Local', ports: [{ name: 'http', port }] }),
  ] as unknown as V1Service[];
  const slices = [
    endpointSlice({ service: 'web', ports: [{ name: 'http', port: backend.port }], endpoints: [{ ip: '127.0.50.1' }] }),
    endpointSlice({ service: 'dead', ports: [{ name: 'http', port: deadPort }], endpoints: [{ ip: '127.0.50.2' }] }),
    endpointSlice({ service: 'dns', ports: [{ name: 'dns', port: udpBackend.port, protocol: 'UDP' }], endpoints: [{ ip: '127.0.50.4' }] }),
    endpointSlice({ service: 'local', ports: [{ name: 'http', port: backend.port }], endpoints: [{ ip: '127.0.50.1', nodeName: 'node-b' }] }),
  ] as unknown as V1EndpointSlice[];
  return { services, slices };
}

beforeAll(async () => {
  backend = await tcpBackend('127.0.50.1');
  udpBackend = await udpEcho('127.0.50.4');
  port = await freePort(WEB);
  const dialer = new DirectDialer();
  ({ proxier, units } = makeProxier({
    portal: new LoopbackPortal(),
    logger,
    balancerFactory: roundRobinFactory,
    socketFactory: (unit, balancer, stats) =>
      unit.protocol === 'UDP'
        ? new UdpProxySocket({ name: unit.id, balancer, logger, stats, idleTimeoutMs: 60_000, maxSessions: 1, receiveBuffers })
        : new TcpProxySocket({ name: unit.id, balancer, dialer, logger, stats, dialTimeoutsMs: [1000, 1000] }),
    portAllocator: new PortAllocator(undefined, Math.random),
    clock: systemClock,
    random: Math.random,
    node: { name: NODE },
    minSyncPeriodMs: 0,
    syncPeriodMs: 60_000,
    sweepIntervalMs: 1000,
    bindAddress: '127.0.0.1',
  }));
  admin = new HttpServer(logger);
  metrics = attachMetrics(admin, { events: proxier, stats: () => units.stats() }, { wallNow: () => wall, kernelCounters: receiveBuffers });
  sink = proxier.sink;
  const bound = await admin.listen('127.0.0.1', 0);
  base = `http://127.0.0.1:${bound.port}`;
});

afterAll(async () => {
  for (const c of clients) c.close();
  await proxier?.shutdown(0);
  await admin?.close();
  await backend?.close();
  udpBackend?.close();
});

describe('kube-proxy\'s sync metrics', () => {
  it('count the first lists, time the first sync, and count service ports without local endpoints', async () => {
    const before = await scrape();
    expect(value(before, 'kubeproxy_sync_proxy_rules_duration_seconds_count')).toBe(0);
    expect(value(before, 'kubeproxy_sync_proxy_rules_last_timestamp_seconds')).toBe(0);

    const { services, slices } = objects(await closedTcpPort('127.0.50.2'));
    sink.setNode({ name: NODE });
    sink.replaceServices(services);
    sink.replaceEndpointSlices(slices);
    const synced = nextSync();
    void proxier.setSynced();
    expect((await synced).opened).toBe(5);

    const after = await scrape();
    expect(value(after, 'kubeproxy_sync_proxy_rules_service_changes_total')).toBe(5);
    expect(value(after, 'kubeproxy_sync_proxy_rules_endpoint_changes_total')).toBe(4);
    expect(value(after, 'kubeproxy_sync_proxy_rules_duration_seconds_count')).toBe(1);
    expect(value(after, 'kubeproxy_sync_proxy_rules_last_timestamp_seconds')).toBe(WALL0 / 1000);
    // Nothing is queued before the proxier is initialized, as upstream.
    expect(value(after, 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds')).toBe(0);
    expect(value(after, 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', { traffic_policy: 'internal' })).toBe(1);
    expect(value(after, 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', { traffic_policy: 'external' })).toBe(0);
    expect(value(after, 'kube_userspace_proxy_service_ports')).toBe(5);
  });

  it('stamp the queued time on a change, and observe network programming latency from the trigger time once applied', async () => {
    // Changed 1 s after the proxy started; reaches the proxy (and is programmed) 2.5 s later.
    const trigger = new Date(WALL0 + 1000).toISOString();
    wall = WALL0 + 3500;
    const slice = endpointSlice({ service: 'local', ports: [{ name: 'http', port: backend.port }], endpoints: [{ ip: '127.0.50.1', nodeName: NODE }], resourceVersion: '2' }) as unknown as V1EndpointSlice;
    slice.metadata = { ...slice.metadata, annotations: { [TRIGGER_TIME_ANNOTATION]: trigger } };
    const synced = nextSync();
    sink.upsertEndpointSlice(slice);
    expect(value(await scrape(), 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds')).toBe((WALL0 + 3500) / 1000);
    await synced;
    const text = await scrape();
    expect(value(text, 'kubeproxy_sync_proxy_rules_endpoint_changes_total')).toBe(5);
    expect(value(text, 'kubeproxy_network_programming_duration_seconds_count')).toBe(1);
    expect(value(text, 'kubeproxy_network_programming_duration_seconds_sum')).toBe(2.5);
    expect(value(text, 'kubeproxy_network_programming_duration_seconds_bucket', { le: '2' })).toBe(0);
    expect(value(text, 'kubeproxy_network_programming_duration_seconds_bucket', { le: '3' })).toBe(1);
    expect(value(text, 'kubeproxy_sync_proxy_rules_last_timestamp_seconds')).toBe((WALL0 + 3500) / 1000);
    expect(value(text, 'kubeproxy_sync_proxy_rules_duration_seconds_count')).toBe(2);
    // The endpoint is local now.
    expect(value(text, 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', { traffic_policy: 'internal' })).toBe(0);

    // The same versions again (a re-list, a resync): nothing changed, so nothing is counted or queued.
    wall = WALL0 + 9000;
    sink.upsertEndpointSlice(slice);
    const { services } = objects(0);
    sink.replaceServices(services);
    const again = await scrape();
    expect(value(again, 'kubeproxy_sync_proxy_rules_endpoint_changes_total')).toBe(5);
    expect(value(again, 'kubeproxy_sync_proxy_rules_service_changes_total')).toBe(5);
    expect(value(again, 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds')).toBe((WALL0 + 3500) / 1000);
  });

  it('count health probe answers by code', async () => {
    metrics.probed('healthz', 200);
    metrics.probed('healthz', 503);
    metrics.probed('livez', 200);
    const text = await scrape();
    expect(value(text, 'kubeproxy_proxy_healthz_total', { code: '200' })).toBe(1);
    expect(value(text, 'kubeproxy_proxy_healthz_total', { code: '503' })).toBe(1);
    expect(value(text, 'kubeproxy_proxy_livez_total', { code: '200' })).toBe(1);
  });
});

describe('the userspace proxy\'s own metrics, per service port', () => {
  it('TCP: accepted and active while open, bytes each way once closed, dial attempts and latency', async () => {
    const { socket, got } = await connectTo(port, WEB);
    socket.write('hello');
    await got.until(5);
    const open = await scrape();
    expect(value(open, 'kube_userspace_proxy_connections_accepted_total', web)).toBe(1);
    expect(value(open, 'kube_userspace_proxy_connections_active', web)).toBe(1);
    expect(value(open, 'kube_userspace_proxy_dial_attempts_total', web)).toBe(1);
    expect(value(open, 'kube_userspace_proxy_dial_duration_seconds_count')).toBe(1);
    expect(value(open, 'kube_userspace_proxy_dial_duration_seconds_bucket', { le: '+Inf' })).toBe(1);

    socket.end('!');
    await withDeadline(got.ended, 5000, 'the echo to end');
    socket.destroy();
    await waitForValue('kube_userspace_proxy_connections_active', web, 0);
    const closed = await scrape();
    expect(value(closed, 'kube_userspace_proxy_bytes_total', { ...web, direction: 'to_endpoint' })).toBe(6);
    expect(value(closed, 'kube_userspace_proxy_bytes_total', { ...web, direction: 'to_client' })).toBe(6);
  });

  it('TCP: failed dials by reason, and the reset when every dial failed', async () => {
    expect((await clientOutcome(port, DEAD)).code).toBe('ECONNRESET');
    const text = await scrape();
    expect(value(text, 'kube_userspace_proxy_dial_failures_total', { ...dead, reason: 'refused' })).toBe(2);
    expect(value(text, 'kube_userspace_proxy_dial_failures_total', { ...dead, reason: 'timeout' })).toBe(0);
    expect(value(text, 'kube_userspace_proxy_dial_attempts_total', dead)).toBe(2);
    expect(value(text, 'kube_userspace_proxy_dial_exhausted_total', dead)).toBe(1);
  });

  it('TCP: connections reset for want of endpoints', async () => {
    expect((await clientOutcome(port, EMPTY)).code).toBe('ECONNRESET');
    expect(value(await scrape(), 'kube_userspace_proxy_no_endpoints_total', empty)).toBe(1);
  });

  it('UDP: sessions active and opened, datagrams and bytes, sessions reclaimed at the bound', async () => {
    const a = await boundUdp('127.0.0.1');
    const b = await boundUdp('127.0.0.1');
    clients.push(a, b);
    expect((await udpAsk(a, port, DNS, 'ping')).msg.toString()).toBe('ping');
    const one = await scrape();
    expect(value(one, 'kube_userspace_proxy_udp_sessions_active', dns)).toBe(1);
    expect(value(one, 'kube_userspace_proxy_udp_sessions_total', dns)).toBe(1);
    expect(value(one, 'kube_userspace_proxy_udp_datagrams_total', dns)).toBe(1);
    expect(value(one, 'kube_userspace_proxy_bytes_total', { ...dns, direction: 'to_endpoint' })).toBe(4);
    expect(value(one, 'kube_userspace_proxy_bytes_total', { ...dns, direction: 'to_client' })).toBe(4);
    expect(value(one, 'kube_userspace_proxy_udp_sessions_reclaimed_total', dns)).toBe(0);

    // --max-udp-sessions is 1 here: a second client reclaims the first one's session.
    await udpAsk(b, port, DNS, 'pong');
    const two = await scrape();
    expect(value(two, 'kube_userspace_proxy_udp_sessions_reclaimed_total', dns)).toBe(1);
    expect(value(two, 'kube_userspace_proxy_udp_sessions_total', dns)).toBe(2);
    expect(value(two, 'kube_userspace_proxy_udp_sessions_active', dns)).toBe(1);
    expect(value(two, 'kube_userspace_proxy_udp_datagrams_dropped_total', dns)).toBe(0);
    expect(two).toContain(`kube_userspace_proxy_udp_datagrams_dropped_total{service_port="default/dns:dns",protocol="UDP",scope="all"} 0`);
  });

  it('UDP: datagrams the kernel dropped from the listener\'s full receive buffer, read at scrape time', async () => {
    expect(value(await scrape(), 'kube_userspace_proxy_udp_receive_buffer_drops_total', dns)).toBe(0);
    const c = await boundUdp('127.0.0.1');
    clients.push(c);
    await new Promise<void>((resolve) => c.connect(port, DNS, () => resolve()));
    // Sent before the event loop can read any: more than the listener's buffer can hold (Linux
    // grants at most twice what is asked).
    const payload = Buffer.alloc(60_000);
    const count = Math.ceil((3 * LISTENER_RECV_BUFFER_BYTES) / payload.length);
    for (let i = 0; i < count; i++) c.send(payload);
    const drops = value(await scrape(), 'kube_userspace_proxy_udp_receive_buffer_drops_total', dns);
    expect(drops).toBeGreaterThan(0);
    expect(drops).toBeLessThan(count);
  });

  it('keeps counting across a service port\'s recreation, and drops the series once the Service is gone', async () => {
    const before = value(await scrape(), 'kube_userspace_proxy_connections_accepted_total', web);
    // A new port recreates the unit (and its stats) under the same service port name.
    const newPort = await freePort(WEB);
    let synced = nextSync();
    sink.upsertService(service({ name: 'web', clusterIP: '10.96.50.1', ports: [{ name: 'http', port: newPort }], resourceVersion: '2' }));
    expect((await synced).recreated).toBe(1);
    const { socket, got } = await connectTo(newPort, WEB);
    socket.end('x');
    await withDeadline(got.ended, 5000, 'the echo');
    socket.destroy();
    await waitForValue('kube_userspace_proxy_connections_active', web, 0);
    expect(value(await scrape(), 'kube_userspace_proxy_connections_accepted_total', web)).toBe(before + 1);

    synced = nextSync();
    sink.deleteService('default', 'web');
    await synced;
    expect(value(await scrape(), 'kube_userspace_proxy_connections_accepted_total', web)).toBe(before + 1); // read once more
    expect(await scrape()).not.toContain('service_port="default/web:http"');
    // Node-wide dial latency does not go down when a series goes.
    expect(value(await scrape(), 'kube_userspace_proxy_dial_duration_seconds_count')).toBeGreaterThanOrEqual(2);
  });

  it('the whole exposition is well formed: one HELP and TYPE per family, each before its samples, no sample twice', async () => {
    const text = await scrape();
    const typed = new Map<string, string>();
    const samples = new Set<string>();
    for (const line of text.split('\n')) {
      if (line === '') continue;
      const t = /^# TYPE (\S+) (counter|gauge|histogram|summary)$/.exec(line);
      if (t) {
        expect(typed.has(t[1] as string), `${t[1]} typed once`).toBe(false);
        typed.set(t[1] as string, t[2] as string);
        continue;
      }
      if (line.startsWith('# HELP ')) continue;
      // Values as Prometheus parses them (Go's ParseFloat: NaN in any case; prom-client writes "Nan").
      const m = /^([a-zA-Z_:][\w:]*)(\{.*\})? (-?\d+(\.\d+)?(e[+-]?\d+)?|[+-]Inf|nan)$/i.exec(line);
      expect(m, line).not.toBeNull();
      const name = (m as RegExpExecArray)[1] as string;
      const family = typed.has(name) ? name : name.replace(/_(bucket|sum|count)$/, '');
      expect(typed.has(family), `${name} comes after its TYPE`).toBe(true);
      expect(samples.has(line.replace(/ \S+$/, '')), `${line} once`).toBe(false);
      samples.add(line.replace(/ \S+$/, ''));
    }
    expect(typed.get('kube_userspace_proxy_dial_duration_seconds')).toBe('histogram');
    expect(typed.get('process_open_fds')).toBe('gauge');
  });

  it('serves kube-proxy\'s /proxyMode', async () => {
    expect(await (await fetch(`${base}/proxyMode`)).text()).toBe('userspace');
  });
});

async function waitForValue(name: string, labels: Record<string, string>, want: number): Promise<void> {
  const deadline = performance.now() + 5000;
  for (;;) {
    if (value(await scrape(), name, labels) === want) return;
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${name} to be ${want}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('no-local-endpoints', () => {
  it('shows the proxier\'s counts after every sync, also a change that arrived during the one before', async () => {
    let counts = { internal: 0, external: 0 };
    const syncs = new Topic<SyncEvent>((err) => {
      throw err;
    });
    const events = { onSync: (l: (e: SyncEvent) => void) => syncs.subscribe(l), onChange: () => () => {} };
    const m = attachMetrics(new HttpServer(silentLogger()), { events, stats: () => [] }, { processMetrics: false });
    const summary: SyncSummary = { services: 1, units: 1, opened: 0, closed: 0, recreated: 0, updated: 1, listenErrors: 0, portalErrors: 0, durationMs: 1 };
    const sync = (): SyncEvent => ({ summary, periodic: false, first: false, complete: true, startedAt: 0, finishedAt: 1, serviceHealth: [], noLocalEndpoints: counts, listeners: 0, listenersFailed: 0 });
    syncs.publish(sync());
    // The proxier counted the change at its next sync; no change event came between the two syncs.
    counts = { internal: 1, external: 2 };
    syncs.publish(sync());
    const text = await m.render();
    expect(value(text, 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', { traffic_policy: 'internal' })).toBe(1);
    expect(value(text, 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', { traffic_policy: 'external' })).toBe(2);
  });
});

describe('the ledger behind the per-service-port series', () => {
  const labels = { servicePort: 'default/a:http', protocol: 'TCP', scope: 'all' };

  it('folds a retired stats object in once it has drained, so totals never go down', () => {
    const ledger = new StatsLedger();
    const first = new ServicePortStats();
    first.accepted = 3;
    first.active = 1;
    expect(ledger.read([{ labels, stats: first }]).series[0]?.totals.accepted).toBe(3);
    // Recreated: a fresh stats object; the old one still has a connection draining.
    const second = new ServicePortStats();
    second.accepted = 1;
    expect(ledger.read([{ labels, stats: second }]).series[0]?.totals.accepted).toBe(4);
    first.accepted = 4; // the retired socket accepted nothing more, but say a late count landed
    first.active = 0;
    expect(ledger.read([{ labels, stats: second }]).series[0]?.totals.accepted).toBe(5);
    // Folded: later reads keep the total without holding the object.
    expect(ledger.read([{ labels, stats: second }]).series[0]?.totals.accepted).toBe(5);
  });

  it('reads a gone series once more, then drops it, keeping its counts node-wide', () => {
    const ledger = new StatsLedger();
    const s = new ServicePortStats();
    s.dialLatencyCount = 2;
    ledger.read([{ labels, stats: s }]);
    const once = ledger.read([]);
    expect(once.series).toHaveLength(1);
    const dropped = ledger.read([]);
    expect(dropped.series).toHaveLength(0);
    expect(dropped.node.dialLatencyCount).toBe(2);
    expect(ledger.read([]).node.dialLatencyCount).toBe(2);
  });
});

describe('the data path', () => {
  it('never touches prom-client: only the metrics module imports it', () => {
    const root = join(import.meta.dirname, '..', 'src');
    const importers: string[] = [];
    const walk = (dir: string): void => {
      for (const e of readdirSync(dir, { withFileTypes: true })) {
        const p = join(dir, e.name);
        if (e.isDirectory()) walk(p);
        else if (p.endsWith('.ts') && /from 'prom-client'/.test(readFileSync(p, 'utf8'))) importers.push(p.slice(root.length + 1));
      }
    };
    walk(root);
    expect(importers).toEqual(['io/http/metrics.ts']);
  });
});
