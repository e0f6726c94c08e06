import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Context } from './context.js';
import type { LoadWorkloadId } from './options.js';
import { parseDnsperf, parseIperf3, parseSockperf, parseWrk, tail, WRK_SCRIPT } from './parse.js';
import type { BenchService, HostPort } from './plan.js';
import { sleep } from './proc.js';
import type { MetricDef } from './results.js';
import { path, type ToolName } from './tools.js';

/** A load workload: one load generator against one backend service, through each system. */
export interface LoadWorkload {
  id: LoadWorkloadId;
  title: string;
  service: BenchService;
  tools: ToolName[];
  metrics: MetricDef[];
  /** Operations per second in a run's metrics, for the CPU cost per operation. */
  opsPerSecond(m: Record<string, number>): number;
  /** Name and unit of the CPU cost per operation, and the scale from CPU-seconds per op. */
  perOp: { label: string; unit: string; scale: number };
  run(ctx: Context, target: HostPort, durationS: number): Promise<Record<string, number>>;
}

/** wrk: one thread (the load core), 64 connections. */
export const WRK_CONNECTIONS = 64;
/** dnsperf: 20 clients, each its own source port, i.e. its own UDP session in a proxy. */
export const DNS_CLIENTS = 20;

async function tool(ctx: Context, name: ToolName, args: string[], durationS: number): Promise<string> {
  const r = await ctx.procs.run(path(ctx.tools, name), args, { cpu: ctx.pin.loadCpus, timeoutMs: (durationS + 30) * 1000 });
  if (r.code !== 0) throw new Error(`${name} exited ${r.code}: ${tail(`${r.stdout}\n${r.stderr}`)}`);
  return `${r.stdout}\n${r.stderr}`;
}

function wrkScript(ctx: Context): string {
  const file = join(ctx.tmp, 'wrk-report.lua');
  writeFileSync(file, WRK_SCRIPT);
  return file;
}

async function wrk(ctx: Context, target: HostPort, durationS: number, close: boolean): Promise<Record<string, number>> {
  const args = ['-t1', `-c${WRK_CONNECTIONS}`, `-d${durationS}s`, '--timeout', '5s', '-s', wrkScript(ctx)];
  if (close) args.push('-H', 'Connection: close');
  args.push(`http://${target.host}:${target.port}/`);
  const r = parseWrk(await tool(ctx, 'wrk', args, durationS));
  const rate = r.requests / (r.durationUs / 1e6);
  return { [close ? 'cps' : 'rps']: rate, p50Ms: r.p50Us / 1000, p99Ms: r.p99Us / 1000, maxMs: r.maxUs / 1000, errors: r.errors };
}

/**
 * iperf3, one stream for `durationS`. Upload: client to server, the client-to-endpoint direction
 * (the proxy reads accepted sockets). Download (`-R`): server to client, the endpoint-to-client
 * direction (the proxy reads dialed sockets), which is where most Service traffic flows.
 */
function tcpBulk(direction: 'up' | 'down'): LoadWorkload {
  return {
    id: direction === 'up' ? 'tcp-bulk' : 'tcp-bulk-down',
    title: direction === 'up' ? 'TCP bulk throughput, one stream, client to server (iperf3)' : 'TCP bulk throughput, one stream, server to client (iperf3 -R)',
    service: 'iperf',
    tools: ['iperf3'],
    metrics: [
      { key: 'gbps', label: 'throughput', unit: 'Gbit/s', better: 'higher' },
      { key: 'retransmits', label: 'retransmits', unit: '', better: 'none' },
    ],
    opsPerSecond: (m) => (m.gbps ?? NaN) / 8,
    perOp: { label: 'CPU per GB', unit: 'ms', scale: 1e3 },
    async run(ctx, target, durationS) {
      const args = ['-c', target.host, '-p', String(target.port), '-t', String(durationS), '-J'];
      if (direction === 'down') args.push('-R');
      // The server takes one test at a time; the previous one may still be closing.
      for (let attempt = 0; ; attempt++) {
        try {
          const r = parseIperf3(await tool(ctx, 'iperf3', args, durationS));
          return { gbps: r.gbps, retransmits: r.retransmits };
        } catch (err) {
          if (attempt >= 3 || !/busy/.test((err as Error).message)) throw err;
          await sleep(500);
        }
      }
    },
  };
}

