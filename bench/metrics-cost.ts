/**
 * What metrics cost per proxied connection: the in-place ServicePortStats counters the data path
 * bumps, against prom-client labelled metrics bumped per connection (the design not taken), and
 * what a scrape costs, where the counters are read.
 *
 *   npm run build && node dist/bench/metrics-cost.js [--connections N] [--units N]
 *
 * Per connection the TCP proxy does: accepted++, active++, dialAttempts++, one dial-latency
 * observation, active--, and two byte additions. Each variant below does the same bookkeeping.
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { ServicePortStats, DIAL_LATENCY_BUCKETS } from '../src/core/stats.js';
import type { ProxyUnit } from '../src/core/units.js';
import { ProxyMetrics, type LiveStatsSources } from '../src/io/http/metrics.js';
import { StatsLedger, type Series } from '../src/core/stats-ledger.js';
import { SERVICE_PORT_FAMILIES } from '../src/io/http/service-port-metrics.js';

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  const v = i >= 0 ? Number(process.argv[i + 1]) : NaN;
  return Number.isFinite(v) && v > 0 ? v : fallback;
}

const CONNECTIONS = arg('connections', 1_000_000);
const UNITS = arg('units', 1000);
const ROUNDS = 5;

/** Median ns per connection over ROUNDS runs of `n` connections (after one warm-up run). */
function measure(n: number, run: (n: number) => void): number {
  run(Math.min(n, 100_000));
  const samples: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.hrtime.bigint();
    run(n);
    samples.push(Number(process.hrtime.bigint() - t0) / n);
  }
  samples.sort((a, b) => a - b);
  return samples[Math.floor(samples.length / 2)] as number;
}

function heapPerConnection(n: number, run: (n: number) => void): number {
  run(1000);
  global.gc?.();
  const before = process.memoryUsage().heapUsed;
  run(n);
  const after = process.memoryUsage().heapUsed;
  return (after - before) / n;
}

// 1. What the data path does: plain fields on the unit's stats object.
const statsByUnit = Array.from({ length: 16 }, () => new ServicePortStats());
function inPlace(n: number): void {
  for (let i = 0; i < n; i++) {
    const s = statsByUnit[i & 15] as ServicePortStats;
    s.accepted++;
    s.active++;
    s.dialAttempts++;
    s.observeDialLatency(0.0004 + (i & 7) * 0.001);
    s.active--;
    s.bytesToClient += 512;
    s.bytesToEndpoint += 128;
  }
}

// 2. prom-client, labels prebuilt per unit (the best a per-connection prom-client design does).
const registry = new Registry();
const labelNames = ['service_port', 'protocol', 'scope'] as const;
const accepted = new Counter({ name: 'b_accepted_total', help: 'x', labelNames, registers: [registry] });
const active = new Gauge({ name: 'b_active', help: 'x', labelNames, registers: [registry] });
const attempts = new Counter({ name: 'b_attempts_total', help: 'x', labelNames, registers: [registry] });
const latency = new Histogram({ name: 'b_dial_seconds', help: 'x', labelNames, buckets: [...DIAL_LATENCY_BUCKETS], registers: [registry] });
const bytes = new Counter({ name: 'b_bytes_total', help: 'x', labelNames: [...labelNames, 'direction'], registers: [registry] });
const unitLabels = Array.from({ length: 16 }, (_, u) => ({ service_port: `default/svc-${u}:http`, protocol: 'TCP', scope: 'all' }));
const toClient = unitLabels.map((l) => ({ ...l, direction: 'to_client' }));
const toEndpoint = unitLabels.map((l) => ({ ...l, direction: 'to_endpoint' }));
function promPrebuilt(n: number): void {
  for (let i = 0; i < n; i++) {
    const u = i & 15;
    const l = unitLabels[u] as (typeof unitLabels)[number];
    accepted.inc(l);
    active.inc(l);
    attempts.inc(l);
    latency.observe(l, 0.0004 + (i & 7) * 0.001);
    active.dec(l);
    bytes.inc(toClient[u] as (typeof toClient)[number], 512);
    bytes.inc(toEndpoint[u] as (typeof toEndpoint)[number], 128);
  }
}

// 3. prom-client with the label set built per connection (formatting the service port name).
function promPerConnection(n: number): void {
  for (let i = 0; i < n; i++) {
    const u = i & 15;
    const l = { service_port: `default/svc-${u}:http`, protocol: 'TCP', scope: 'all' };
    accepted.inc(l);
    active.inc(l);
    attempts.inc(l);
    latency.observe(l, 0.0004 + (i & 7) * 0.001);
    active.dec(l);
    bytes.inc({ ...l, direction: 'to_client' }, 512);
    bytes.inc({ ...l, direction: 'to_endpoint' }, 128);
  }
}

