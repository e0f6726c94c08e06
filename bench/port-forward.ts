#!/usr/bin/env node
/**
 * The port-forward dialer beside the direct dialer: connections per second, requests per second
 * and bulk throughput through the proxy CLI, which reaches the same nginx and iperf3 backends
 * either directly (`--state`, `--dialer direct`) or through tunnels to the fixture API server's
 * pods/portforward (`--kubeconfig`, `--dialer port-forward`), over the WebSocket tunnel and over
 * the SPDY upgrade (the fixture refusing WebSockets, as an API server before 1.30 does).
 *
 * The fixture (test/helpers/fake-port-forward.ts: the API server and the kubelet's end of the
 * tunnel) runs in this harness process, pinned with wrk, iperf3 and the backends to the load core;
 * the proxies run pinned to the proxy core, as in `npm run bench`. On a real cluster the API
 * server and the kubelet do that work on other machines, so:
 *  - `proxy CPU per op` is the proxy's own cost, the figure to compare;
 *  - rates are bounded by the load core, which here also carries the fixture (its CPU per op is
 *    shown beside, `fixture CPU per op`).
 * Runs are interleaved and rotated, and each figure is the median of the runs, as in run.ts.
 *
 * Run: npm run build && node dist/bench/port-forward.js [--runs N] [--duration S] [--warmup S]
 *      [--only http-keepalive,http-close,tcp-bulk,tcp-bulk-down] [--no-pin] [--out DIR]
 * Everything listens on loopback only; every process started is stopped by its PID.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startBackends } from './lib/backends.js';
import type { Context } from './lib/context.js';
import { parseOptions } from './lib/options.js';
import { BACKEND_HOST, SERVICES, type BenchService, type HostPort } from './lib/plan.js';
import { Processes, cpuSeconds, pinSelf, sleep, waitUntil, type Pinning, type Started } from './lib/proc.js';
import { benchState } from './lib/state-file.js';
import { median } from './lib/stats.js';
import { proxyStatus, spawnProxy } from './lib/systems.js';
import { findTools, missingLine } from './lib/tools.js';
import { LOAD_WORKLOAD_DEFS, type LoadWorkload } from './lib/workloads.js';
import { FakeApiServer } from '../test/helpers/fake-apiserver.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const PROXY_MAIN = fileURLToPath(new URL('../bundle/main.js', import.meta.url));
const DEFAULT_WORKLOADS = ['http-keepalive', 'http-close', 'tcp-bulk', 'tcp-bulk-down'];
const TCP_SERVICES: BenchService[] = ['http', 'iperf'];

interface PfSystem {
  id: string;
  label: string;
  host: string;
  started: Started;
  /** The fixture behind it, when it has one. */
  api?: FakeApiServer;
}

interface Row {
  system: string;
  workload: string;
  run: number;
  metrics: Record<string, number>;
  error?: string;
}

/** The bench Service as the API serves it: the backends' ports, one endpoint whose pod is bench-0. */
function applyBenchService(api: FakeApiServer, clusterIP: string): void {
  const ports = TCP_SERVICES.map((s) => ({ name: s, protocol: 'TCP', port: SERVICES[s].port, targetPort: SERVICES[s].port }));
  api.apply('services', {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: 'bench', namespace: 'bench' },
    spec: { type: 'ClusterIP', clusterIP, clusterIPs: [clusterIP], ports, selector: { app: 'bench' }, sessionAffinity: 'None', internalTrafficPolicy: 'Cluster' },
  });
  api.apply('endpointslices', {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: 'bench-abcde', namespace: 'bench', labels: { 'kubernetes.io/service-name': 'bench' } },
    addressType: 'IPv4',
    ports: ports.map((p) => ({ name: p.name, protocol: 'TCP', port: p.targetPort })),
    // 10.244.0.1 is never dialed: the dialer goes to pod bench-0 through the fixture.
    endpoints: [{ addresses: ['10.244.0.1'], conditions: { ready: true }, targetRef: { kind: 'Pod', namespace: 'bench', name: 'bench-0' } }],
  });
  api.portForward.addPod('bench', 'bench-0', Object.fromEntries(TCP_SERVICES.map((s) => [SERVICES[s].port, SERVICES[s].port])), BACKEND_HOST);
}

async function waitServing(started: Started, admin: HostPort): Promise<void> {
  await waitUntil(async () => {
    try {
      const st = await proxyStatus(admin);
      const tcp = st.services.filter((u) => u.reachable.length > 0);
      return tcp.length >= TCP_SERVICES.length && tcp.every((u) => u.errors.length === 0);
    } catch {
      return false;
    }
  }, `${started.name} to serve the bench Service`, 20_000, { everyMs: 50, process: started });
}

