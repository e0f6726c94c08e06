import { createServer, isIPv4, type AddressInfo, type OnReadOpts, type Server, type Socket } from 'node:net';
import type { LoadBalancer } from '../../core/balancer/load-balancer.js';
import type { Endpoint } from '../../core/model.js';
import { ServicePortStats } from '../../core/stats.js';
import type { Logger } from '../../seams/logger.js';
import type { Dialer, DialRequest } from '../../seams/dialer.js';
import { dialFailureReason, isOutOfDescriptors } from './errno.js';
import { hostPort } from '../../core/address.js';
import type { BoundAddress, ListenAddress, ProxySocket } from '../../seams/proxy-socket.js';
import { systemClock } from '../../core/clock.js';
import { RateLimiter } from '../../core/rate-limiter.js';
import { catchUp, readInto, relay, relayEnd, resetSocket, type EndpointReads, type TcpConn } from './tcp-conn.js';

/** Upstream's endpointDialTimeout: one attempt per entry, each on a freshly picked endpoint. */
export const DEFAULT_DIAL_TIMEOUTS_MS: readonly number[] = [250, 500, 1000, 2000];

export interface TcpProxySocketOptions {
  /** The service port key, for logs. */
  name: string;
  balancer: LoadBalancer;
  dialer: Dialer;
  logger: Logger;
  stats?: ServicePortStats;
  dialTimeoutsMs?: readonly number[];
  /**
   * SO_REUSEPORT on every listener: the worker processes of one node (`--workers`) each listen on
   * the same addresses, and the kernel spreads new connections over them.
   */
  reusePort?: boolean;
}

/**
 * A proxied TCP service port (upstream tcpProxySocket): any number of listeners sharing one
 * balancer, dialer and stats. Each accepted client is spliced to one endpoint; bytes are copied
 * both ways with backpressure and half-close passed through.
 */
export class TcpProxySocket implements ProxySocket {
  readonly protocol = 'TCP' as const;
  readonly stats: ServicePortStats;
  private readonly balancer: LoadBalancer;
  private readonly dialer: Dialer;
  private readonly parentLog: Logger;
  private readonly name: string;
  private childLog: Logger | undefined;
  private readonly dialTimeoutsMs: readonly number[];
  private readonly listeners = new Map<string, { server: Server; bound: BoundAddress }>();
  private readonly conns = new Set<TcpConn>();
  private drainWaiters: (() => void)[] = [];
  private readonly fdWarnings = new RateLimiter(1000, systemClock.now);
  private readonly reusePort: boolean;

  constructor(opts: TcpProxySocketOptions) {
    this.reusePort = opts.reusePort ?? false;
    this.stats = opts.stats ?? new ServicePortStats();
    this.balancer = opts.balancer;
    this.dialer = opts.dialer;
    this.parentLog = opts.logger;
    this.name = opts.name;
    this.dialTimeoutsMs = opts.dialTimeoutsMs ?? DEFAULT_DIAL_TIMEOUTS_MS;
  }

  /**
   * The child logger is made on first use: pino's child() serializes its bindings up front, and
   * with 10,000 service ports that was a tenth of start-up for loggers that mostly never log.
   * The level is the parent's, so level checks ask the parent.
   */
  private get log(): Logger {
    return (this.childLog ??= this.parentLog.child({ component: 'tcp-proxy', service: this.name }));
  }

  private debugEnabled(): boolean {
    return this.parentLog.isLevelEnabled('debug');
  }

