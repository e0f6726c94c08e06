import { createServer, connect, type Server, type Socket, type AddressInfo } from 'node:net';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { readFileSync } from 'node:fs';

/** Poll `fn` until it returns a truthy value or the deadline passes (then throw with `what`). */
export async function waitFor<T>(fn: () => T | Promise<T>, what: string, timeoutMs = 10_000, everyMs = 20): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** A TCP server on loopback that answers each connection with `name:` + what it receives, echoing. */
export async function tcpEchoServer(host = '127.0.0.1', name = '', port = 0): Promise<{ server: Server; port: number; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const server = createServer({ allowHalfOpen: true }, (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    if (name) s.write(`${name}:`);
    s.pipe(s);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const bound = (server.address() as AddressInfo).port;
  return {
    server,
    port: bound,
    close: () => new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    }),
  };
}

export async function udpEchoServer(host = '127.0.0.1', name = '', port = 0): Promise<{ socket: UdpSocket; port: number; close(): void }> {
  const socket = createSocket(host.includes(':') ? 'udp6' : 'udp4');
  socket.on('message', (msg, r) => socket.send(name ? Buffer.concat([Buffer.from(`${name}:`), msg]) : msg, r.port, r.address));
  await new Promise<void>((resolve, reject) => {
    socket.once('error', reject);
    socket.bind(port, host, resolve);
  });
  return { socket, port: socket.address().port, close: () => socket.close() };
}

/** Connect, send `data`, end, and collect the whole reply. */
export function tcpRequest(host: string, port: number, data: string | Buffer, timeoutMs = 5000): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const s = connect({ host, port, allowHalfOpen: true });
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`no reply from ${host}:${port} within ${timeoutMs}ms`));
    }, timeoutMs);
    s.on('connect', () => s.end(data));
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('end', () => {
      clearTimeout(timer);
      s.destroy();
      resolve(Buffer.concat(chunks).toString());
    });
    s.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

/** Send one datagram and wait for one reply. */
export function udpRequest(host: string, port: number, data: Buffer | string, timeoutMs = 2000, socket?: UdpSocket): Promise<Buffer> {
  const s = socket ?? createSocket(host.includes(':') ? 'udp6' : 'udp4');
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`no UDP reply from ${host}:${port} within ${timeoutMs}ms`));
    }, timeoutMs);
    const onMessage = (msg: Buffer): void => {
      cleanup();
      resolve(msg);
    };
    const cleanup = (): void => {
      clearTimeout(timer);
      s.off('message', onMessage);
      if (!socket) s.close();
    };
    s.on('message', onMessage);
    s.send(typeof data === 'string' ? Buffer.from(data) : data, port, host);
  });
}

/**
 * The first of `count` consecutive ports from a random place between 20000 and the kernel's
 * ephemeral range, where no bind to port 0 and no outgoing connection takes a port.
 */
export function portBelowEphemeral(count = 1): number {
  const [ephemeralLow] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
  const top = Math.min(ephemeralLow ?? 32768, 32768) - count;
  return 20000 + Math.floor(Math.random() * (top - 20000));
}

/**
 * The first of `count` consecutive TCP ports free on `host`, below the kernel's ephemeral range:
 * a port the kernel handed out (freePort) has neighbours that other tests' outgoing connections
 * take at any moment, so a run picked there is not free for long.
 */
export async function freePortRun(count: number, host = '127.0.0.1'): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const base = portBelowEphemeral(count);
    const held: Server[] = [];
    try {
      for (let p = base; p < base + count; p++) {
        const server = createServer();
        await new Promise<void>((resolve, reject) => {
          server.once('error', reject);
          server.listen(p, host, resolve);
        });
        held.push(server);
      }
      return base;
    } catch {
      // taken: try another run
    } finally {
      for (const server of held) await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  }
  throw new Error(`no ${count} free consecutive ports`);
}

/** Whether nothing holds host:port (TCP): a listener without SO_REUSEPORT binds there. */
export function portFree(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen({ host, port }, () => probe.close(() => resolve(true)));
  });
}

/** A free TCP and UDP port on loopback, for Service ports in tests (the kernel picks it). */
export async function freePort(host = '127.0.0.1'): Promise<number> {
  for (let i = 0; i < 20; i++) {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, host, resolve));
    const port = (server.address() as AddressInfo).port;
    await new Promise<void>((resolve) => server.close(() => resolve()));
    const udp = createSocket('udp4');
    const ok = await new Promise<boolean>((resolve) => {
      udp.once('error', () => resolve(false));
      udp.bind(port, host, () => resolve(true));
    });
    udp.close();
    if (ok) return port;
  }
  throw new Error('no free port');
}
