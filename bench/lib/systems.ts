import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { isRoot } from './backends.js';
import { haproxyConf, nginxStreamConf } from './configs.js';
import type { Context } from './context.js';
import { BACKEND_HOST, HAPROXY_HOST, NGINX_STREAM_HOST, PROXY_ADMIN, PROXY_HOST, SERVICES, systemLabel, type BenchService, type HostPort, type SystemId } from './plan.js';
import { inUse, isBound, waitUntil, type Started } from './proc.js';
import { benchState } from './state-file.js';
import { has, missingLine, path } from './tools.js';

export interface System {
  readonly id: SystemId;
  readonly protocols: ReadonlySet<'TCP' | 'UDP'>;
  target(service: BenchService): HostPort;
  /** The processes whose CPU time and memory count as this system's (empty for direct). */
  readonly pids: readonly number[];
  stop(): Promise<void>;
}

/** Throws when something already listens where this system is to listen. */
function ensureFree(host: string, services: readonly BenchService[], extra: HostPort[] = []): void {
  const busy = inUse([
    ...services.map((s) => ({ proto: SERVICES[s].protocol === 'TCP' ? ('tcp' as const) : ('udp' as const), host, port: SERVICES[s].port })),
    ...extra.map((a) => ({ proto: 'tcp' as const, host: a.host, port: a.port })),
  ]);
  if (busy) throw new Error(busy);
}

function servicesOver(protocols: ReadonlySet<'TCP' | 'UDP'>): BenchService[] {
  return (Object.keys(SERVICES) as BenchService[]).filter((s) => protocols.has(SERVICES[s].protocol));
}

function fromProcess(id: SystemId, host: string, protocols: ReadonlySet<'TCP' | 'UDP'>, started: Started | undefined): System {
  return {
    id,
    protocols,
    target: (service) => ({ host, port: SERVICES[service].port }),
    pids: started ? [started.pid] : [],
    stop: async () => started?.stop(),
  };
}

async function waitBound(started: Started, host: string, services: readonly BenchService[]): Promise<void> {
  for (const s of services) {
    const { port, protocol } = SERVICES[s];
    await waitUntil(() => isBound(protocol === 'TCP' ? 'tcp' : 'udp', host, port), `${started.name} on ${host}:${port}/${protocol}`, 10_000, { process: started });
  }
}

export interface ProxyStart {
  name: string;
  /** `--workers`: worker processes serving the data path (1: the CLI's own process). */
  workers: number;
  /** File-name-safe name, for its CPU profile under --profile. */
  slug: string;
  /** The state file to serve, or (kubeconfig) the API server to watch. */
  stateFile?: string;
  kubeconfig?: string;
  admin: HostPort;
  /** Flags added after the harness's own (--proxy-arg, for example --log-level=warn). */
  extraArgs: readonly string[];
  logFile: string;
  /** Run the proxy with this open-file limit (soft and hard), through prlimit. */
  nofile?: number;
}

/** The proxy CLI as a user runs it: `--portal loopback` and a state file, pinned to the proxy core. */
export function spawnProxy(ctx: Context, s: ProxyStart): Started {
  // With workers every process writes a profile: node's default names keep them apart.
  const profileName = s.workers > 1 ? [] : [`--cpu-prof-name=${s.slug}.cpuprofile`];
  const profile = ctx.profileDir ? ['--cpu-prof', `--cpu-prof-dir=${ctx.profileDir}`, ...profileName] : [];
  const args = [
    ...profile,
    ...ctx.options.nodeArgs,
    ctx.proxyMain,
    ...(s.kubeconfig !== undefined ? ['--kubeconfig', s.kubeconfig] : ['--state', s.stateFile ?? '']),
    '--portal', 'loopback',
    // The proxy's own worker processes (they inherit the node flags given here, and the pinning).
    // Left out for one: the loopback portal's default, and builds from before --workers take it.
    ...(s.workers === 1 ? [] : ['--workers', String(s.workers)]),
    '--metrics-bind-address', `${s.admin.host}:${s.admin.port}`,
    // The health server's default (0.0.0.0:10256) would collide between proxies; any port will do.
    '--healthz-bind-address', '127.0.0.1:0',
    '--iptables-min-sync-period', '1s',
    // Nothing is left running when the harness stops a proxy; a long grace would only delay it.
    '--shutdown-grace-period', '1s',
    ...s.extraArgs,
  ];
  const env = { ...process.env };
  // The floor relay's test-only address override must not move a bench's relay off its addresses.
  delete env.FLOOR_RELAY_HOSTS;
  for (const e of ctx.options.proxyEnv) {
    const at = e.indexOf('=');
    env[e.slice(0, at)] = e.slice(at + 1);
  }
  // prlimit sets the limit and execs node: the PID stays the proxy's own, as with taskset.
  if (s.nofile !== undefined) return ctx.procs.start(s.name, path(ctx.tools, 'prlimit'), [`--nofile=${s.nofile}:${s.nofile}`, '--', ctx.proxyNode, ...args], { cpu: ctx.pin.proxyCpus, logFile: s.logFile, env });
  return ctx.procs.start(s.name, ctx.proxyNode, args, { cpu: ctx.pin.proxyCpus, logFile: s.logFile, env });
}

