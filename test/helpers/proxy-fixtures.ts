import { spawn } from 'node:child_process';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { readdirSync } from 'node:fs';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { createLogger, type Logger } from '../../src/log.js';
import { freePortRun, portBelowEphemeral } from './net.js';

/** Reject when `promise` has not settled within `ms`: every wait in these tests is bounded. */
export function withDeadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

/** Poll a condition that has no event of its own (counters, descriptor counts), with a deadline. */
export async function waitUntil(cond: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!cond()) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

export interface LogRecord {
  level: number;
  msg: string;
  [field: string]: unknown;
}

/** A real pino logger writing parsed records into an array. */
export function captureLogger(level: 'debug' | 'info' | 'warn' = 'debug'): { logger: Logger; records: LogRecord[] } {
  const records: LogRecord[] = [];
  const logger = createLogger(level, { write: (line: string) => void records.push(JSON.parse(line) as LogRecord) });
  return { logger, records };
}

/** Descriptors open in this process now (the listing's own directory descriptor excluded). */
export function openFdCount(): number {
  return readdirSync('/proc/self/fd').length - 1;
}

export interface TcpBackend {
  server: Server;
  port: number;
  /** Connections the backend holds open now. */
  readonly open: Set<Socket>;
  close(): Promise<void>;
}

/** A loopback TCP server; `onConn` defaults to echo (which ends after the peer's FIN). */
export async function tcpBackend(host = '127.0.0.1', onConn: (s: Socket) => void = (s) => s.pipe(s)): Promise<TcpBackend> {
  const open = new Set<Socket>();
  const server = createServer({ allowHalfOpen: true }, (s) => {
    open.add(s);
    s.on('close', () => open.delete(s));
    s.on('error', () => s.destroy());
    onConn(s);
  });
  await listenTcp(server, host);
  return {
    server,
    port: (server.address() as AddressInfo).port,
    open,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => resolve());
      }),
  };
}

function listenTcp(server: Server, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve());
  });
}

/**
 * A TCP port nothing listens on, for dials that must be refused; below the kernel's ephemeral
 * range (helpers/net.ts). A port listen(0) handed out and was closed again is the next listen(0)'s
 * to take, in any test of the run: a backend started after it once took the "closed" port, and
 * the dial meant to be refused was answered.
 */
export function closedTcpPort(host = '127.0.0.1'): Promise<number> {
  return freePortRun(1, host);
}

/** A UDP port nothing is bound to, below the ephemeral range for the same reason as closedTcpPort. */
export async function closedUdpPort(host = '127.0.0.1'): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const port = portBelowEphemeral();
    const s = createSocket(host.includes(':') ? 'udp6' : 'udp4');
    const bound = await new Promise<boolean>((resolve) => {
      s.once('error', () => resolve(false));
      s.bind(port, host, () => resolve(true));
    });
    await new Promise<void>((resolve) => s.close(() => resolve()));
    if (bound) return port;
  }
  throw new Error('no free UDP port below the ephemeral range');
}

export async function boundUdp(host = '127.0.0.1'): Promise<UdpSocket> {
  const s = createSocket(host.includes(':') ? 'udp6' : 'udp4');
  await new Promise<void>((resolve, reject) => {
    s.once('error', reject);
    s.bind(0, host, () => resolve());
  });
  return s;
}

/** Echoes each datagram, prefixed with `name:` when a name is given; remembers the sizes it got. */
export async function udpEcho(host = '127.0.0.1', name = ''): Promise<{ socket: UdpSocket; port: number; sizes: number[]; close(): void }> {
  const socket = await boundUdp(host);
  const sizes: number[] = [];
  const prefix = Buffer.from(name ? `${name}:` : '');
  socket.on('message', (msg, r) => {
    sizes.push(msg.length);
    socket.send(name ? Buffer.concat([prefix, msg]) : msg, r.port, r.address);
  });
  return { socket, port: socket.address().port, sizes, close: () => socket.close() };
}