async function startPortForward(ctx: Context, id: string, label: string, clusterIP: string, host: string, adminPort: number, websockets: boolean): Promise<PfSystem> {
  const api = await FakeApiServer.start();
  api.portForward.websockets = websockets;
  applyBenchService(api, clusterIP);
  const dir = join(ctx.tmp, id);
  mkdirSync(dir, { recursive: true });
  const kubeconfig = join(dir, 'kubeconfig');
  writeFileSync(kubeconfig, api.kubeconfigYaml());
  const admin = { host: '127.0.0.1', port: adminPort };
  const args = [
    ...ctx.options.nodeArgs,
    ctx.proxyMain,
    '--kubeconfig', kubeconfig,
    '--dialer', 'port-forward',
    '--portal', 'loopback',
    '--hostname-override', 'bench-node',
    '--metrics-bind-address', `${admin.host}:${admin.port}`,
    '--healthz-bind-address', '127.0.0.1:0',
    '--shutdown-grace-period', '1s',
    ...ctx.options.proxyArgs,
  ];
  const started = ctx.procs.start(label, process.execPath, args, { cpu: ctx.pin.proxyCpus, logFile: join(dir, 'out.log') });
  await waitServing(started, admin);
  return { id, label, host, started, api };
}

async function startDirect(ctx: Context): Promise<PfSystem> {
  const dir = join(ctx.tmp, 'direct');
  mkdirSync(dir, { recursive: true });
  const stateFile = join(dir, 'state.json');
  writeFileSync(stateFile, benchState());
  const admin = { host: '127.0.0.1', port: 19251 };
  const started = spawnProxy(ctx, { name: 'proxy (direct dialer)', workers: 1, slug: 'pf-direct', stateFile, admin, extraArgs: ctx.options.proxyArgs, logFile: join(dir, 'out.log') });
  await waitServing(started, admin);
  return { id: 'direct', label: 'proxy, direct dialer', host: '127.77.0.1', started };
}

async function measure(ctx: Context, w: LoadWorkload, sys: PfSystem, durationS: number, run: number): Promise<Row> {
  const row: Row = { system: sys.id, workload: w.id, run, metrics: {} };
  const target = { host: sys.host, port: SERVICES[w.service].port };
  const proxy0 = cpuSeconds([sys.started.pid]);
  const self0 = process.cpuUsage();
  const t0 = performance.now();
  try {
    row.metrics = await w.run(ctx, target, durationS);
  } catch (err) {
    row.error = (err as Error).message;
    return row;
  }
  const wallS = (performance.now() - t0) / 1000;
  const proxyCpu = cpuSeconds([sys.started.pid]) - proxy0;
  const self = process.cpuUsage(self0);
  const fixtureCpu = (self.user + self.system) / 1e6;
  const ops = w.opsPerSecond(row.metrics) * durationS;
  row.metrics.cpuPct = (proxyCpu / wallS) * 100;
  if (ops > 0) {
    row.metrics.cpuPerOp = (proxyCpu / ops) * w.perOp.scale;
    if (sys.api) row.metrics.fixtureCpuPerOp = (fixtureCpu / ops) * w.perOp.scale;
  }
  return row;
}

function table(rows: Row[], workloads: LoadWorkload[], systems: PfSystem[]): string {
  const lines: string[] = [];
  const fmt = (v: number | undefined): string => (v === undefined || Number.isNaN(v) ? '-' : Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(Math.abs(v) >= 1 ? 2 : 3));
  for (const w of workloads) {
    const main = w.metrics[0] as { key: string; label: string; unit: string };
    lines.push(w.title);
    lines.push(`  ${'system'.padEnd(38)}${`${main.label} ${main.unit}`.padEnd(26)}${`proxy ${w.perOp.label} ${w.perOp.unit}`.padEnd(34)}fixture ${w.perOp.label} ${w.perOp.unit}`);
    const direct = new Map<string, number>();
    for (const s of systems) {
      const runs = rows.filter((r) => r.workload === w.id && r.system === s.id && r.error === undefined);
      const rate = median(runs.map((r) => r.metrics[main.key] ?? NaN));
      const cpu = median(runs.map((r) => r.metrics.cpuPerOp ?? NaN));
      const fixture = s.api ? median(runs.map((r) => r.metrics.fixtureCpuPerOp ?? NaN)) : undefined;
      if (s.id === 'direct') {
        direct.set('rate', rate);
        direct.set('cpu', cpu);
      }
      const vs = s.id === 'direct' ? '' : ` (${fmt(rate / (direct.get('rate') ?? NaN))}×)`;
      const cpuVs = s.id === 'direct' ? '' : ` (${fmt(cpu / (direct.get('cpu') ?? NaN))}×)`;
      const errors = rows.filter((r) => r.workload === w.id && r.system === s.id && r.error !== undefined).length;
      lines.push(`  ${s.label.padEnd(38)}${`${fmt(rate)}${vs}`.padEnd(26)}${`${fmt(cpu)}${cpuVs}`.padEnd(34)}${fmt(fixture)}${errors > 0 ? `  (${errors} runs failed)` : ''}`);
    }
  }
  return lines.join('\n');
}