interface ServicesStatus {
  services: Array<{ name: string; reachable: string[]; errors: string[] }>;
}

/** GET /services from the proxy's admin server. */
export async function proxyStatus(admin: HostPort): Promise<ServicesStatus> {
  const res = await fetch(`http://${admin.host}:${admin.port}/services`, { signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new Error(`GET /services: HTTP ${res.status}`);
  return (await res.json()) as ServicesStatus;
}

let proxyStarts = 0;

async function startProxySystem(ctx: Context, services: readonly BenchService[]): Promise<System> {
  ensureFree(PROXY_HOST, services, [PROXY_ADMIN]);
  const dir = join(ctx.tmp, 'proxy');
  mkdirSync(dir, { recursive: true });
  const stateFile = join(dir, 'state.json');
  writeFileSync(stateFile, benchState(ctx.options.serviceAnnotations));
  const started = spawnProxy(ctx, { name: 'kube-userspace-proxy', workers: ctx.options.workers, slug: `proxy-load-${++proxyStarts}`, stateFile, admin: PROXY_ADMIN, extraArgs: ctx.options.proxyArgs, logFile: join(dir, 'out.log') });
  await waitUntil(async () => {
    try {
      const st = await proxyStatus(PROXY_ADMIN);
      return st.services.length >= services.length && st.services.every((u) => u.reachable.length > 0 && u.errors.length === 0);
    } catch {
      return false;
    }
  }, 'the proxy to serve every bench service port', 15_000, { everyMs: 50, process: started });
  return fromProcess('proxy', PROXY_HOST, new Set(['TCP', 'UDP']), started);
}

async function startHaproxy(ctx: Context): Promise<System> {
  const dir = join(ctx.tmp, 'haproxy');
  mkdirSync(dir, { recursive: true });
  const tcp = servicesOver(new Set(['TCP']));
  ensureFree(HAPROXY_HOST, tcp);
  writeFileSync(join(dir, 'haproxy.cfg'), haproxyConf(HAPROXY_HOST, tcp, ctx.options.workers, ctx.options.proxyProtocol));
  const started = ctx.procs.start('haproxy', path(ctx.tools, 'haproxy'), ['-f', join(dir, 'haproxy.cfg'), '-db'], { cpu: ctx.pin.proxyCpus, logFile: join(dir, 'out.log') });
  await waitBound(started, HAPROXY_HOST, tcp);
  return fromProcess('haproxy', HAPROXY_HOST, new Set(['TCP']), started);
}

async function startNginxStream(ctx: Context): Promise<System> {
  const dir = join(ctx.tmp, 'nginx-stream');
  mkdirSync(dir, { recursive: true });
  const all = servicesOver(new Set(['TCP', 'UDP']));
  ensureFree(NGINX_STREAM_HOST, all);
  writeFileSync(join(dir, 'nginx.conf'), nginxStreamConf(dir, path(ctx.tools, 'nginx-stream'), isRoot(), NGINX_STREAM_HOST, all, ctx.options.workers, ctx.options.proxyProtocol));
  const started = ctx.procs.start('nginx stream', path(ctx.tools, 'nginx'), ['-p', dir, '-c', join(dir, 'nginx.conf'), '-e', join(dir, 'error.log')], { cpu: ctx.pin.proxyCpus, logFile: join(dir, 'out.log') });
  await waitBound(started, NGINX_STREAM_HOST, all);
  return fromProcess('nginx', NGINX_STREAM_HOST, new Set(['TCP', 'UDP']), started);
}

/** Start the systems asked for; one that cannot start is skipped with a line saying why. */
export async function startSystems(ctx: Context, wanted: readonly SystemId[]): Promise<System[]> {
  const out: System[] = [];
  const services = Object.keys(SERVICES) as BenchService[];
  for (const id of wanted) {
    try {
      switch (id) {
        case 'direct':
          out.push(fromProcess('direct', BACKEND_HOST, new Set(['TCP', 'UDP']), undefined));
          break;
        case 'proxy':
          out.push(await startProxySystem(ctx, services));
          break;
        case 'haproxy':
          if (!has(ctx.tools, 'haproxy')) ctx.skip('HAProxy', missingLine(ctx.tools, ['haproxy']) ?? '');
          else out.push(await startHaproxy(ctx));
          break;
        case 'nginx':
          if (!has(ctx.tools, 'nginx', 'nginx-stream')) ctx.skip('nginx stream', missingLine(ctx.tools, ['nginx', 'nginx-stream']) ?? '');
          else out.push(await startNginxStream(ctx));
          break;
      }
    } catch (err) {
      ctx.skip(systemLabel(id, ctx.options.workers), `did not start: ${(err as Error).message}`);
    }
  }
  return out;
}
