/**
 * The traffic side of the `iptables-scale` workload, run as its own process inside the workload's
 * network namespace (`ip netns exec NS node netns-probe.js CONFIG`): so every packet it sends
 * crosses the namespace's netfilter hooks, with whatever rules the portal installed there.
 *
 * It listens on two ports: an echo server on 127.0.0.1 that no rule of ours concerns (the
 * "unrelated" traffic), and one on the proxy port of the probed Service (standing in for the
 * proxy, which the workload does not run). Then, each bounded in count and in time:
 *  - round trips of one byte on one established connection to the unrelated server;
 *  - new connections to the unrelated server (connect, one round trip, close);
 *  - new connections through the probed Service's ClusterIP (NATed to the proxy port).
 * Prints one JSON line of percentiles, in milliseconds. Loopback and the namespace's own
 * addresses only.
 */
import { createServer, connect, type Server, type Socket } from 'node:net';

export interface ProbeConfig {
  /** The unrelated echo server's port on 127.0.0.1. */
  unrelatedPort: number;
  /** The probed Service's proxy port: an echo server listens there on every address. */
  proxyPort: number;
  /** The probed Service's ClusterIP and port. */
  portal: { host: string; port: number };
  /** At most this many round trips, and this many connections of each kind. */
  roundTrips: number;
  connections: number;
  /** Each series stops at its count or after this long, whichever comes first. */
  seriesMs: number;
}

export interface ProbeResult {
  rtP50Ms: number;
  rtP99Ms: number;
  rtCount: number;
  connP50Ms: number;
  connP99Ms: number;
  connCount: number;
  portalConnP50Ms: number;
  portalConnP99Ms: number;
  portalConnCount: number;
}

function echoServer(host: string, port: number): Promise<Server> {
  return new Promise((resolve, reject) => {
    const server = createServer((s) => {
      s.on('error', () => s.destroy());
      s.on('data', (d) => s.write(d));
    });
    server.once('error', reject);
    server.listen(port, host, () => resolve(server));
  });
}

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] as number;
}

function elapsedMs(since: bigint): number {
  return Number(process.hrtime.bigint() - since) / 1e6;
}

function oneByte(s: Socket): Promise<void> {
  return new Promise((resolve, reject) => {
    const fail = (err: Error): void => reject(err);
    s.once('data', () => {
      s.off('error', fail);
      resolve();
    });
    s.once('error', fail);
    s.write('x');
  });
}

async function roundTrips(host: string, port: number, max: number, deadline: number): Promise<number[]> {
  const s = connect({ host, port, noDelay: true });
  await new Promise<void>((resolve, reject) => {
    s.once('connect', resolve);
    s.once('error', reject);
  });
  const out: number[] = [];
  try {
    for (let i = 0; i < max && Date.now() < deadline; i++) {
      const t = process.hrtime.bigint();
      await oneByte(s);
      out.push(elapsedMs(t));
    }
  } finally {
    s.destroy();
  }
  return out;
}

/** Connect, one round trip, close: the time to the answer. A failure ends the series with its error. */
async function newConnections(host: string, port: number, max: number, deadline: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < max && Date.now() < deadline; i++) {
    const t = process.hrtime.bigint();
    const s = connect({ host, port, noDelay: true });
    try {
      await new Promise<void>((resolve, reject) => {
        s.once('connect', resolve);
        s.once('error', reject);
      });
      await oneByte(s);
      out.push(elapsedMs(t));
    } finally {
      s.destroy();
    }
  }
  return out;
}

export async function probe(c: ProbeConfig): Promise<ProbeResult> {
  const servers = [await echoServer('127.0.0.1', c.unrelatedPort), await echoServer('0.0.0.0', c.proxyPort)];
  try {
    // A short warm-up, so the first series does not pay for JIT and first-use costs.
    await roundTrips('127.0.0.1', c.unrelatedPort, 50, Date.now() + 1000);
    const rt = (await roundTrips('127.0.0.1', c.unrelatedPort, c.roundTrips, Date.now() + c.seriesMs)).sort((a, b) => a - b);
    const conn = (await newConnections('127.0.0.1', c.unrelatedPort, c.connections, Date.now() + c.seriesMs)).sort((a, b) => a - b);
    const portal = (await newConnections(c.portal.host, c.portal.port, c.connections, Date.now() + c.seriesMs)).sort((a, b) => a - b);
    return {
      rtP50Ms: percentile(rt, 50),
      rtP99Ms: percentile(rt, 99),
      rtCount: rt.length,
      connP50Ms: percentile(conn, 50),
      connP99Ms: percentile(conn, 99),
      connCount: conn.length,
      portalConnP50Ms: percentile(portal, 50),
      portalConnP99Ms: percentile(portal, 99),
      portalConnCount: portal.length,
    };
  } finally {
    for (const s of servers) s.close();
  }
}

// Run as a script: the config is the one argument, as JSON.
if (process.argv[1]?.endsWith('netns-probe.js')) {
  probe(JSON.parse(process.argv[2] ?? '{}') as ProbeConfig).then(
    (r) => {
      process.stdout.write(`${JSON.stringify(r)}\n`);
      process.exit(0);
    },
    (err: unknown) => {
      process.stderr.write(`probe: ${err instanceof Error ? err.message : String(err)}\n`);
      process.exit(1);
    },
  );
}
