import { availableParallelism } from 'node:os';
import { parseArgs } from 'node:util';
import { PROXY_PROTOCOL_ANNOTATION } from '../../src/core/annotations.js';
import type { WriteMode } from './endpoint-move.js';
import { SYSTEM_IDS, type SystemId } from './plan.js';
import type { Formatting } from './state-file.js';

export const LOAD_WORKLOADS = ['tcp-bulk', 'tcp-bulk-down', 'http-keepalive', 'http-close', 'udp-pingpong', 'dns'] as const;
export const SCALE_WORKLOADS = ['scale-start', 'endpoint-move', 'file-churn', 'api-churn', 'conn-burst', 'idle-conns', 'iptables-scale'] as const;
const FORMATTINGS: readonly Formatting[] = ['pretty', 'compact'];
const WRITE_MODES: readonly WriteMode[] = ['rename', 'in-place'];
/** What the iptables-scale workload installs: ClusterIP Services, or NodePort ones (a ClusterIP and a node port each). */
export const IPTABLES_KINDS = ['clusterip', 'nodeport'] as const;
export type IptablesKind = (typeof IPTABLES_KINDS)[number];
export type LoadWorkloadId = (typeof LOAD_WORKLOADS)[number];
export type ScaleWorkloadId = (typeof SCALE_WORKLOADS)[number];
export type WorkloadId = LoadWorkloadId | ScaleWorkloadId;
const ALL: readonly WorkloadId[] = [...LOAD_WORKLOADS, ...SCALE_WORKLOADS];

export interface Options {
  runs: number;
  /** Seconds per measured run of a load workload (whole seconds: iperf3 and wrk count in seconds). */
  durationS: number;
  /** Seconds of unrecorded warm-up per system and workload before the first run (0: none). */
  warmupS: number;
  workloads: WorkloadId[];
  systems: SystemId[];
  /** Service counts for the start-up run. */
  scalePorts: number[];
  /** Endpoints per Service in the scale runs (the probe Service has one). */
  endpoints: number;
  /** How the state files are written: as kubectl prints them, or on one line. */
  formats: Formatting[];
  /** Services loaded during the endpoint move and the churn runs. */
  movePorts: number;
  /** Endpoint moves timed per formatting and write mode. */
  moveTrials: number;
  /** How a state file is written for a move: renamed over the old one, or in place. */
  writes: WriteMode[];
  /** In-place writes: how long the file stays empty before it is written (kubectl's round trip). */
  inPlaceGapMs: number;
  churnSeconds: number;
  /** Services whose endpoints change per second during a churn run. */
  churnRate: number;
  /** State-file writes (API: batches of events) per second during a churn run. */
  churnWrites: number;
  /** Seconds RSS is watched after a churn run stops. */
  churnAfter: number;
  churnRuns: number;
  /** Connections per burst. */
  burst: number;
  idleConns: number;
  /** Services installed by the iptables-scale workload before it adds one more. */
  iptablesServices: number[];
  iptablesKinds: IptablesKind[];
  outDir: string;
  pin: boolean;
  /** Cores for the proxies and for the rest, in taskset's list syntax (`0`, `0,1`, `2-3`). */
  proxyCpus: string;
  loadCpus: string;
  /** Worker processes (the proxy's --workers, nginx's worker_processes) or threads (HAProxy's nbthread) per proxy. */
  workers: number;
  keepTemp: boolean;
  /** Run the proxy under --cpu-prof and write a flame graph and a summary per run. */
  profile: boolean;
  /** Flags for the proxy CLI after the harness's own (--proxy-arg=--workers=2). */
  proxyArgs: string[];
  /** Annotations on the benchmark Service, NAME=VALUE (--service-annotation=kube-userspace-proxy.io/load-balancer=least-connections). */
  serviceAnnotations: string[];
  /**
   * The benchmark Service asks for PROXY protocol v2 (--service-annotation=kube-userspace-proxy.io/proxy-protocol=v2):
   * the HTTP backend then expects a header, and nginx stream and HAProxy send one too.
   */
  proxyProtocol: boolean;
  /** Flags for node before the proxy's script (--node-arg=--max-semi-space-size=16). */
  nodeArgs: string[];
  /** Environment for the proxy process, NAME=VALUE (--proxy-env=MALLOC_TRIM_THRESHOLD_=268435456). */
  proxyEnv: string[];
  /** The proxy CLI to run instead of this build's dist/bundle/main.js (to compare builds). */
  proxyMain: string | undefined;
  /** The node binary that runs the proxy (default: the one running the harness), to compare runtimes. */
  proxyNode: string | undefined;
  /** A label stored with the results (what was changed, the conditions). */
  label: string;
  /** Measure nothing: print the table of this results JSON and rewrite its chart beside it. */
  render: string | undefined;
  help: boolean;
}

