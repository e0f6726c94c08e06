/**
 * Network programming latency with 1,000 Services of 10 endpoints each, when one endpoint of
 * one Service changes: the API source (through the fake API server, over loopback HTTP) feeds
 * the proxier (loopback portal, real TCP proxy sockets), with kube-proxy's default sync periods
 * (--iptables-min-sync-period 1s, --iptables-sync-period 30s).
 *
 * Per change, three figures:
 *  - emitted -> programmed: the fake server writes the MODIFIED event; the proxier's sync that
 *    applies it ends (its sync event);
 *  - arrival -> programmed: the same, from the moment the event reached the sink (what
 *    ProgrammingLatencyTracker reports, as network_programming_duration_seconds minus the
 *    controller's part);
 *  - emitted -> first connection: new connections to the Service are made back to back until
 *    one is answered by the endpoint that just appeared (round-robin over 10 endpoints, so up
 *    to 10 connections after programming).
 * Changes are spaced so that each finds the rate-limited runner idle (the steady case); a change
 * that follows another sync within the minimum sync period waits up to that period on top.
 *
 * Run: npm run build && node dist/bench/programming-latency.js [services] [changes] (defaults 1000 20);
 * it prints JSON and writes it to bench/results/ beside the compiled file.
 * Everything listens on loopback only.
 */
import { writeFileSync, mkdirSync } from 'node:fs';
import { connect } from 'node:net';
import { roundRobinFactory } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { PortAllocator } from '../src/core/port-allocator.js';
import { HttpKubeApi } from '../src/io/kube/api-client.js';
import { ApiSource } from '../src/io/kube/api-source.js';
import { ProgrammingLatencyTracker, type ProgrammedChange } from '../src/core/programming-latency.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { LoopbackPortal } from '../src/io/portal/loopback-portal.js';
import { silentLogger } from '../src/log.js';
import { Proxier } from '../src/proxier/proxier.js';
import { LocalUnitSet } from '../src/proxier/unit-set.js';
import type { SyncSummary } from '../src/seams/proxier-events.js';
import { FakeApiServer } from '../test/helpers/fake-apiserver.js';
import { endpointSlice, service } from '../test/helpers/objects.js';
import { freePort, tcpEchoServer } from '../test/helpers/net.js';

const SERVICES = Number(process.argv[2] ?? 1000);
const CHANGES = Number(process.argv[3] ?? 20);
const ENDPOINTS = 10;
const PROBED = 0; // the Service whose endpoint changes
const MIN_SYNC_MS = 1000;
const SYNC_MS = 30_000;

const clusterIP = (i: number): string => `10.100.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`;
const loopbackOf = (ip: string): string => ip.replace(/^10\./, '127.');

function sliceFor(i: number, port: number, ips: string[], trigger: Date): Record<string, unknown> {
  const s = endpointSlice({ service: `svc-${i}`, ports: [{ name: 'http', port }], endpoints: ips.map((ip, k) => ({ ip, nodeName: `node${k % 3}` })) });
  (s.metadata as Record<string, unknown>).annotations = { 'endpoints.kubernetes.io/last-change-trigger-time': trigger.toISOString() };
  return s;
}

/** One connection: the backend's name, or undefined when the proxy could not serve it. */
function ask(host: string, port: number): Promise<string | undefined> {
  return new Promise((resolve) => {
    const s = connect({ host, port });
    let got = '';
    const timer = setTimeout(() => done(undefined), 2000);
    function done(v: string | undefined): void {
      clearTimeout(timer);
      s.destroy();
      resolve(v);
    }
    s.on('data', (d: Buffer) => {
      got += d.toString();
      const i = got.indexOf(':');
      if (i >= 0) done(got.slice(0, i));
    });
    s.on('error', () => done(undefined));
    s.on('close', () => done(got.includes(':') ? got.slice(0, got.indexOf(':')) : undefined));
  });
}

function stats(xs: number[]): { p50: number; p90: number; max: number; mean: number } {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q: number): number => s[Math.min(s.length - 1, Math.floor(q * s.length))] as number;
  const r = (v: number): number => Math.round(v * 100) / 100;
  return { p50: r(at(0.5)), p90: r(at(0.9)), max: r(s[s.length - 1] as number), mean: r(s.reduce((a, b) => a + b, 0) / s.length) };
}