/** Send one datagram from `socket` and wait (bounded) for the next datagram it receives. */
export function udpAsk(socket: UdpSocket, port: number, host: string, data: Buffer | string, timeoutMs = 2000): Promise<{ msg: Buffer; from: { address: string; port: number } }> {
  const reply = new Promise<{ msg: Buffer; from: { address: string; port: number } }>((resolve) => {
    socket.once('message', (msg, r) => resolve({ msg, from: { address: r.address, port: r.port } }));
  });
  socket.send(typeof data === 'string' ? Buffer.from(data) : data, port, host);
  return withDeadline(reply, timeoutMs, `a UDP reply via ${host}:${port}`);
}

/** Everything a socket receives, with waits for a byte count or the end. */
export class Collector {
  private readonly chunks: Buffer[] = [];
  private total = 0;
  private waiters: { n: number; resolve: () => void }[] = [];
  readonly ended: Promise<Buffer>;

  constructor(socket: Socket) {
    socket.on('data', (d: Buffer) => this.onData(d));
    this.ended = new Promise((resolve, reject) => {
      socket.once('end', () => resolve(this.bytes()));
      socket.once('error', reject);
    });
    this.ended.catch(() => {}); // observed by whoever awaits it
  }

  bytes(): Buffer {
    return Buffer.concat(this.chunks);
  }

  until(n: number, timeoutMs = 5000): Promise<void> {
    if (this.total >= n) return Promise.resolve();
    return withDeadline(new Promise<void>((resolve) => this.waiters.push({ n, resolve })), timeoutMs, `${n} bytes`);
  }

  private onData(d: Buffer): void {
    this.chunks.push(d);
    this.total += d.length;
    const waiting: { n: number; resolve: () => void }[] = [];
    for (const w of this.waiters) {
      if (this.total >= w.n) w.resolve();
      else waiting.push(w);
    }
    this.waiters = waiting;
  }
}

/** Connect (bounded); the socket comes back with a Collector already attached. */
export async function connectTo(port: number, host = '127.0.0.1', timeoutMs = 5000): Promise<{ socket: Socket; got: Collector }> {
  const socket = connect({ port, host, allowHalfOpen: true });
  const got = new Collector(socket);
  await withDeadline(
    new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    }),
    timeoutMs,
    `connect to ${host}:${port}`,
  );
  return { socket, got };
}

/** Send `data`, end our side, and collect the whole reply until the peer ends. */
export async function exchange(port: number, data: Buffer | string, host = '127.0.0.1', timeoutMs = 5000): Promise<Buffer> {
  const { socket, got } = await connectTo(port, host, timeoutMs);
  socket.end(data);
  try {
    return await withDeadline(got.ended, timeoutMs, `the reply via ${host}:${port}`);
  } finally {
    socket.destroy();
  }
}

/** How a client connection ended without data: the error code ('end' for a clean FIN) and when. */
export async function clientOutcome(port: number, host = '127.0.0.1', send?: string, timeoutMs = 5000): Promise<{ code: string; ms: number }> {
  const started = performance.now();
  const socket = connect({ port, host });
  if (send !== undefined) socket.write(send);
  socket.resume();
  const code = await withDeadline(
    new Promise<string>((resolve) => {
      socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
      socket.once('end', () => resolve('end'));
    }),
    timeoutMs,
    `the proxy to end the connection via ${host}:${port}`,
  );
  socket.destroy();
  return { code, ms: performance.now() - started };
}

/**
 * A loopback port whose SYNs go unanswered: a child process listens with a backlog of 1 and is
 * stopped (SIGSTOP) so it never accepts; two connections fill its queue, after which the kernel
 * drops further SYNs and a dial hangs until its timeout. close() kills the child by its pid.
 */
export async function unresponsiveTcpPort(): Promise<{ port: number; close(): void }> {
  const script = "require('net').createServer().listen({ port: 0, host: '127.0.0.1', backlog: 1 }, function () { process.stdout.write(this.address().port + '\\n'); })";
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  const filling: Socket[] = [];
  const close = (): void => {
    for (const s of filling) s.destroy();
    child.kill('SIGKILL');
  };
  try {
    const port = await withDeadline(new Promise<number>((resolve) => child.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim())))), 10_000, 'the child to listen');
    child.kill('SIGSTOP');
    for (let i = 0; i < 2; i++) filling.push((await connectTo(port)).socket);
    return { port, close };
  } catch (err) {
    close();
    throw err;
  }
}