export const USAGE = `usage: node dist/bench/run.js [options]   (npm run bench)

  --runs N              measured runs per figure; the figure is their median (default 5)
  --duration S          seconds per run of a load workload (default 5)
  --warmup S            unrecorded warm-up per system and workload (default 1; 0 for none)
  --only LIST           workloads: ${ALL.join(',')}
  --systems LIST        systems: ${SYSTEM_IDS.join(',')} (default all)
  --scale LIST          Services for the start-up runs (default 10000,30000)
  --endpoints N         endpoints per Service in the scale runs (default 10)
  --formats LIST        state files pretty-printed as kubectl prints them, or compact on one line
                        (default pretty,compact)
  --move-ports N        Services loaded during the endpoint moves and the churn runs (default 10000)
  --move-trials N       endpoint moves timed per formatting and write mode (default 20)
  --writes LIST         how a move's file is written: rename (write a temp file, rename it over)
                        and/or in-place (emptied, then written, as a shell redirect does) (default both)
  --in-place-gap MS     in-place writes: how long the file stays empty first (default 150)
  --churn-seconds S     length of a churn run (default 60)
  --churn-rate N        Services whose endpoints change per second (default 100)
  --churn-writes N      file rewrites (API: batches of events) per second (default 10)
  --churn-after S       seconds RSS is watched after the churn stops (default 10)
  --churn-runs N        churn runs per source and formatting (default 1)
  --burst N             connections per burst (default 1000); --runs bursts
  --idle-conns N        idle proxied connections held open (default 9000)
  --iptables-scale LIST Services the iptables portal holds in the iptables-scale workload, before
                        it adds one (default 0,1000,10000; needs root and iptables)
  --iptables-kinds LIST what those Services are: ${IPTABLES_KINDS.join(',')} (default both)
  --out DIR             where the JSON and SVG go (default bench/results)
  --proxy-cpu LIST      core(s) for the proxies, taskset syntax (default 0; with --workers N, every core)
  --load-cpu LIST       core(s) for backends, load generators and the harness (default 1; with
                        --workers N, every core)
  --workers N           the cores dimension: the proxy with --workers N, nginx with N worker
                        processes, HAProxy with N threads, all on every core unless pinned otherwise
                        (default 1: one worker each, pinned apart: the per-core figures; scale runs use 1)
  --no-pin              do not pin anything with taskset
  --profile             run the proxy under --cpu-prof; write flame graphs beside the results
  --proxy-arg=FLAG      pass FLAG to the proxy CLI (repeatable), e.g. --proxy-arg=--log-level=warn
  --service-annotation=NAME=VALUE
                        annotate the benchmark Service (repeatable), e.g.
                        --service-annotation=kube-userspace-proxy.io/load-balancer=least-connections;
                        with kube-userspace-proxy.io/proxy-protocol=v2 the HTTP backend expects a
                        PROXY header and nginx stream and HAProxy send one too (HTTP workloads only)
  --node-arg=FLAG       pass FLAG to node before the proxy's script (repeatable)
  --proxy-env=NAME=VAL  set an environment variable for the proxy process (repeatable)
  --proxy-main FILE     run this build of the proxy CLI instead (compare before/after a change)
  --proxy-node FILE     run the proxy with this node binary (compare runtimes; default: the harness's)
  --label TEXT          stored with the results
  --render FILE.json    measure nothing: print the table of saved results, rewrite their .svg and .txt
  --keep-temp           keep the temp directory (configs, logs, state files)
`;

