#!/usr/bin/env node
/**
 * The floor under the proxy's load figures: the barest relay Node's `net` and `dgram` allow, in
 * place of the proxy (`node dist/bench/run.js --proxy-main dist/bench/floor-relay.js`). It takes
 * the proxy's command line and serves the bench's Service ports on the proxy's address, each
 * relayed to the bench backend with nothing else: no balancer, no statistics, no timers, no
 * logging, no error handling past closing both sides. TCP is Node's own `pipe()` both ways; UDP is
 * one connected socket per client, as the proxy does. With `--workers N` it runs N processes
 * sharing the ports by SO_REUSEPORT, as the proxy's workers do.
 *
 * What it tells: how far the proxy is from what Node itself costs per operation. Where the proxy
 * is near this relay and both are far from nginx, the distance is Node's, not this code's.
 * A measuring tool only; nothing of the proxy uses it.
 */
import { fork } from 'node:child_process';
import { createSocket, type RemoteInfo, type Socket as UdpSocket } from 'node:dgram';
import { createServer as createHttpServer } from 'node:http';
import { connect, createServer, type Server } from 'node:net';
import { pathToFileURL } from 'node:url';
import { BACKEND_HOST, PROXY_HOST, SERVICES } from './lib/plan.js';

export interface FloorPort {
  port: number;
  protocol: 'TCP' | 'UDP';
}

/** Relays every port on `listenHost` to the same port on `backendHost`; resolves once all listen, to a function that closes them. */
export async function serveFloor(ports: readonly FloorPort[], listenHost: string, backendHost: string): Promise<() => void> {
  const closers = await Promise.all(ports.map((p) => (p.protocol === 'TCP' ? relayTcp(p.port, listenHost, backendHost) : relayUdp(p.port, listenHost, backendHost))));
  return () => {
    for (const close of closers) close();
  };
}

function relayTcp(port: number, listenHost: string, backendHost: string): Promise<() => void> {
  const server: Server = createServer({ allowHalfOpen: true, noDelay: true }, (client) => {
    const upstream = connect({ host: backendHost, port, noDelay: true, allowHalfOpen: true });
    const cut = (): void => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', cut);
    upstream.on('error', cut);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: listenHost, port, reusePort: true, backlog: 4096 }, () => resolve(() => server.close()));
  });
}

function relayUdp(port: number, listenHost: string, backendHost: string): Promise<() => void> {
  const server = createSocket({ type: 'udp4', reusePort: true });
  const sessions = new Map<string, { socket: UdpSocket; waiting: Buffer[] | undefined }>();
  server.on('message', (msg: Buffer, from: RemoteInfo) => {
    const key = `${from.address}:${from.port}`;
    const session = sessions.get(key);
    if (session === undefined) {
      const socket = createSocket('udp4');
      const fresh = { socket, waiting: [msg] as Buffer[] | undefined };
      socket.on('message', (reply: Buffer) => server.send(reply, from.port, from.address));
      socket.on('error', () => undefined);
      // What comes before the socket is connected waits: a send then would need the address.
      socket.connect(port, backendHost, () => {
        for (const m of fresh.waiting ?? []) socket.send(m);
        fresh.waiting = undefined;
      });
      sessions.set(key, fresh);
    } else if (session.waiting !== undefined) {
      session.waiting.push(msg);
    } else {
      session.socket.send(msg);
    }
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.bind(port, listenHost, () =>
      resolve(() => {
        server.close();
        for (const s of sessions.values()) s.socket.close();
      }),
    );
  });
}

function flag(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

/** GET /services as the proxy answers it, for the harness's readiness wait. */
function admin(hostPort: string): void {
  const at = hostPort.lastIndexOf(':');
  const body = JSON.stringify({ services: Object.keys(SERVICES).map((name) => ({ name: `bench/bench:${name}`, reachable: [PROXY_HOST], errors: [] })) });
  createHttpServer((_req, res) => res.end(body)).listen(Number(hostPort.slice(at + 1)), hostPort.slice(0, at));
}

/** The proxy's command line, as the harness gives it (`--workers`, `--metrics-bind-address`; the rest is ignored). */
async function main(): Promise<void> {
  const benchPorts = Object.values(SERVICES);
  if (process.env.FLOOR_RELAY_WORKER === '1') {
    await serveFloor(benchPorts, PROXY_HOST, BACKEND_HOST);
    process.on('disconnect', () => process.exit(0));
    return;
  }
  const workers = Number(flag('--workers') ?? '1');
  if (workers <= 1) await serveFloor(benchPorts, PROXY_HOST, BACKEND_HOST);
  else for (let i = 0; i < workers; i++) fork(process.argv[1] as string, [], { env: { ...process.env, FLOOR_RELAY_WORKER: '1' }, stdio: 'inherit' });
  admin(flag('--metrics-bind-address') ?? '127.0.0.1:10249');
  // The harness stops what it started with SIGTERM: the workers go with the primary (disconnect).
  process.on('SIGTERM', () => process.exit(0));
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