async function main(): Promise<void> {
  const api = await FakeApiServer.start();
  const svcPort = await freePort(loopbackOf(clusterIP(PROBED)));
  const backendPort = await freePort('127.0.40.1');
  const backends = [];
  // The probed Service's endpoints are live: 127.0.40.1-10, and 127.0.40.11 to swap in.
  for (let k = 1; k <= ENDPOINTS + 1; k++) backends.push(await tcpEchoServer(`127.0.40.${k}`, `e${k}`, backendPort));
  const probedIPs = Array.from({ length: ENDPOINTS }, (_, k) => `127.0.40.${k + 1}`);
  const started = new Date();
  for (let i = 0; i < SERVICES; i++) {
    api.apply('services', service({ name: `svc-${i}`, clusterIP: clusterIP(i), ports: [{ name: 'http', port: svcPort }] }));
    // Other Services' endpoints are never dialed: addresses outside loopback that nothing uses.
    const ips = i === PROBED ? probedIPs : Array.from({ length: ENDPOINTS }, (_, k) => `10.${200 + k}.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`);
    api.apply('endpointslices', sliceFor(i, backendPort, ips, started));
  }

  const logger = silentLogger();
  const portal = new LoopbackPortal();
  const dialer = new DirectDialer();
  const units = new LocalUnitSet({
    logger,
    balancerFactory: roundRobinFactory,
    socketFactory: (unit, balancer, st) => new TcpProxySocket({ name: unit.id, balancer, dialer, logger, stats: st }),
    portAllocator: new PortAllocator(undefined, Math.random),
    clock: systemClock,
    random: Math.random,
    bindAddress: '127.0.0.1',
    sweepIntervalMs: 1000,
  });
  const proxier = new Proxier({ portal, units, logger, clock: systemClock, random: Math.random, node: { name: 'node0' }, minSyncPeriodMs: MIN_SYNC_MS, syncPeriodMs: SYNC_MS });
  const tracked: ProgrammedChange[] = [];
  const tracker = new ProgrammingLatencyTracker({ clock: systemClock, wallNow: Date.now, observe: (c) => tracked.push(c) });
  let syncWaiter: ((s: SyncSummary) => void) | undefined;
  let lastSyncEnd = performance.now();
  proxier.onSync((e) => {
    lastSyncEnd = performance.now();
    tracker.synced(e);
    syncWaiter?.(e.summary);
  });
  proxier.onChange((e) => {
    const c = e.change;
    if (c.kind === 'upsertEndpointSlice') tracker.upserted(c.object);
    else if (c.kind === 'deleteEndpointSlice') tracker.deleted(c.namespace, c.name);
    else if (c.kind === 'replaceEndpointSlices') tracker.replaced(c.objects);
  });
  const source = new ApiSource({ api: new HttpKubeApi(api.kubeConfig()), nodeName: 'node0', logger });
  const t0 = performance.now();
  await source.start(proxier.sink);
  await source.synced;
  const listed = performance.now();
  await proxier.setSynced();
  const firstSync = { listMs: Math.round(listed - t0), programMs: Math.round(performance.now() - listed), units: proxier.status().length };

  const host = loopbackOf(clusterIP(PROBED));
  const emittedToProgrammed: number[] = [];
  const emittedToConnection: number[] = [];
  const syncDurations: number[] = [];
  let ips = probedIPs;
  for (let n = 0; n < CHANGES; n++) {
    // Let the runner go idle: the next change is then applied at once (the steady case).
    while (performance.now() - lastSyncEnd < MIN_SYNC_MS + 100) await new Promise((r) => setTimeout(r, 50));
    const swapIn = ips.includes(`127.0.40.${ENDPOINTS + 1}`) ? `127.0.40.${ENDPOINTS}` : `127.0.40.${ENDPOINTS + 1}`;
    ips = [...ips.slice(0, ENDPOINTS - 1), swapIn];
    const want = `e${swapIn.split('.')[3]}`;
    const programmed = new Promise<SyncSummary>((resolve) => (syncWaiter = resolve));
    const emitted = performance.now();
    api.apply('endpointslices', sliceFor(PROBED, backendPort, ips, new Date()));
    let firstConn: number | undefined;
    const probe = (async () => {
      for (let tries = 0; tries < 5000 && firstConn === undefined; tries++) {
        if ((await ask(host, svcPort)) === want) firstConn = performance.now();
      }
    })();
    const summary = await programmed;
    const programmedAt = performance.now();
    await probe;
    syncWaiter = undefined;
    emittedToProgrammed.push(programmedAt - emitted);
    syncDurations.push(summary.durationMs);
    if (firstConn !== undefined) emittedToConnection.push(firstConn - emitted);
  }

  const result = {
    services: SERVICES,
    endpointsPerService: ENDPOINTS,
    changes: CHANGES,
    minSyncPeriodMs: MIN_SYNC_MS,
    firstSync,
    ms: {
      emittedToProgrammed: stats(emittedToProgrammed),
      arrivalToProgrammed: stats(tracked.filter((t) => t.service === `default/svc-${PROBED}`).map((t) => t.sinceArrivalSeconds * 1000)),
      emittedToFirstConnection: stats(emittedToConnection),
      syncDuration: stats(syncDurations),
    },
    node: process.version,
  };
  console.log(JSON.stringify(result, null, 2));
  try {
    mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
    writeFileSync(new URL('./results/programming-latency.json', import.meta.url), `${JSON.stringify(result, null, 2)}\n`);
  } catch {
    // Results are printed anyway.
  }

  await source.stop();
  await proxier.shutdown(100);
  await api.close();
  for (const b of backends) await b.close();
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