function int(name: string, v: string | undefined, dflt: number, min: number): number {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new Error(`--${name}: "${v}" is not a whole number >= ${min}`);
  return n;
}

function cpuList(name: string, v: string): string {
  if (!/^\d+(-\d+)?(,\d+(-\d+)?)*$/.test(v)) throw new Error(`--${name}: "${v}" is not a CPU list (0, 0,1, 2-3)`);
  return v;
}

/** The cores of a taskset list. */
export function cpusOf(list: string): number[] {
  const out: number[] = [];
  for (const part of list.split(',')) {
    const [a, b] = part.split('-').map(Number) as [number, number | undefined];
    for (let c = a; c <= (b ?? a); c++) out.push(c);
  }
  return out;
}

function list<T extends string>(name: string, v: string | undefined, allowed: readonly T[], dflt: readonly T[]): T[] {
  if (v === undefined) return [...dflt];
  const items = v.split(',').map((s) => s.trim()).filter(Boolean);
  for (const i of items) if (!(allowed as readonly string[]).includes(i)) throw new Error(`--${name}: "${i}" is not one of ${allowed.join(', ')}`);
  return items as T[];
}

/** Harness flags -> options. Throws Error with a one-line message on a bad flag. */
export function parseOptions(argv: readonly string[], defaultOutDir: string): Options {
  const { values } = parseArgs({
    args: [...argv],
    options: {
      runs: { type: 'string' },
      duration: { type: 'string' },
      warmup: { type: 'string' },
      only: { type: 'string' },
      systems: { type: 'string' },
      scale: { type: 'string' },
      endpoints: { type: 'string' },
      formats: { type: 'string' },
      'move-ports': { type: 'string' },
      'move-trials': { type: 'string' },
      writes: { type: 'string' },
      'in-place-gap': { type: 'string' },
      'churn-seconds': { type: 'string' },
      'churn-rate': { type: 'string' },
      'churn-writes': { type: 'string' },
      'churn-after': { type: 'string' },
      'churn-runs': { type: 'string' },
      burst: { type: 'string' },
      'idle-conns': { type: 'string' },
      'iptables-scale': { type: 'string' },
      'iptables-kinds': { type: 'string' },
      out: { type: 'string' },
      'proxy-cpu': { type: 'string' },
      'load-cpu': { type: 'string' },
      workers: { type: 'string' },
      'no-pin': { type: 'boolean' },
      profile: { type: 'boolean' },
      'proxy-arg': { type: 'string', multiple: true },
      'service-annotation': { type: 'string', multiple: true },
      'node-arg': { type: 'string', multiple: true },
      'proxy-env': { type: 'string', multiple: true },
      'proxy-main': { type: 'string' },
      'proxy-node': { type: 'string' },
      label: { type: 'string' },
      render: { type: 'string' },
      'keep-temp': { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  const scalePorts = (values.scale ?? '10000,30000').split(',').map((s) => int('scale', s.trim(), 0, 1));
  const workers = int('workers', values.workers, 1, 1);
  // The cores dimension: every system with N workers, all of them (and the load) on every core.
  const manyWorkers = workers > 1;
  const allCores = `0-${availableParallelism() - 1}`;
  const o: Options = {
    runs: int('runs', values.runs, 5, 1),
    durationS: int('duration', values.duration, 5, 1),
    warmupS: int('warmup', values.warmup, 1, 0),
    workloads: list('only', values.only, ALL, ALL),
    systems: list('systems', values.systems, SYSTEM_IDS, SYSTEM_IDS),
    scalePorts,
    endpoints: int('endpoints', values.endpoints, 10, 1),
    formats: list('formats', values.formats, FORMATTINGS, FORMATTINGS),
    movePorts: int('move-ports', values['move-ports'], 10_000, 1),
    moveTrials: int('move-trials', values['move-trials'], 20, 1),
    writes: list('writes', values.writes, WRITE_MODES, WRITE_MODES),
    inPlaceGapMs: int('in-place-gap', values['in-place-gap'], 150, 0),
    churnSeconds: int('churn-seconds', values['churn-seconds'], 60, 1),
    churnRate: int('churn-rate', values['churn-rate'], 100, 1),
    churnWrites: int('churn-writes', values['churn-writes'], 10, 1),
    churnAfter: int('churn-after', values['churn-after'], 10, 0),
    churnRuns: int('churn-runs', values['churn-runs'], 1, 1),
    burst: int('burst', values.burst, 1000, 1),
    idleConns: int('idle-conns', values['idle-conns'], 9000, 1),
    iptablesServices: (values['iptables-scale'] ?? '0,1000,10000').split(',').map((s) => int('iptables-scale', s.trim(), 0, 0)),
    iptablesKinds: list('iptables-kinds', values['iptables-kinds'], IPTABLES_KINDS, IPTABLES_KINDS),
    outDir: values.out ?? defaultOutDir,
    pin: !values['no-pin'],
    proxyCpus: cpuList('proxy-cpu', values['proxy-cpu'] ?? (manyWorkers ? allCores : '0')),
    loadCpus: cpuList('load-cpu', values['load-cpu'] ?? (manyWorkers ? allCores : '1')),
    workers,
    keepTemp: values['keep-temp'] ?? false,
    profile: values.profile ?? false,
    proxyArgs: values['proxy-arg'] ?? [],
    serviceAnnotations: values['service-annotation'] ?? [],
    proxyProtocol: (values['service-annotation'] ?? []).some((a) => a.startsWith(`${PROXY_PROTOCOL_ANNOTATION}=`)),
    nodeArgs: values['node-arg'] ?? [],
    proxyEnv: values['proxy-env'] ?? [],
    proxyMain: values['proxy-main'],
    proxyNode: values['proxy-node'],
    label: values.label ?? '',
    render: values.render,
    help: values.help ?? false,
  };
  if (Math.max(...o.scalePorts, o.movePorts) > 254 * 254) throw new Error(`--scale/--move-ports: at most ${254 * 254} Services`);
  if (o.endpoints > 250) throw new Error('--endpoints: at most 250');
  if (Math.min(...o.scalePorts, o.movePorts) < 2) throw new Error('--scale/--move-ports: at least 2 Services (Service 0 is the probe)');
  if (Math.max(...o.iptablesServices) > 20_000) throw new Error('--iptables-scale: at most 20000 Services');
  for (const a of o.serviceAnnotations) if (!/^[^=]+=/.test(a)) throw new Error(`--service-annotation: "${a}" is not NAME=VALUE`);
  if (o.proxyProtocol) {
    // Only the HTTP backend reads the header: iperf3, sockperf and dnsmasq would take it for data,
    // and the direct system, which reaches the backend without a proxy, would send none.
    const others = [...o.workloads.filter((w) => w !== 'http-close' && w !== 'http-keepalive'), ...o.systems.filter((s) => s === 'direct')];
    if (others.length > 0) throw new Error(`--service-annotation=${PROXY_PROTOCOL_ANNOTATION}=...: the HTTP workloads only, and not the direct system (--only http-close,http-keepalive --systems proxy,nginx,haproxy); not: ${others.join(', ')}`);
  }
  for (const e of o.proxyEnv) if (!/^[A-Za-z_][A-Za-z0-9_]*=/.test(e)) throw new Error(`--proxy-env: "${e}" is not NAME=VALUE`);
  const shared = cpusOf(o.proxyCpus).filter((c) => cpusOf(o.loadCpus).includes(c));
  if (o.pin && o.workers === 1 && shared.length > 0) throw new Error('--proxy-cpu and --load-cpu must not share a core (or give --no-pin, or --workers N to measure the whole machine)');
  return o;
}
