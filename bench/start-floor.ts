#!/usr/bin/env node
/**
 * The floor under the start-up row (`--only scale-start`): what reading a state file and listening
 * on its Service ports costs on Node, and nothing else, run in the proxy's place (`node
 * dist/bench/run.js --only scale-start --proxy-main dist/bench/start-floor.js`). It reads the file
 * whole, parses it, and for every TCP port of every Service with an IPv4 ClusterIP listens as the
 * proxy's loopback portal does (the ClusterIP's loopback twin, the same server options and
 * backlog), then writes the two log lines the harness times (`loaded state file`, `synced proxy
 * rules`) in pino's shape. No re-execution, validation, translation, endpoints, balancers,
 * bookkeeping, health or metrics: where the proxy's start is near this, the distance to the goal is
 * Node's; what lies between them is this code's.
 * A measuring tool only; nothing of the proxy uses it.
 */
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { pathToFileURL } from 'node:url';
import { listenBacklog } from '../src/io/net/listen-backlog.js';

interface Item {
  kind?: string;
  spec?: { clusterIP?: string; ports?: Array<{ port?: number; protocol?: string }> };
}

/** One pino-shaped info line, as the harness's log reader takes them. */
function log(msg: string, extra: Record<string, unknown> = {}): void {
  process.stdout.write(`${JSON.stringify({ level: 30, time: new Date().toISOString(), pid: process.pid, ...extra, msg })}\n`);
}

/** Where the loopback portal serves an IPv4 ClusterIP a.b.c.d: 127.b.c.d (core/loopback-address.ts). */
function loopbackTwin(clusterIP: string): string | undefined {
  const dot = clusterIP.indexOf('.');
  return dot > 0 && !clusterIP.includes(':') ? `127${clusterIP.slice(dot)}` : undefined;
}

/** Every TCP port of every listed Service with an IPv4 ClusterIP, as host and port. */
export function listenAddresses(items: readonly Item[]): Array<{ host: string; port: number }> {
  const out: Array<{ host: string; port: number }> = [];
  for (const item of items) {
    if (item.kind !== 'Service') continue;
    const host = loopbackTwin(item.spec?.clusterIP ?? '');
    if (host === undefined) continue;
    for (const p of item.spec?.ports ?? []) if ((p.protocol ?? 'TCP') === 'TCP' && p.port !== undefined) out.push({ host, port: p.port });
  }
  return out;
}

/** Listens on every address; resolves once all listen, to how many do (the rest failed, e.g. EMFILE). */
export async function listenAll(addrs: ReadonlyArray<{ host: string; port: number }>): Promise<number> {
  const backlog = listenBacklog();
  const results = await Promise.all(
    addrs.map(
      (a) =>
        new Promise<boolean>((resolve) => {
          // The proxy's server options: nothing is read until an endpoint is dialed, FIN passed on, Nagle off.
          const server = createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true }, (client) => client.destroy());
          server.once('error', () => resolve(false));
          server.once('listening', () => resolve(true));
          server.listen({ host: a.host, port: a.port, backlog });
        }),
    ),
  );
  return results.filter(Boolean).length;
}

function main(): void {
  const at = process.argv.indexOf('--state');
  const file = at >= 0 ? process.argv[at + 1] : undefined;
  if (file === undefined) throw new Error('start-floor: --state FILE is required');
  // The harness's stop (and ^C): leave at once, through exit, so --cpu-prof writes its profile.
  for (const signal of ['SIGTERM', 'SIGINT'] as const) process.on(signal, () => process.exit(0));
  const list = JSON.parse(readFileSync(file, 'utf8')) as { items?: Item[] };
  const addrs = listenAddresses(list.items ?? []);
  log('loaded state file', { file });
  void listenAll(addrs).then((listening) => log('synced proxy rules', { units: addrs.length, listenErrors: addrs.length - listening }));
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) main();
