import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import { roundRobinFactory } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { PortAllocator } from '../src/core/port-allocator.js';
import { TRIGGER_TIME_ANNOTATION } from '../src/core/translate.js';
import { HttpServer } from '../src/io/http/http-server.js';
import { attachMetrics, type ProxyMetrics } from '../src/io/http/metrics.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { LoopbackPortal } from '../src/io/portal/loopback-portal.js';
import { silentLogger } from '../src/log.js';
import type { Proxier } from '../src/proxier/proxier.js';
import { makeProxier } from './helpers/make-proxier.js';
import { endpointSlice, service } from './helpers/objects.js';
import { freePort } from './helpers/net.js';

/**
 * kubeproxy_network_programming_duration_seconds must time a change from its trigger time to the
 * run of the sync loop that applied it, not to whatever sync happens to come next.
 */

const NODE = 'node-a';
const WALL0 = Date.parse('2026-11-22T10:00:00Z');
const logger = silentLogger();
let proxier: Proxier | undefined;

afterEach(async () => {
  await proxier?.shutdown(0);
  proxier = undefined;
});

function value(text: string, name: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? NaN : Number(line.split(' ')[1]);
}

function sliceAt(svc: string, ips: Array<{ ip: string; nodeName: string }>, rv: string, trigger?: string): V1EndpointSlice {
  const s = endpointSlice({ service: svc, ports: [{ name: 'http', port: 8080 }], endpoints: ips, resourceVersion: rv }) as unknown as V1EndpointSlice;
  if (trigger !== undefined) s.metadata = { ...s.metadata, annotations: { [TRIGGER_TIME_ANNOTATION]: trigger } };
  return s;
}

async function setUp(): Promise<{ metrics: ProxyMetrics; setWall(ms: number): void; p: Proxier; drain(): Promise<void> }> {
  let wall = WALL0;
  const made = makeProxier({
    portal: new LoopbackPortal(),
    logger,
    balancerFactory: roundRobinFactory,
    socketFactory: (unit, balancer, stats) => new TcpProxySocket({ name: unit.id, balancer, dialer: new DirectDialer(), logger, stats, dialTimeoutsMs: [1000] }),
    portAllocator: new PortAllocator(undefined, Math.random),
    clock: systemClock,
    random: Math.random,
    node: { name: NODE },
    // The runner never fires on its own here: the test asks for every full sync.
    minSyncPeriodMs: 3_600_000,
    syncPeriodMs: 3_600_000,
    sweepIntervalMs: 1000,
    bindAddress: '127.0.0.1',
  });
  proxier = made.proxier;
  const metrics = attachMetrics(new HttpServer(logger), { events: made.proxier, stats: () => made.units.stats() }, { wallNow: () => wall, processMetrics: false });
  const p = made.proxier;
  return {
    metrics,
    p,
    setWall: (ms) => {
      wall = ms;
    },
    // The fast lane is queued in a microtask, then chained on the loop's lock.
    drain: async () => {
      await Promise.resolve();
      await (p as unknown as { exclusive: Promise<void> }).exclusive;
    },
  };
}

