#!/usr/bin/env node
/**
 * The floor under the start-up row (`--only scale-start`): what reading a state file and listening
 * on its Service ports costs on Node, and nothing else, run in the proxy's place (`node
 * dist/bench/run.js --only scale-start --proxy-main dist/bench/start-floor.js`). It reads the file
 * whole, parses it, and listens on every TCP port of every Service where the proxy's loopback
 * portal does (the Service's loopback address by the portal's own rule, node ports on 127.0.0.1;
 * the same server options and backlog), then writes the two log lines the harness times (`loaded
 * state file`, `synced proxy rules`) in pino's shape. No re-execution, validation, translation,
 * endpoints, balancers, bookkeeping, health or metrics, and Node's default heap settings: where the
 * proxy's start is near this, the distance to the goal is Node's; what lies between them is this
 * code's. UDP ports are left out (the row's files have none).
 * A measuring tool only; nothing of the proxy uses it.
 */
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { pathToFileURL } from 'node:url';
import { isIP } from '../src/core/address.js';
import { loopbackAddressFor } from '../src/core/loopback-address.js';
import { namespacedName } from '../src/core/object-key.js';
import { listenBacklog } from '../src/io/net/listen-backlog.js';

interface Item {
  kind?: string;
  metadata?: { namespace?: string; name?: string };
  spec?: { type?: string; clusterIP?: string; clusterIPs?: string[]; ports?: Array<{ port?: number; protocol?: string; nodePort?: number }> };
}

/** One pino-shaped info line, as the harness's log reader takes them. */
function log(msg: string, extra: Record<string, unknown> = {}): void {
  process.stdout.write(`${JSON.stringify({ level: 30, time: new Date().toISOString(), pid: process.pid, ...extra, msg })}\n`);
}

/**
 * Every TCP port of every listed Service, where the loopback portal listens for it: the
 * Service's loopback address (core/loopback-address.ts: its IPv4 ClusterIP's twin in 127.0.0.0/8,
 * else an address hashed from its name; one per Service, taken in file order) for each port,
 * and 127.0.0.1 for each node port. Services without a ClusterIP (headless, ExternalName) have
 * no address.
 */
export function listenAddresses(items: readonly Item[]): Array<{ host: string; port: number }> {
  const out: Array<{ host: string; port: number }> = [];
  const taken = new Set<string>();
  for (const item of items) {
    if (item.kind !== 'Service') continue;
    const spec = item.spec ?? {};
    const tcp = (spec.ports ?? []).filter((p) => (p.protocol ?? 'TCP') === 'TCP' && p.port !== undefined);
    const clusterIPs = (spec.clusterIPs ?? (spec.clusterIP === undefined ? [] : [spec.clusterIP])).filter(isIP);
    if (clusterIPs.length > 0 && tcp.length > 0) {
      const host = loopbackAddressFor(namespacedName(item.metadata?.namespace, item.metadata?.name), clusterIPs, (a) => taken.has(a));
      taken.add(host);
      for (const p of tcp) out.push({ host, port: p.port as number });
    }
    if (spec.type === 'NodePort' || spec.type === 'LoadBalancer') {
      for (const p of tcp) if (p.nodePort !== undefined && p.nodePort > 0) out.push({ host: '127.0.0.1', port: p.nodePort });
    }
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