async function main(argv: string[]): Promise<number> {
  const args = argv.some((a) => a === '--only' || a.startsWith('--only=')) ? argv : [...argv, '--only', DEFAULT_WORKLOADS.join(',')];
  const options = parseOptions(args, join(ROOT, 'bench', 'results'));
  const tools = await findTools();
  const taskset = options.pin ? tools.found.taskset : undefined;
  const pin: Pinning = { taskset, proxyCpus: options.proxyCpus, loadCpus: options.loadCpus };
  const procs = new Processes(pin);
  const tmp = mkdtempSync(join(tmpdir(), 'kube-userspace-proxy-pf-bench-'));
  const say = (line: string): void => console.log(line);
  const skip = (what: string, why: string): void => say(`skip: ${what}: ${why}`);
  const ctx: Context = { options, tools, pin, procs, tmp, profileDir: undefined, proxyMain: options.proxyMain ?? PROXY_MAIN, proxyNode: options.proxyNode ?? process.execPath, say, skip };
  const onSignal = (): void => {
    procs.killAllNow();
    rmSync(tmp, { recursive: true, force: true });
    process.exit(130);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  pinSelf(pin);
  const stamp = new Date().toISOString().replace(/\.\d+Z$/, 'Z').replace(/:/g, '-');
  const conditions = `${cpus().length} × ${cpus()[0]?.model ?? 'CPU'}; load average at start ${loadavg().map((v) => v.toFixed(2)).join(' ')}; ${taskset ? `proxies on core ${pin.proxyCpus}, fixture, backends and load on core ${pin.loadCpus}` : 'not pinned'}`;
  say(`port-forward bench ${stamp}: ${conditions}`);
  const workloads = LOAD_WORKLOAD_DEFS.filter((w) => (options.workloads as string[]).includes(w.id) && SERVICES[w.service].protocol === 'TCP');
  const rows: Row[] = [];
  const systems: PfSystem[] = [];
  try {
    const backends = await startBackends(ctx, new Set(workloads.map((w) => w.service)));
    systems.push(await startDirect(ctx));
    systems.push(await startPortForward(ctx, 'pf-websocket', 'proxy, port-forward over WebSocket', '10.77.0.2', '127.77.0.2', 19252, true));
    systems.push(await startPortForward(ctx, 'pf-spdy', 'proxy, port-forward over SPDY', '10.77.0.3', '127.77.0.3', 19253, false));
    const ready = workloads.filter((w) => {
      const missing = missingLine(tools, w.tools);
      if (missing) skip(w.title, missing);
      else if (!backends.up.has(w.service)) skip(w.title, `its backend (${w.service}) is not running`);
      return missing === undefined && backends.up.has(w.service);
    });
    if (options.warmupS > 0) {
      for (const w of ready) for (const s of systems) await measure(ctx, w, s, options.warmupS, 0);
    }
    for (let run = 1; run <= options.runs; run++) {
      for (const w of ready) {
        const order = [...systems.slice(run % systems.length), ...systems.slice(0, run % systems.length)];
        for (const s of order) {
          const row = await measure(ctx, w, s, options.durationS, run);
          rows.push(row);
          const main = w.metrics[0]?.key ?? '';
          say(`  [run ${run}/${options.runs}] ${w.id.padEnd(15)} ${s.id.padEnd(13)} ${row.error ?? `${main}=${(row.metrics[main] ?? NaN).toFixed(1)} cpuPerOp=${(row.metrics.cpuPerOp ?? NaN).toFixed(2)}`}`);
          // iperf3's server takes one test at a time: let the last one close.
          if (w.service === 'iperf') await sleep(300);
        }
      }
    }
    const out = table(rows, ready, systems);
    say(out);
    mkdirSync(options.outDir, { recursive: true });
    const base = join(options.outDir, `port-forward-${stamp}`);
    writeFileSync(`${base}.json`, `${JSON.stringify({ schema: 'kube-userspace-proxy-port-forward-bench/1', date: stamp, conditions, options, rows }, null, 2)}\n`);
    writeFileSync(`${base}.txt`, `port-forward bench ${stamp}\n${conditions}\n${out}\n`);
    say(`results: ${base}.json, ${base}.txt`);
  } finally {
    await procs.stopAll();
    for (const s of systems) await s.api?.close();
    rmSync(tmp, { recursive: true, force: true });
  }
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    console.error(`port-forward bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    process.exitCode = 1;
  },
);
