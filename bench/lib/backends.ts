import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { dnsData, nginxBackendConf } from './configs.js';
import type { Context } from './context.js';
import { BACKEND_HOST, MOVED_HOST, PROBE_PORT, SERVICES, type BenchService } from './plan.js';
import { inUse, isBound, waitUntil, type Started } from './proc.js';
import { has, missingLine, path, type ToolName } from './tools.js';

/**
 * The same C backends behind every system, pinned to the load core: nginx answering a tiny HTTP
 * response, an iperf3 server, a sockperf UDP server, dnsmasq answering from a hosts file.
 */
export interface Backends {
  /** The backend services that are up. */
  readonly up: ReadonlySet<BenchService>;
  readonly processes: Started[];
}

const NEEDS: Readonly<Record<BenchService, ToolName>> = { http: 'nginx', iperf: 'iperf3', sockperf: 'sockperf', dns: 'dnsmasq' };

export const DNS_NAMES = 1000;

export function isRoot(): boolean {
  return process.getuid?.() === 0;
}

export async function startBackends(ctx: Context, wanted: ReadonlySet<BenchService>): Promise<Backends> {
  const up = new Set<BenchService>();
  const processes: Started[] = [];
  const cpu = ctx.pin.loadCpus;
  for (const service of wanted) {
    const tool = NEEDS[service];
    if (!has(ctx.tools, tool)) {
      ctx.skip(`${service} backend`, missingLine(ctx.tools, [tool]) ?? '');
      continue;
    }
    const dir = join(ctx.tmp, `backend-${service}`);
    mkdirSync(dir, { recursive: true });
    const logFile = join(dir, 'out.log');
    const { port, protocol } = SERVICES[service];
    const proto: 'tcp' | 'udp' = protocol === 'TCP' ? 'tcp' : 'udp';
    const wants = [{ proto, host: BACKEND_HOST, port }];
    if (service === 'http') wants.push({ proto, host: BACKEND_HOST, port: PROBE_PORT }, { proto, host: MOVED_HOST, port: PROBE_PORT });
    const busy = inUse(wants);
    if (busy) {
      ctx.skip(`${service} backend`, busy);
      continue;
    }
    let started: Started;
    switch (service) {
      case 'http':
        writeFileSync(join(dir, 'nginx.conf'), nginxBackendConf(dir, isRoot(), ctx.options.proxyProtocol));
        started = ctx.procs.start('nginx backend', path(ctx.tools, 'nginx'), ['-p', dir, '-c', join(dir, 'nginx.conf'), '-e', join(dir, 'error.log')], { cpu, logFile });
        break;
      case 'iperf':
        started = ctx.procs.start('iperf3 server', path(ctx.tools, 'iperf3'), ['-s', '-B', BACKEND_HOST, '-p', String(port)], { cpu, logFile });
        break;
      case 'sockperf':
        started = ctx.procs.start('sockperf server', path(ctx.tools, 'sockperf'), ['server', '-i', BACKEND_HOST, '-p', String(port)], { cpu, logFile });
        break;
      case 'dns': {
        const data = dnsData(DNS_NAMES);
        writeFileSync(join(dir, 'hosts'), data.hosts);
        writeFileSync(join(ctx.tmp, 'dns-queries.txt'), data.queries);
        started = ctx.procs.start('dnsmasq', path(ctx.tools, 'dnsmasq'), [
          '--keep-in-foreground', '--conf-file=/dev/null', '--no-resolv', '--no-hosts', `--addn-hosts=${join(dir, 'hosts')}`,
          '--local=/bench.test/', `--listen-address=${BACKEND_HOST}`, '--bind-interfaces', `--port=${port}`, '--pid-file=',
          '--log-facility=-', ...(isRoot() ? ['--user=root'] : []),
        ], { cpu, logFile });
        break;
      }
    }
    processes.push(started);
    try {
      await waitUntil(() => isBound(proto, BACKEND_HOST, port), `${started.name} on ${BACKEND_HOST}:${port}`, 10_000, { process: started });
      up.add(service);
    } catch (err) {
      ctx.skip(`${service} backend`, (err as Error).message);
      await started.stop();
    }
  }
  return { up, processes };
}
