import { createServer, isIPv4, type AddressInfo, type Server, type Socket } from 'node:net';
import type { LoadBalancer } from '../../core/balancer/load-balancer.js';
import { ServicePortStats } from '../../core/stats.js';
import type { Logger } from '../../seams/logger.js';
import type { Dialer } from '../../seams/dialer.js';
import { DEFAULT_TCP_KEEPALIVE_MS } from './direct-dialer.js';
import { isOutOfDescriptors } from './errno.js';
import { listenBacklog } from './listen-backlog.js';
import { hostPort } from '../../core/address.js';
import type { BoundAddress, ListenAddress, ProxySocket } from '../../seams/proxy-socket.js';
import { systemClock } from '../../core/clock.js';
import { RateLimiter } from '../../core/rate-limiter.js';
import { TcpConnection, type TcpConnectionContext } from './tcp-connection.js';

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
   * TCP keepalive on accepted clients: probes after this long without traffic, so a client that
   * vanished without FIN or RST is found out (Go's 15 s). Whole seconds (the kernel's unit);
   * 0 turns it off. The endpoint side is the dialer's (DirectDialer's keepAliveMs).
   */
  keepAliveMs?: number;
  /** Close a connection after this long without a byte either way; 0 (the default) never does. */
  idleTimeoutMs?: number;
  /** The listen backlog; by default net.core.somaxconn, as Go does. */
  backlog?: number;
  /**
   * SO_REUSEPORT on every listener: the worker processes of one node (`--workers`) each listen on
   * the same addresses, and the kernel spreads new connections over them.
   */
  reusePort?: boolean;
}

/**
 * A proxied TCP service port (upstream tcpProxySocket): any number of listeners sharing one
 * balancer, dialer and stats, and the connections they accepted. Each connection is a
 * TcpConnection, which follows its client from accept() to the endpoint and to the end.
 */
export class TcpProxySocket implements ProxySocket {
  readonly protocol = 'TCP' as const;
  readonly stats: ServicePortStats;
  private readonly parentLog: Logger;
  private readonly name: string;
  private childLog: Logger | undefined;
  private readonly keepAliveMs: number;
  private readonly idleTimeoutMs: number;
  private readonly backlog: number;
  /** The next sweep time at which idle connections are looked for. */
  private nextIdleCheckMs = -Infinity;
  private readonly ctx: TcpConnectionContext;
  private readonly listeners = new Map<string, { server: Server; bound: BoundAddress }>();
  private readonly conns = new Set<TcpConnection>();
  private drainWaiters: (() => void)[] = [];
  private readonly fdWarnings = new RateLimiter(1000, systemClock.now);
  private readonly reusePort: boolean;

  constructor(opts: TcpProxySocketOptions) {
    this.reusePort = opts.reusePort ?? false;
    this.stats = opts.stats ?? new ServicePortStats();
    this.parentLog = opts.logger;
    this.name = opts.name;
    this.keepAliveMs = opts.keepAliveMs ?? DEFAULT_TCP_KEEPALIVE_MS;
    this.idleTimeoutMs = opts.idleTimeoutMs ?? 0;
    this.backlog = opts.backlog ?? listenBacklog();
    this.ctx = {
      balancer: opts.balancer,
      dialer: opts.dialer,
      stats: this.stats,
      dialTimeoutsMs: opts.dialTimeoutsMs ?? DEFAULT_DIAL_TIMEOUTS_MS,
      log: () => this.log,
      debugEnabled: () => this.parentLog.isLevelEnabled('debug'),
      outOfDescriptors: (err) => this.warnOutOfDescriptors(err, 'dial'),
      released: (conn) => this.released(conn),
    };
  }

  /**
   * The child logger is made on first use: pino's child() serializes its bindings up front, and
   * with 10,000 service ports that was a tenth of start-up for loggers that mostly never log.
   * The level is the parent's, so level checks ask the parent.
   */
  private get log(): Logger {
    return (this.childLog ??= this.parentLog.child({ component: 'tcp-proxy', service: this.name }));
  }

  listen(addr: ListenAddress): Promise<BoundAddress> {
    // pauseOnConnect: nothing is read from the client until its endpoint is connected, so bytes wait
    // in the kernel during the dial instead of piling up in memory.
    const server = createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true });
    server.on('connection', (client) => this.accept(client));
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      // ipv6Only: a listener on :: must not also take the IPv4 port, which another listener may hold.
      server.listen({ host: addr.host, port: addr.port, ipv6Only: addr.host.includes(':'), backlog: this.backlog, reusePort: this.reusePort }, () => {
        server.off('error', reject);
        this.keepAliveOnAccepted(server);
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

  /**
   * Keepalive for accepted clients, set once on the listening socket: Linux copies a listener's
   * socket options (SO_KEEPALIVE and the TCP_KEEP* timings among them) to every socket accept()
   * returns, with the keepalive timer running. Node's own keepAlive option would set them again on
   * each accepted socket: four setsockopt() calls per connection, about 2 µs of CPU. Node offers no
   * public call on a listening socket, hence its handle; a server without a TCP handle of its own
   * (a cluster worker under round-robin scheduling) sets it on each accepted socket instead.
   */
  private keepAliveOnAccepted(server: Server): void {
    if (this.keepAliveMs <= 0) return;
    const handle = (server as unknown as { _handle?: { setKeepAlive?: (on: boolean, delaySeconds: number) => number } })._handle;
    const seconds = Math.max(1, Math.floor(this.keepAliveMs / 1000));
    if (typeof handle?.setKeepAlive === 'function' && handle.setKeepAlive(true, seconds) === 0) return;
    server.prependListener('connection', (client: Socket) => client.setKeepAlive(true, seconds * 1000));
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
    for (const conn of this.conns) conn.destroy();
  }

  /**
   * The idle limit: every tenth of it (and at least every 10 s), each connection compares its byte
   * counters with the last look, so a connection is closed within a tenth past the limit. Nothing is done per read, and no timer is set per
   * connection (the proxier's one coarse timer calls this).
   */
  sweep(nowMs: number): void {
    if (this.idleTimeoutMs <= 0 || nowMs < this.nextIdleCheckMs) return;
    this.nextIdleCheckMs = nowMs + Math.min(this.idleTimeoutMs / 10, 10_000);
    for (const conn of this.conns) conn.sweepIdle(nowMs, this.idleTimeoutMs);
  }

  private accept(client: Socket): void {
    this.stats.accepted++;
    this.stats.active++;
    const conn = new TcpConnection(this.ctx, client);
    this.conns.add(conn);
    conn.start();
  }

  private released(conn: TcpConnection): void {
    this.conns.delete(conn);
    this.stats.active--;
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
