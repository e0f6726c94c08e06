#!/usr/bin/env node
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, hostname, loadavg, release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startBackends } from './lib/backends.js';
import { renderChart } from './lib/chart.js';
import type { Context } from './lib/context.js';
import { flameGraph, summarizeProfile, type CpuProfile } from './lib/cpu-profile.js';
import { figuresOf, ratiosOf } from './lib/figures.js';
import { loadWorkloadInfo, runLoadWorkloads } from './lib/load-runner.js';
import { cpusOf, LOAD_WORKLOADS, parseOptions, USAGE, type Options } from './lib/options.js';
import { LANE, type BenchService, type SystemId } from './lib/plan.js';
import { Processes, pinSelf, type Pinning } from './lib/proc.js';
import { renderTable } from './lib/report.js';
import type { BenchResults, RunRecord, WorkloadInfo } from './lib/results.js';
import { apiChurn, apiChurnInfo, fileChurn, fileChurnInfo } from './lib/churn.js';
import { connBurst, connBurstInfo } from './lib/conn-burst.js';
import { endpointMove, endpointMoveInfo } from './lib/endpoint-move.js';
import { IPTABLES_SCALE_INFO, iptablesScaleSkipReason, iptablesScaleTrial } from './lib/iptables-scale.js';
import { idleConnections, SCALE_INFO, scaleStart } from './lib/scale.js';
import { startSystems } from './lib/systems.js';
import { judgeTargets } from './lib/targets.js';
import { findTools, has, missingLine, type Tools } from './lib/tools.js';
import { LOAD_WORKLOAD_DEFS } from './lib/workloads.js';

/**
 * `npm run bench`: the proxy side by side with a direct connection, HAProxy and nginx's stream
 * proxy, on loopback, in one run. See bench/README.md for what is measured and how.
 */

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const PROXY_MAIN = fileURLToPath(new URL('../bundle/main.js', import.meta.url));