  listen(addr: ListenAddress): Promise<BoundAddress> {
    // pauseOnConnect: nothing is read from the client until its endpoint is connected, so bytes wait
    // in the kernel during the dial instead of piling up in memory.
    const server = createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true });
    server.on('connection', (client) => this.accept(client));
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      // ipv6Only: a listener on :: must not also take the IPv4 port, which another listener may hold.
      server.listen({ host: addr.host, port: addr.port, ipv6Only: addr.host.includes(':'), reusePort: this.reusePort }, () => {
        server.off('error', reject);
        // A fixed port on an IPv4 literal is bound as asked; only port 0 (or an IPv6 spelling) needs
        // the getsockname() round trip, which is a few percent of start-up at 10,000 service ports.
        const info = addr.port !== 0 && isIPv4(addr.host) ? undefined : (server.address() as AddressInfo);
        const bound = info ? { host: info.address, port: info.port } : { host: addr.host, port: addr.port };
        server.on('error', (err) => this.onListenerError(err, bound));
        this.listeners.set(hostPort(bound), { server, bound });
        resolve(bound);
      });
    });
  }

  addresses(): BoundAddress[] {
    return [...this.listeners.values()].map((l) => ({ ...l.bound }));
  }

  async unlisten(addr: BoundAddress): Promise<void> {
    const key = hostPort(addr);
    const listener = this.listeners.get(key);
    if (!listener) return; // already gone is not a failure
    this.listeners.delete(key);
    // The listening descriptor is closed at once; server.close()'s callback would wait for every
    // connection it accepted, which live on by design.
    listener.server.close();
  }

  async close(): Promise<void> {
    for (const bound of this.addresses()) await this.unlisten(bound);
  }

  active(): number {
    return this.conns.size;
  }

  drained(): Promise<void> {
    if (this.conns.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.drainWaiters.push(resolve));
  }

  destroyAll(): void {
    for (const conn of this.conns) {
      resetSocket(conn.client);
      if (conn.upstream) resetSocket(conn.upstream);
    }
  }

  sweep(_nowMs: number): void {
    // Nothing idles out on TCP: connections end when their peers end them.
  }

  private accept(client: Socket): void {
    this.stats.accepted++;
    // The client's address costs a getpeername(): asked only when a pick or a debug line uses it.
    let clientIP = '';
    if (this.balancer.usesClientIP || this.debugEnabled()) {
      const ip = client.remoteAddress;
      if (ip === undefined) {
        client.destroy(); // the client left before we saw it
        return;
      }
      clientIP = ip;
    }
    const conn: TcpConn = { client, clientIP, upstream: undefined, endpoint: undefined, dialing: false, holds: 1 };
    this.conns.add(conn);
    this.stats.active++;
    client.on('error', (err) => this.onSideError(conn, 'client', err));
    // 'close' comes once; on() spares once()'s wrapper.
    client.on('close', () => this.release(conn));
    this.route(conn);
  }

  /** Pick the first endpoint synchronously, so a port without endpoints resets before any I/O. */
  private route(conn: TcpConn): void {
    const endpoint = this.balancer.nextEndpoint(conn.clientIP, false);
    if (endpoint === undefined) {
      this.stats.noEndpointRejects++;
      if (this.debugEnabled()) this.log.debug({ client: conn.clientIP }, 'no endpoints: resetting client');
      resetSocket(conn.client);
      return;
    }
    conn.dialing = true;
    conn.holds++;
    this.dial(conn, endpoint, 0);
  }

  /**
   * Upstream tryConnect: one attempt per dial timeout, each after the first on an endpoint picked
   * afresh with sessionAffinityReset, so a sticky client is not stuck on a dead endpoint. Plain
   * promise callbacks rather than an async loop: this runs for every connection.
   */
  private dial(conn: TcpConn, endpoint: Endpoint, attempt: number): void {
    this.stats.dialAttempts++;
    const started = performance.now();
    // The endpoint's bytes go to the client from its first read; splice() catches up on the rest.
    const reads = readInto(conn.client);
    let dialed: Promise<Socket>;
    try {
      dialed = this.dialer.dial(new ClientDial(conn.client, conn.clientIP, endpoint, this.dialTimeoutsMs[attempt] as number, reads));
    } catch (err) {
      dialed = Promise.reject(err instanceof Error ? err : new Error(String(err))); // a dialer that throws has failed like one that rejects
    }
    dialed.then(
      (upstream) => {
        this.stats.observeDialLatency((performance.now() - started) / 1000);
        this.guard(conn, () => this.splice(conn, endpoint, upstream, reads));
      },
      (err: unknown) => this.guard(conn, () => this.retry(conn, endpoint, attempt, err)),
    );
  }

  private retry(conn: TcpConn, failed: Endpoint, attempt: number, err: unknown): void {
    this.onDialFailed(conn, failed, err);
    // Another endpoint would fail the same way, and a client that is gone needs no endpoint.
    const next = attempt + 1 < this.dialTimeoutsMs.length && !isOutOfDescriptors(err) && !conn.client.destroyed ? this.balancer.nextEndpoint(this.pickIP(conn), true) : undefined;
    if (next === undefined) this.giveUp(conn);
    else this.dial(conn, next, attempt + 1);
  }

  /**
   * The client IP for a retry's pick: the Service may have turned ClientIP affinity on since the
   * connection was accepted without looking its address up.
   */
  private pickIP(conn: TcpConn): string {
    if (conn.clientIP !== '' || !this.balancer.usesClientIP) return conn.clientIP;
    return conn.client.remoteAddress ?? '';
  }

  /** A throw in the dial path is a bug: it must not end the process, nor leave the client hanging. */
  private guard(conn: TcpConn, step: () => void): void {
    try {
      step();
    } catch (err) {
      this.log.error({ err }, 'bug: dial loop failed');
      resetSocket(conn.client);
      this.endDial(conn);
    }
  }

  private onDialFailed(conn: TcpConn, endpoint: Endpoint, err: unknown): void {
    this.stats.dialFailures[dialFailureReason(err)]++;
    // Every endpoint handed out is handed back, so a least-connections balancer keeps true counts.
    this.balancer.release(endpoint);
    if (isOutOfDescriptors(err)) this.warnOutOfDescriptors(err, 'dial');
    else if (this.debugEnabled()) this.log.debug({ err, client: conn.clientIP, endpoint: endpoint.addr }, 'dial failed');
  }

  private giveUp(conn: TcpConn): void {
    // A client cut while we dialed (destroyAll) was not turned away for want of an endpoint.
    if (!conn.client.destroyed) this.stats.dialExhausted++;
    if (this.debugEnabled()) this.log.debug({ client: conn.clientIP }, 'no endpoint could be dialed: resetting client');
    resetSocket(conn.client);
    this.endDial(conn);
  }

  private endDial(conn: TcpConn): void {
    if (!conn.dialing) return;
    conn.dialing = false;
    this.release(conn);
  }

  /** Copy both ways; each side's end is passed on to the other, which passes half-close on. */
  private splice(conn: TcpConn, endpoint: Endpoint, upstream: Socket, reads: EndpointReads): void {
    conn.endpoint = endpoint;
    conn.upstream = upstream;
    conn.holds++; // the upstream socket, released on its 'close'
    upstream.on('error', (err) => this.onSideError(conn, 'endpoint', err));
    // A dialer that resolved late may hand over a socket that has closed meanwhile.
    if (upstream.closed) queueMicrotask(() => this.release(conn));
    else upstream.on('close', () => this.release(conn));
    this.endDial(conn);
    if (conn.client.destroyed) {
      upstream.destroy(); // cut (destroyAll) or gone while we dialed
      return;
    }
    if (upstream.destroyed && !upstream.readableEnded) {
      // Failed after connecting, before the hand-over (its 'error' went to the dialer): as an
      // error on the endpoint side, the client is reset rather than left waiting.
      resetSocket(conn.client);
      return;
    }
    if (this.debugEnabled()) this.log.debug({ client: conn.clientIP, endpoint: endpoint.addr }, 'connected');
    relay(conn.client, upstream);
    relayEnd(upstream, conn.client);
    catchUp(upstream, conn.client, reads);
  }

  /**
   * An error on one side ends the connection: the other side is reset rather than ended, so the
   * peer cannot mistake a truncated stream for a complete one.
   */
  private onSideError(conn: TcpConn, side: 'client' | 'endpoint', err: Error): void {
    if (this.debugEnabled()) this.log.debug({ err, client: conn.clientIP, endpoint: conn.endpoint?.addr, side }, 'connection error');
    const other = side === 'client' ? conn.upstream : conn.client;
    if (other) resetSocket(other);
  }

  private release(conn: TcpConn): void {
    conn.holds--;
    if (conn.holds > 0) return;
    this.conns.delete(conn);
    this.stats.active--;
    this.stats.bytesToClient += conn.client.bytesWritten;
    if (conn.upstream) this.stats.bytesToEndpoint += conn.upstream.bytesWritten;
    if (conn.endpoint) this.balancer.release(conn.endpoint);
    if (this.debugEnabled()) {
      this.log.debug({ client: conn.clientIP, endpoint: conn.endpoint?.addr, toEndpoint: conn.upstream?.bytesWritten, toClient: conn.client.bytesWritten }, 'connection closed');
    }
    if (this.conns.size === 0) this.notifyDrained();
  }

  private notifyDrained(): void {
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const resolve of waiters) resolve();
  }

  private onListenerError(err: Error, bound: BoundAddress): void {
    // libuv absorbs most accept EMFILEs itself (it closes the pending connections with a reserved
    // descriptor); those that surface are logged the same way as a dial's.
    if (isOutOfDescriptors(err)) this.warnOutOfDescriptors(err, 'accept');
    else this.log.error({ err, address: hostPort(bound) }, 'listener error');
  }

  private warnOutOfDescriptors(err: unknown, during: 'accept' | 'dial'): void {
    const held = this.fdWarnings.take();
    if (held === undefined) return;
    this.log.warn({ err, during, suppressed: held }, 'out of file descriptors: connection dropped');
  }
}

/**
 * One dial for one client. The addresses are read only if the dialer asks: each is a
 * getpeername() or getsockname(), and the direct dialer asks for none.
 */
class ClientDial implements DialRequest {
  constructor(
    private readonly client: Socket,
    private readonly clientIP: string,
    readonly endpoint: Endpoint,
    readonly timeoutMs: number,
    readonly onread: OnReadOpts,
  ) {}

  get clientAddress(): string {
    return this.clientIP || (this.client.remoteAddress ?? '');
  }

  get clientPort(): number {
    return this.client.remotePort ?? 0;
  }

  get localAddress(): string {
    return this.client.localAddress ?? '';
  }

  get localPort(): number {
    return this.client.localPort ?? 0;
  }
}