const httpKeepAlive: LoadWorkload = {
  id: 'http-keepalive',
  title: `HTTP keep-alive requests, ${WRK_CONNECTIONS} connections (wrk)`,
  service: 'http',
  tools: ['wrk', 'nginx'],
  metrics: [
    { key: 'rps', label: 'requests/s', unit: 'req/s', better: 'higher' },
    { key: 'p50Ms', label: 'p50 latency', unit: 'ms', better: 'lower' },
    { key: 'p99Ms', label: 'p99 latency', unit: 'ms', better: 'lower' },
    { key: 'errors', label: 'errors', unit: '', better: 'lower' },
  ],
  opsPerSecond: (m) => m.rps ?? NaN,
  perOp: { label: 'CPU per request', unit: 'µs', scale: 1e6 },
  run: (ctx, target, durationS) => wrk(ctx, target, durationS, false),
};

const httpClose: LoadWorkload = {
  id: 'http-close',
  title: `Short connections, one request each, ${WRK_CONNECTIONS} at a time (wrk, Connection: close)`,
  service: 'http',
  tools: ['wrk', 'nginx'],
  metrics: [
    { key: 'cps', label: 'connections/s', unit: 'conn/s', better: 'higher' },
    { key: 'p50Ms', label: 'p50 latency', unit: 'ms', better: 'lower' },
    { key: 'p99Ms', label: 'p99 latency', unit: 'ms', better: 'lower' },
    { key: 'errors', label: 'errors', unit: '', better: 'lower' },
  ],
  opsPerSecond: (m) => m.cps ?? NaN,
  perOp: { label: 'CPU per connection', unit: 'µs', scale: 1e6 },
  run: (ctx, target, durationS) => wrk(ctx, target, durationS, true),
};

const udpPingPong: LoadWorkload = {
  id: 'udp-pingpong',
  title: 'UDP ping-pong round trip, 64-byte datagrams (sockperf)',
  service: 'sockperf',
  tools: ['sockperf'],
  metrics: [
    { key: 'avgUs', label: 'average RTT', unit: 'µs', better: 'lower' },
    { key: 'p50Us', label: 'p50 RTT', unit: 'µs', better: 'lower' },
    { key: 'p99Us', label: 'p99 RTT', unit: 'µs', better: 'lower' },
    { key: 'p999Us', label: 'p99.9 RTT', unit: 'µs', better: 'lower' },
    { key: 'dropped', label: 'dropped', unit: '', better: 'lower' },
  ],
  opsPerSecond: (m) => (m.avgUs ? 1e6 / m.avgUs : NaN),
  perOp: { label: 'CPU per round trip', unit: 'µs', scale: 1e6 },
  async run(ctx, target, durationS) {
    const out = await tool(ctx, 'sockperf', ['ping-pong', '-i', target.host, '-p', String(target.port), '-t', String(durationS), '-m', '64', '--full-rtt'], durationS);
    const r = parseSockperf(out);
    return { avgUs: r.avgUs, p50Us: r.p50Us, p99Us: r.p99Us, p999Us: r.p999Us, dropped: r.dropped };
  },
};

const dns: LoadWorkload = {
  id: 'dns',
  title: `DNS queries through UDP, ${DNS_CLIENTS} clients (dnsperf, dnsmasq)`,
  service: 'dns',
  tools: ['dnsperf', 'dnsmasq'],
  metrics: [
    { key: 'qps', label: 'queries/s', unit: 'q/s', better: 'higher' },
    { key: 'lostPct', label: 'lost', unit: '%', better: 'lower' },
    { key: 'avgLatencyMs', label: 'average latency', unit: 'ms', better: 'lower' },
  ],
  opsPerSecond: (m) => m.qps ?? NaN,
  perOp: { label: 'CPU per query', unit: 'µs', scale: 1e6 },
  async run(ctx, target, durationS) {
    const args = ['-s', target.host, '-p', String(target.port), '-d', join(ctx.tmp, 'dns-queries.txt'), '-c', String(DNS_CLIENTS), '-T', '1', '-l', String(durationS), '-t', '1'];
    const r = parseDnsperf(await tool(ctx, 'dnsperf', args, durationS));
    return { qps: r.qps, lostPct: r.sent > 0 ? (r.lost / r.sent) * 100 : 0, avgLatencyMs: r.avgLatencyMs };
  },
};

export const LOAD_WORKLOAD_DEFS: readonly LoadWorkload[] = [tcpBulk('up'), tcpBulk('down'), httpKeepAlive, httpClose, udpPingPong, dns];
