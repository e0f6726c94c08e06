#!/usr/bin/env node
/**
 * The floor under the proxy's load figures: the proxy's own way with Node's sockets and nothing
 * else, run in the proxy's place (`node dist/bench/run.js --proxy-main dist/bench/floor-relay.js`).
 * It takes the proxy's command line and serves the bench's Service ports on the proxy's address,
 * each relayed to the bench backend as the proxy relays: TCP accepted paused until the endpoint
 * is connected, the client's bytes by 'data' with pause()/'drain', the endpoint's read with
 * `onread` into one shared buffer and copied out per read, each FIN passed on by the proxy's own
 * passEnd (a close when the other way has ended too, else a half-close); UDP one connected socket
 * per client, the listener's receive buffer as big as the proxy asks, replies sent without a name
 * lookup. No balancer, statistics, dial timeout, keepalive, logging, retries or error handling
 * beyond resetting both sides. With `--workers N` it runs N processes sharing the ports by
 * SO_REUSEPORT, as the proxy's workers do.
 *
 * What it tells: how far the proxy is from what its design costs on Node. Where the proxy is near
 * this relay and both are far from nginx, the distance is Node's, not this code's.
 * A measuring tool only; nothing of the proxy uses it.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { createSocket, type RemoteInfo, type Socket as UdpSocket } from 'node:dgram';
import { createServer as createHttpServer } from 'node:http';
import { connect, createServer, type AddressInfo, type Server } from 'node:net';
import { pathToFileURL } from 'node:url';
import { passEnd } from '../src/io/net/tcp-connection.js';
import { LISTENER_RECV_BUFFER_BYTES } from '../src/io/net/udp-receive-buffers.js';
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

/** One buffer for every endpoint read of this process: each read is copied out before the next. */
const sharedRead = new Uint8Array(64 * 1024);

function relayTcp(port: number, listenHost: string, backendHost: string): Promise<() => void> {
  const server: Server = createServer({ allowHalfOpen: true, noDelay: true, pauseOnConnect: true }, (client) => {
    const upstream = connect({
      host: backendHost,
      port,
      noDelay: true,
      allowHalfOpen: true,
      onread: {
        buffer: sharedRead,
        callback: (bytes, buf) => {
          const chunk = Buffer.allocUnsafe(bytes);
          chunk.set(buf.subarray(0, bytes));
          return client.write(chunk); // false stops the read until the client's 'drain'
        },
      },
    });
    const cut = (): void => {
      client.resetAndDestroy();
      upstream.resetAndDestroy();
    };
    client.on('error', cut);
    upstream.on('error', cut);
    upstream.once('connect', () => client.resume());
    client.on('data', (chunk: Buffer) => {
      if (!upstream.write(chunk)) client.pause();
    });
    upstream.on('drain', () => client.resume());
    client.on('drain', () => upstream.resume());
    client.on('end', () => passEnd(upstream));
    upstream.on('end', () => passEnd(client));
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: listenHost, port, reusePort: true, backlog: 4096 }, () => resolve(() => server.close()));
  });
}

function relayUdp(port: number, listenHost: string, backendHost: string): Promise<() => void> {
  // Replies go to an address literal: no lookup per send (the proxy's listener does the same).
  const server = createSocket({ type: 'udp4', reusePort: true, lookup: (host, _opts, cb) => cb(null, host, 4) });
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
    server.bind(port, listenHost, () => {
      try {
        server.setRecvBufferSize(LISTENER_RECV_BUFFER_BYTES);
      } catch {
        // As the proxy: a buffer the kernel refuses leaves its default, and the relay serves.
      }
      resolve(() => {
        server.close();
        for (const s of sessions.values()) s.socket.close();
      });
    });
  });
}

function flag(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

/** GET /services as the proxy answers it, for the harness's readiness wait; resolves to the port it listens on. */
function admin(hostPort: string, serving: string): Promise<number> {
  const at = hostPort.lastIndexOf(':');
  const body = JSON.stringify({ services: Object.keys(SERVICES).map((name) => ({ name: `bench/bench:${name}`, reachable: [serving], errors: [] })) });
  const server = createHttpServer((_req, res) => res.end(body));
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(Number(hostPort.slice(at + 1)), hostPort.slice(0, at), () => resolve((server.address() as AddressInfo).port));
  });
}

/**
 * The proxy's command line, as the harness gives it (`--workers`, `--metrics-bind-address`; the
 * rest is ignored). FLOOR_RELAY_HOSTS=LISTEN,BACKEND moves it off the bench's addresses (its test;
 * the harness does not pass it on).
 * Started with an IPC channel, the primary reports `{ admin: port }` once ready and leaves with
 * its parent.
 */
async function main(): Promise<void> {
  const benchPorts = Object.values(SERVICES);
  const [listen, backend, ...extra] = (process.env.FLOOR_RELAY_HOSTS ?? '').split(',');
  if (extra.length > 0) throw new Error(`FLOOR_RELAY_HOSTS: "${process.env.FLOOR_RELAY_HOSTS ?? ''}" is not LISTEN,BACKEND`);
  const listenHost = listen || PROXY_HOST;
  const backendHost = backend || BACKEND_HOST;
  // Gone with the parent, however it ends (a worker also before it has bound).
  if (process.connected) process.on('disconnect', () => process.exit(0));
  if (process.env.FLOOR_RELAY_WORKER === '1') {
    await serveFloor(benchPorts, listenHost, backendHost);
    process.send?.('ready');
    return;
  }
  const workers = Number(flag('--workers') ?? '1');
  if (!Number.isInteger(workers) || workers < 1) throw new Error(`--workers: "${flag('--workers') ?? ''}" is not a number of workers`);
  const children: ChildProcess[] = [];
  if (workers === 1) {
    await serveFloor(benchPorts, listenHost, backendHost);
  } else {
    await Promise.all(
      Array.from({ length: workers }, () => {
        const child = fork(process.argv[1] as string, [], { env: { ...process.env, FLOOR_RELAY_WORKER: '1' }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
        children.push(child);
        return new Promise<void>((resolve, reject) => {
          child.once('message', () => resolve());
          child.once('exit', (code) => reject(new Error(`a floor relay worker exited before serving (${code ?? 'signal'})`)));
        });
      }),
    );
    // A worker lost is a relay that no longer serves what the figures say: stop, loudly.
    for (const child of children) {
      child.removeAllListeners('exit');
      child.once('exit', () => process.exit(1));
    }
  }
  // Answered only once every worker serves: it is the harness's readiness wait.
  const adminPort = await admin(flag('--metrics-bind-address') ?? '127.0.0.1:10249', listenHost);
  process.send?.({ admin: adminPort });
  process.on('SIGTERM', () => {
    // The harness's stop: the ports are free when this process has gone.
    for (const child of children) child.removeAllListeners('exit');
    let left = children.length;
    if (left === 0) process.exit(0);
    for (const child of children) {
      child.once('exit', () => --left === 0 && process.exit(0));
      child.kill('SIGTERM');
    }
  });
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