describe('network programming latency', () => {
  it('is observed when the fast lane handled a change that left nothing to update, not at the next unrelated sync', async () => {
    const { metrics, p, setWall, drain } = await setUp();
    const port = await freePort('127.96.60.1');
    // internalTrafficPolicy Local: endpoints on other nodes are none of this node's units' business.
    p.sink.setNode({ name: NODE });
    p.sink.replaceServices([service({ name: 'local', clusterIP: '10.96.60.1', internalTrafficPolicy: 'Local', ports: [{ name: 'http', port }] })]);
    p.sink.replaceEndpointSlices([sliceAt('local', [{ ip: '127.0.60.1', nodeName: 'node-b' }], '1')]);
    await p.setSynced();

    // A pod came up on another node 1 s after start; the change reached this proxy at once.
    setWall(WALL0 + 1500);
    p.sink.upsertEndpointSlice(sliceAt('local', [{ ip: '127.0.60.1', nodeName: 'node-b' }, { ip: '127.0.60.2', nodeName: 'node-b' }], '2', new Date(WALL0 + 1000).toISOString()));
    await drain();

    // Much later, an unrelated full sync (kube-proxy's periodic one would be up to 30 s later).
    setWall(WALL0 + 30_000);
    await p.syncNow(true);
    const text = await metrics.render();
    expect(value(text, 'kubeproxy_network_programming_duration_seconds_count')).toBe(1);
    // The change was fully handled at 1.5 s: 0.5 s from its trigger, not 29 s.
    expect(value(text, 'kubeproxy_network_programming_duration_seconds_sum')).toBe(0.5);
  });

  it('is not observed for a Service the fast lane handed back to the runner, before the runner applied it', async () => {
    const { metrics, p, setWall, drain } = await setUp();
    const port = await freePort('127.96.61.1');
    p.sink.setNode({ name: NODE });
    p.sink.replaceServices([service({ name: 'web', clusterIP: '10.96.61.1', ports: [{ name: 'http', port }] })]);
    p.sink.replaceEndpointSlices([sliceAt('web', [{ ip: '127.0.61.1', nodeName: NODE }], '1')]);
    await p.setSynced();

    // One burst: web's endpoints move (fast lane), and a new Service arrives with its slice
    // (needs a socket: handed back to the runner, which waits for --iptables-min-sync-period).
    setWall(WALL0 + 1500);
    const trigger = new Date(WALL0 + 1000).toISOString();
    p.sink.upsertEndpointSlice(sliceAt('web', [{ ip: '127.0.61.2', nodeName: NODE }], '2', trigger));
    p.sink.upsertService(service({ name: 'new', clusterIP: '10.96.61.2', ports: [{ name: 'http', port }] }));
    p.sink.upsertEndpointSlice(sliceAt('new', [{ ip: '127.0.61.3', nodeName: NODE }], '1', trigger));
    await drain();
    // The new Service is not served yet.
    expect(p.status().map((s) => s.servicePort)).toEqual(['default/web:http']);
    const early = await metrics.render();
    // Only web's change is programmed so far.
    expect(value(early, 'kubeproxy_network_programming_duration_seconds_count')).toBe(1);

    setWall(WALL0 + 3000);
    await p.syncNow();
    expect(p.status().map((s) => s.servicePort).sort()).toEqual(['default/new:http', 'default/web:http']);
    const text = await metrics.render();
    expect(value(text, 'kubeproxy_network_programming_duration_seconds_count')).toBe(2);
    // web: 0.5 s; new: 2 s, programmed by the runner's sync at 3 s.
    expect(value(text, 'kubeproxy_network_programming_duration_seconds_sum')).toBe(2.5);
  });
});

describe('the healthCheckNodePort server after a change the fast lane finds nothing to update for', () => {
  it('turns 503 once the only local endpoint is terminating, without waiting for the periodic sync', async () => {
    const { ServiceHealthServer } = await import('../src/io/http/service-health.js');
    const { p, drain } = await setUp();
    const hs = new ServiceHealthServer({ hosts: ['127.0.0.1'], logger });
    // Wired as src/app.ts wires it.
    let last: Promise<void> = Promise.resolve();
    p.onSync((e) => {
      last = hs.sync(e.serviceHealth);
    });
    try {
      const port = await freePort('127.96.62.1');
      const healthPort = await freePort('127.0.0.1');
      const nodePort = await freePort('127.0.0.1');
      const svc = service({ name: 'lb', type: 'LoadBalancer', clusterIP: '10.96.62.1', externalTrafficPolicy: 'Local', ports: [{ name: 'http', port, nodePort }] }) as unknown as V1Service;
      (svc.spec as Record<string, unknown>).healthCheckNodePort = healthPort;
      p.sink.setNode({ name: NODE });
      p.sink.replaceServices([svc]);
      p.sink.replaceEndpointSlices([sliceAt('lb', [{ ip: '127.0.62.1', nodeName: NODE }], '1')]);
      await p.setSynced();
      await last;
      const before = await fetch(`http://127.0.0.1:${healthPort}/`);
      expect(before.status).toBe(200);
      expect(((await before.json()) as { localEndpoints: number }).localEndpoints).toBe(1);

      // A rolling update: the node's only pod is terminating (still serving). kube-proxy's health
      // check fails now, so that the load balancer drains the node.
      const terminating = endpointSlice({ service: 'lb', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '127.0.62.1', nodeName: NODE, ready: false, serving: true, terminating: true }], resourceVersion: '2' }) as unknown as V1EndpointSlice;
      p.sink.upsertEndpointSlice(terminating);
      await drain();
      await last;
      const after = await fetch(`http://127.0.0.1:${healthPort}/`);
      const body = (await after.json()) as { localEndpoints: number };
      expect(body.localEndpoints).toBe(0);
      expect(after.status).toBe(503);
    } finally {
      await hs.close();
    }
  });
});