function git(args: string[]): string {
  try {
    return execFileSync('git', args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return '';
  }
}

function meta(options: Options, tools: Tools, pin: Pinning, stamp: string): Record<string, unknown> {
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  const la = loadavg().map((v) => v.toFixed(2)).join(' ');
  const shared = cpusOf(pin.proxyCpus).some((c) => cpusOf(pin.loadCpus).includes(c));
  const workers = options.workers > 1 ? `; ${options.workers} workers per proxy` : '';
  const pinning = pin.taskset
    ? `proxies on core ${pin.proxyCpus}, backends and load on core ${pin.loadCpus}${shared ? ' (shared: a whole-machine comparison, not per core)' : ''}${workers}`
    : `not pinned${workers}`;
  const dirty = git(['status', '--porcelain']).split('\n').filter(Boolean).length;
  return {
    date: stamp,
    label: options.label,
    host: hostname(),
    kernel: release(),
    cpu,
    cores: cpus().length,
    node: process.version,
    // The runtime of the proxies under test, when --proxy-node chose another.
    ...(options.proxyNode ? { proxyNode: execFileSync(options.proxyNode, ['--version'], { encoding: 'utf8' }).trim() } : {}),
    commit: `${git(['rev-parse', '--short', 'HEAD']) || 'unknown'}${dirty > 0 ? ` (+${dirty} changed files)` : ''}`,
    loadAverageStart: la,
    lane: LANE,
    pinning,
    // --proxy-main: which build (or the floor relay) ran as the proxy, in the report's header line.
    conditions: `${cpus().length} × ${cpu}; load average at start ${la}; ${pinning}${options.proxyMain !== undefined ? `; proxy: ${options.proxyMain}` : ''}`,
    tools: tools.versions,
    options,
  };
}

function writeProfiles(ctx: Context): void {
  if (!ctx.profileDir || !existsSync(ctx.profileDir)) return;
  for (const f of readdirSync(ctx.profileDir).filter((n) => n.endsWith('.cpuprofile'))) {
    const profile = JSON.parse(readFileSync(join(ctx.profileDir, f), 'utf8')) as CpuProfile;
    const base = join(ctx.profileDir, f.replace(/\.cpuprofile$/, ''));
    writeFileSync(`${base}.svg`, flameGraph(profile, f));
    writeFileSync(`${base}.txt`, summarizeProfile(profile));
    ctx.say(`profile: ${base}.svg (flame graph), ${base}.txt (summary)`);
  }
}

async function measureAll(ctx: Context, record: (r: RunRecord) => void, infos: WorkloadInfo[]): Promise<void> {
  const { options } = ctx;
  const loadIds = new Set(options.workloads.filter((w) => (LOAD_WORKLOADS as readonly string[]).includes(w)));
  const loads = LOAD_WORKLOAD_DEFS.filter((w) => loadIds.has(w.id));
  const wants = (id: string): boolean => (options.workloads as string[]).includes(id);
  const services = new Set<BenchService>(loads.map((w) => w.service));
  if (['endpoint-move', 'file-churn', 'api-churn', 'conn-burst', 'idle-conns'].some(wants)) services.add('http');
  const backends = await startBackends(ctx, services);

  if (loads.length > 0) {
    ctx.say(`load workloads: ${loads.map((w) => w.id).join(', ')}; ${options.runs} runs of ${options.durationS}s each`);
    const systems = await startSystems(ctx, options.systems);
    try {
      const ran = await runLoadWorkloads(ctx, systems, backends, loads, record);
      infos.push(...ran.map(loadWorkloadInfo));
    } finally {
      for (const s of systems) await s.stop();
    }
  }
  if (!options.systems.includes('proxy')) return;
  if (wants('scale-start')) {
    ctx.say(`start-up at ${options.scalePorts.join(' and ')} Services × ${options.endpoints} endpoints, ${options.formats.join(' and ')}`);
    for (const n of options.scalePorts) for (const f of options.formats) infos.push(SCALE_INFO.start(n, options.endpoints, f));
    for (let run = 1; run <= options.runs; run++) {
      for (const n of options.scalePorts) {
        for (const f of options.formats) {
          const r = await scaleStart(ctx, n, options.endpoints, f, run);
          record(r);
          ctx.say(`  [run ${run}/${options.runs}] ${r.workload} ${r.error ?? Object.entries(r.metrics).map(([k, v]) => `${k}=${v.toFixed(1)}`).join(' ')}`);
        }
      }
    }
  }
  const probed = wants('endpoint-move') || wants('file-churn') || wants('api-churn');
  if (probed && !backends.up.has('http')) ctx.skip('endpoint moves and churn', 'the nginx HTTP backend is not running');
  const n = options.movePorts;
  const e = options.endpoints;
  if (wants('endpoint-move') && backends.up.has('http')) {
    ctx.say(`endpoint move with ${n} Services × ${e} endpoints: ${options.moveTrials} trials per formatting (${options.formats.join(', ')}) and write (${options.writes.join(', ')})`);
    for (const formatting of options.formats) {
      for (const write of options.writes) {
        infos.push(endpointMoveInfo(n, e, formatting, write));
        await endpointMove(ctx, { services: n, endpoints: e, formatting, write, trials: options.moveTrials, gapMs: options.inPlaceGapMs }, record);
      }
    }
  }
  const churn = { services: n, endpoints: e, seconds: options.churnSeconds, rate: options.churnRate, writesPerSecond: options.churnWrites, afterSeconds: options.churnAfter };
  if (wants('file-churn') && backends.up.has('http')) {
    for (const formatting of options.formats) {
      infos.push(fileChurnInfo(churn, formatting));
      for (let run = 1; run <= options.churnRuns; run++) {
        ctx.say(`file churn [run ${run}/${options.churnRuns}]: ${churn.rate} Services/s for ${churn.seconds} s, ${churn.writesPerSecond} rewrites/s, ${formatting}`);
        const r = await fileChurn(ctx, churn, formatting, run);
        record(r);
        if (r.error) ctx.say(`  FAILED: ${r.error}`);
      }
    }
  }
  if (wants('api-churn') && backends.up.has('http')) {
    infos.push(apiChurnInfo(churn));
    for (let run = 1; run <= options.churnRuns; run++) {
      ctx.say(`API churn [run ${run}/${options.churnRuns}]: ${churn.rate} Services/s for ${churn.seconds} s, through the fake API server`);
      const r = await apiChurn(ctx, churn, run);
      record(r);
      if (r.error) ctx.say(`  FAILED: ${r.error}`);
    }
  }
  if (wants('conn-burst')) {
    if (!backends.up.has('http')) ctx.skip('connection burst', 'the nginx HTTP backend is not running');
    else {
      ctx.say(`connection burst: ${options.runs} bursts of ${options.burst}`);
      infos.push(connBurstInfo(options.burst));
      await connBurst(ctx, options.burst, options.runs, record);
    }
  }
  if (wants('idle-conns')) {
    if (!backends.up.has('http')) ctx.skip('idle connections', 'the nginx HTTP backend is not running');
    else {
      const able: SystemId[] = ['proxy'];
      if (options.systems.includes('nginx') && has(ctx.tools, 'nginx', 'nginx-stream')) able.push('nginx');
      if (options.systems.includes('haproxy') && has(ctx.tools, 'haproxy')) able.push('haproxy');
      ctx.say(`idle connections: ${options.idleConns} through ${able.join(', ')}`);
      infos.push(SCALE_INFO.idle(options.idleConns));
      for (let run = 1; run <= options.runs; run++) {
        for (const s of able) {
          const r = await idleConnections(ctx, s, options.idleConns, run);
          record(r);
          ctx.say(`  [run ${run}/${options.runs}] idle-conns@${options.idleConns} ${s.padEnd(8)} ${Object.entries(r.metrics).map(([k, v]) => `${k}=${v.toFixed(1)}`).join(' ')}${r.error ? ` (${r.error})` : ''}`);
        }
      }
    }
  }
  if (wants('iptables-scale')) {
    const why = iptablesScaleSkipReason();
    if (why) ctx.skip('iptables-scale', why);
    else {
      ctx.say(`iptables portal at ${options.iptablesServices.join(', ')} Services (${options.iptablesKinds.join(', ')}), in a namespace`);
      for (const kind of options.iptablesKinds) infos.push(...options.iptablesServices.map((n) => IPTABLES_SCALE_INFO(kind, n)));
      // Interleaved: each run visits every kind and size, so a busy spell of the machine is spread over all.
      for (let run = 1; run <= options.runs; run++) {
        for (const kind of options.iptablesKinds) {
          for (const n of options.iptablesServices) {
            const r = await iptablesScaleTrial(ctx, kind, n, run);
            record(r);
            ctx.say(`  [run ${run}/${options.runs}] ${r.workload} ${r.error ?? Object.entries(r.metrics).map(([k, v]) => `${k}=${v.toFixed(k.includes('P') ? 3 : 0)}`).join(' ')}`);
          }
        }
      }
    }
  }
}

/** Re-render saved results (after a change to the table or the chart): nothing is measured. */
function render(file: string): number {
  let results: BenchResults;
  try {
    results = JSON.parse(readFileSync(file, 'utf8')) as BenchResults;
  } catch (err) {
    console.error(`bench: cannot read ${file}: ${(err as Error).message}`);
    return 2;
  }
  if (results.schema !== 'kube-userspace-proxy-bench/1') {
    console.error(`bench: ${file} is not a results file of this harness`);
    return 2;
  }
  const table = renderTable(results);
  const base = file.replace(/\.json$/, '');
  writeFileSync(`${base}.svg`, renderChart(results));
  writeFileSync(`${base}.txt`, `kube-userspace-proxy bench ${String(results.meta.date)}\n${String(results.meta.conditions)}\n${table}`);
  console.log(table);
  console.log(`rewrote ${base}.svg and ${base}.txt`);
  return 0;
}

async function main(argv: string[]): Promise<number> {
  let options: Options;
  try {
    options = parseOptions(argv, join(ROOT, 'bench', 'results'));
  } catch (err) {
    console.error(`bench: ${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (options.help) {
    console.log(USAGE);
    return 0;
  }
  if (options.render) return render(options.render);
  const skipped: BenchResults['skipped'] = [];
  const say = (line: string): void => console.log(line);
  const skip = (what: string, why: string): void => {
    skipped.push({ what, why });
    say(`skip: ${what}: ${why}`);
  };
  const tools = await findTools();
  let taskset = options.pin ? tools.found.taskset : undefined;
  if (options.pin && !taskset) skip('pinning to cores', missingLine(tools, ['taskset']) ?? '');
  if (taskset && Math.max(...cpusOf(options.proxyCpus), ...cpusOf(options.loadCpus)) >= cpus().length) {
    skip('pinning to cores', `needs cores ${options.proxyCpus} and ${options.loadCpus}; this machine has ${cpus().length}`);
    taskset = undefined;
  }
  const pin: Pinning = { taskset, proxyCpus: options.proxyCpus, loadCpus: options.loadCpus };
  const proxyMain = options.proxyMain ?? PROXY_MAIN;
  if (!existsSync(proxyMain)) {
    console.error(`bench: the proxy is not built (${proxyMain}); run npm run build`);
    return 2;
  }
  const stamp = new Date().toISOString().replace(/\.\d+Z$/, 'Z').replace(/:/g, '-');
  mkdirSync(options.outDir, { recursive: true });
  const profileDir = options.profile ? join(options.outDir, `profiles-${stamp}`) : undefined;
  if (profileDir) mkdirSync(profileDir, { recursive: true });
  const procs = new Processes(pin);
  const tmp = mkdtempSync(join(tmpdir(), 'kube-userspace-proxy-bench-'));
  const proxyNode = options.proxyNode ?? process.execPath;
  const ctx: Context = { options, tools, pin, procs, tmp, profileDir, proxyMain, proxyNode, say, skip };
  const onSignal = (signal: NodeJS.Signals): void => {
    say(`\n${signal}: stopping what the harness started`);
    procs.killAllNow();
    if (!options.keepTemp) rmSync(tmp, { recursive: true, force: true });
    process.exit(130);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  pinSelf(pin);
  const info = meta(options, tools, pin, stamp);
  say(`kube-userspace-proxy bench ${stamp}: ${info.conditions as string}`);

  const runs: RunRecord[] = [];
  const workloads: WorkloadInfo[] = [];
  try {
    await measureAll(ctx, (r) => runs.push(r), workloads);
  } finally {
    await procs.stopAll();
  }
  info.loadAverageEnd = loadavg().map((v) => v.toFixed(2)).join(' ');
  const figures = figuresOf(runs, workloads);
  const results: BenchResults = {
    schema: 'kube-userspace-proxy-bench/1',
    meta: info,
    skipped,
    workloads,
    runs,
    figures,
    ratios: ratiosOf(figures),
    targets: judgeTargets(figures),
  };
  const table = renderTable(results);
  const base = join(options.outDir, `bench-${stamp}`);
  writeFileSync(`${base}.json`, `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(`${base}.svg`, renderChart(results));
  writeFileSync(`${base}.txt`, `kube-userspace-proxy bench ${stamp}\n${info.conditions as string}\n${table}`);
  writeFileSync(join(options.outDir, 'latest.json'), `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(join(options.outDir, 'latest.svg'), renderChart(results));
  say(table);
  writeProfiles(ctx);
  say(`results: ${base}.json, ${base}.svg, ${base}.txt (also latest.json, latest.svg)`);
  if (!options.keepTemp) rmSync(tmp, { recursive: true, force: true });
  else say(`temp directory kept: ${tmp}`);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    console.error(`bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    process.exitCode = 1;
  },
);