// 4. A scrape with UNITS service ports: the ledger reads every unit, prom-client renders.
function fakeProxier(units: number): LiveStatsSources {
  const list = Array.from({ length: units }, (_, i) => {
    const unit = { id: `default/svc-${i}:http`, servicePort: `default/svc-${i}:http`, service: `default/svc-${i}`, protocol: i % 4 === 0 ? 'UDP' : 'TCP', scope: 'all', portals: [], endpoints: [], affinity: { type: 'None', timeoutSeconds: 10800 } } as ProxyUnit;
    const stats = new ServicePortStats();
    stats.accepted = i;
    return { unit, stats };
  });
  return { events: { onChange: () => () => {}, onSync: () => () => {} }, stats: () => list };
}

async function main(): Promise<void> {
  const fmt = (ns: number): string => `${ns.toFixed(1).padStart(8)} ns`;
  console.log(`per-connection bookkeeping (7 updates: accept, active +1/-1, dial attempt, dial latency, bytes x2), ${CONNECTIONS} connections, median of ${ROUNDS}`);
  const a = measure(CONNECTIONS, inPlace);
  const b = measure(CONNECTIONS, promPrebuilt);
  const c = measure(CONNECTIONS, promPerConnection);
  console.log(`  ServicePortStats in place (what the proxy does) ${fmt(a)} / connection`);
  console.log(`  prom-client, label sets prebuilt per unit       ${fmt(b)} / connection  (${(b / a).toFixed(0)}x)`);
  console.log(`  prom-client, label set built per connection     ${fmt(c)} / connection  (${(c / a).toFixed(0)}x)`);
  if (global.gc) {
    console.log('heap allocated per connection (needs --expose-gc)');
    console.log(`  ServicePortStats in place                       ${heapPerConnection(200_000, inPlace).toFixed(1).padStart(8)} bytes`);
    console.log(`  prom-client, label set built per connection     ${heapPerConnection(200_000, promPerConnection).toFixed(1).padStart(8)} bytes`);
  }

  console.log(`one scrape of ${UNITS} service ports (off the data path, but on its event loop), median of ${ROUNDS}`);
  const metrics = new ProxyMetrics(fakeProxier(UNITS), { processMetrics: false });
  const ours = await scrapeCost(() => metrics.render());
  console.log(`  ledger reading + one-pass render (what the proxy does) ${ours.ms.toFixed(1).padStart(7)} ms, ${(ours.bytes / 1024).toFixed(0)} KiB`);
  const viaCollect = promCollectRegistry(fakeProxier(UNITS));
  const theirs = await scrapeCost(() => viaCollect.metrics());
  console.log(`  the same series through prom-client collect() + inc()  ${theirs.ms.toFixed(1).padStart(7)} ms, ${(theirs.bytes / 1024).toFixed(0)} KiB`);
}

async function scrapeCost(render: () => Promise<string>): Promise<{ ms: number; bytes: number }> {
  await render();
  const samples: number[] = [];
  let bytes = 0;
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.hrtime.bigint();
    bytes = (await render()).length;
    samples.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  samples.sort((x, y) => x - y);
  return { ms: samples[Math.floor(ROUNDS / 2)] as number, bytes };
}

/** The design measured and not taken: one prom-client metric per family, filled by collect(). */
function promCollectRegistry(proxier: LiveStatsSources): Registry {
  const reg = new Registry();
  const ledger = new StatsLedger();
  let series: Series[] = [];
  const labelsOf = (x: Series): Record<string, string> => ({ service_port: x.labels.servicePort, protocol: x.labels.protocol, scope: x.labels.scope });
  SERVICE_PORT_FAMILIES.forEach((f, i) => {
    const extraNames = f.samples[0]?.[0] ? [f.samples[0][0].split('=')[0] as string] : [];
    const config = {
      name: f.name, help: f.help, labelNames: ['service_port', 'protocol', 'scope', ...extraNames], registers: [reg],
      collect(this: Counter | Gauge) {
        if (i === 0) series = ledger.read(proxier.stats().map(({ unit, stats }) => ({ labels: { servicePort: unit.servicePort, protocol: unit.protocol, scope: unit.scope }, stats }))).series;
        this.reset();
        for (const x of series) {
          if (f.only && x.labels.protocol !== f.only) continue;
          for (const [extra, read] of f.samples) {
            const labels = extra ? { ...labelsOf(x), [extra.split('=')[0] as string]: (extra.split('"')[1] as string) } : labelsOf(x);
            if (this instanceof Counter) this.inc(labels, read(x.totals));
            else this.set(labels, read(x.totals));
          }
        }
      },
    };
    if (f.type === 'counter') new Counter(config);
    else new Gauge(config);
  });
  return reg;
}

void main();
