/**
 * What PROXY protocol v2 adds to a connection, in process, on real loopback sockets: what
 * TcpProxySocket.proxyHeader does per accepted client (read the client's address, and the local one
 * when the listener cannot tell it, and encode the header) and what TcpConnection adds at the
 * hand-over (one more write, of 28 bytes, to the endpoint's socket). Node keeps an address once
 * read, so every sample is a fresh socket: getpeername() and getsockname() are in the figure. The encoding alone is also timed in a loop.
 * Loopback only; bounded: `connections` (at most 5,000) per round, 5 rounds.
 *
 * Run: npm run build && node dist/bench/proxy-header-cost.js [connections]
 * Prints the CPU time (user + system, process.cpuUsage: a busy machine's preemptions are not in
 * it, as they would be in wall time) per connection, each the median of the 5 rounds.
 */
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { proxyV2Header } from '../src/core/proxy-protocol.js';

const HOST = '127.0.0.1';

interface Pairs {
  accepted: Socket[];
  dialed: Socket[];
}

/** `n` connections to `server`: the accepted ends (the proxy's clients) and the dialing ends (its upstreams). */
async function open(server: Server, n: number): Promise<Pairs> {
  const { port } = server.address() as AddressInfo;
  const accepted: Socket[] = [];
  const onConn = (s: Socket): void => {
    s.on('error', () => undefined);
    s.resume(); // read and drop, as an endpoint would take the header
    accepted.push(s);
  };
  server.on('connection', onConn);
  const dialed: Socket[] = [];
  for (let i = 0; i < n; i += 100) {
    const batch = Array.from({ length: Math.min(100, n - i) }, () => connect({ host: HOST, port, noDelay: true }));
    await Promise.all(batch.map((s) => new Promise<void>((resolve, reject) => {
      s.once('connect', resolve);
      s.once('error', reject);
    })));
    dialed.push(...batch);
  }
  while (accepted.length < n) await new Promise((r) => setImmediate(r));
  server.off('connection', onConn);
  return { accepted, dialed };
}

function close(p: Pairs): void {
  for (const s of [...p.accepted, ...p.dialed]) s.destroy();
}

/** User + system CPU since `from`, in ns. */
function cpuNs(from: NodeJS.CpuUsage): number {
  const d = process.cpuUsage(from);
  return (d.user + d.system) * 1000;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

async function main(): Promise<void> {
  const n = Math.min(5000, Math.max(1, Number(process.argv[2] ?? 1000)));
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, HOST, () => resolve()));
  const { port } = server.address() as AddressInfo;
  const addresses: number[] = [];
  const locals: number[] = [];
  const writes: number[] = [];
  let sink = 0;
  for (let round = 0; round < 5; round++) {
    const pairs = await open(server, n);
    const headers: Uint8Array[] = [];
    // As a listener bound to the Service's address (or a NAT rule from one portal) does: the
    // destination is the listener's, only the client's address is read.
    let t0 = process.cpuUsage();
    for (const c of pairs.accepted) {
      headers.push(proxyV2Header({ sourceAddress: c.remoteAddress as string, sourcePort: c.remotePort as number, destinationAddress: HOST, destinationPort: port }));
    }
    addresses.push(cpuNs(t0) / n);
    // What a wildcard listener adds: the local address read too (getsockname()).
    t0 = process.cpuUsage();
    for (const c of pairs.accepted) sink += (c.localAddress as string).length + (c.localPort as number);
    locals.push(cpuNs(t0) / n);
    t0 = process.cpuUsage();
    for (let i = 0; i < n; i++) (pairs.dialed[i] as Socket).write(headers[i] as Uint8Array);
    writes.push(cpuNs(t0) / n);
    sink += headers.length;
    close(pairs);
    await new Promise((r) => setTimeout(r, 50));
  }
  server.close();
  const encode: number[] = [];
  const loops = 1_000_000;
  for (let round = 0; round < 5; round++) {
    const t0 = process.cpuUsage();
    for (let i = 0; i < loops; i++) sink += proxyV2Header({ sourceAddress: '10.244.1.17', sourcePort: 40000 + (i & 0xfff), destinationAddress: '10.96.0.10', destinationPort: 80 }).length;
    encode.push(cpuNs(t0) / loops);
  }
  const fmt = (x: number): string => `${Math.round(x)} ns`;
  process.stdout.write(`connections per round: ${n}; 5 rounds; medians (sink ${sink % 7})\n`);
  process.stdout.write(`  client's address read + header encoded, per client:   ${fmt(median(addresses))}\n`);
  process.stdout.write(`  the local address read too (a wildcard listener):      ${fmt(median(locals))}\n`);
  process.stdout.write(`  the header written to the endpoint's socket:          ${fmt(median(writes))}\n`);
  process.stdout.write(`  encoding alone (IPv4, in a loop):                      ${fmt(median(encode))}\n`);
}

await main();
