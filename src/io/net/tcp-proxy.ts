import { createServer, isIPv4, type AddressInfo, type Server, type Socket } from 'node:net';
import type { LoadBalancer } from '../../core/balancer/load-balancer.js';
import { ServicePortStats } from '../../core/stats.js';
import type { Logger } from '../../seams/logger.js';
import type { Dialer } from '../../seams/dialer.js';
import { DEFAULT_TCP_KEEPALIVE_MS, keepAliveDelayMs } from './direct-dialer.js';
import { isOutOfDescriptors } from './errno.js';
import { listenBacklog } from './listen-backlog.js';
import { hostPort, sourceFilter } from '../../core/address.js';
import type { BoundAddress, ListenAddress, ProxySocket } from '../../seams/proxy-socket.js';
import type { TcpHandOff } from '../../seams/tcp-hand-off.js';
import { systemClock } from '../../core/clock.js';
import { RateLimiter } from '../../core/rate-limiter.js';
import { TcpConnection, UNKNOWN_DESTINATION, type ListenerDestination, type TcpConnectionContext } from './tcp-connection.js';
import { HoldBudget } from './hold-budget.js';
import type { ProxyUnit } from '../../core/units.js';
import type { PortalAddress } from '../../core/model.js';
import { proxyV2Header } from '../../core/proxy-protocol.js';
import { portalDestinations, type PortalDestinations } from '../../core/portal-destination.js';

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
   * 0 turns it off. Set on a client once it has lived through two sweeps (see sweepKeepAlive).
   * The endpoint side is the dialer's (DirectDialer's keepAliveMs).
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
  /** Hold a connection this long while the port has no endpoints (hold-when-empty); 0 (the default) resets it at once. */
  holdWhenEmptyMs?: number;
  /** The bounds on held connections, shared by every port of the process. Default: one of its own. */
  holdBudget?: HoldBudget;
  /**
   * A hold episode began: the first connection held while none was (demand for endpoints: the
   * composition root turns it into a Kubernetes Event). Called synchronously; must not throw.
   */
  onHoldEpisode?: () => void;
  /** Begin every connection to the endpoints with a PROXY protocol v2 header (the unit's proxyProtocol). */
  proxyProtocol?: boolean;
  /**
   * The unit's portals: for a connection NATed to a proxy port, where the client connected, as the
   * PROXY header's destination (core/portal-destination.ts).
   */
  portals?: readonly PortalAddress[];
}

/** Shared by every port until it holds a connection (an empty Set is some 150 bytes a port). */
const NO_HELD = new Set<TcpConnection>();

/**
 * A proxied TCP service port (upstream tcpProxySocket): any number of listeners sharing one
 * balancer, dialer and stats, and the connections they accepted. Each connection is a
 * TcpConnection, which follows its client from accept() to the endpoint and to the end.
 */
export class TcpProxySocket implements ProxySocket, TcpHandOff, TcpConnectionContext {
  readonly protocol = 'TCP' as const;
  readonly stats: ServicePortStats;
  private readonly parentLog: Logger;
  private readonly name: string;
  private childLog: Logger | undefined;
  /** The keepalive delay for accepted clients, in whole seconds' milliseconds; 0: none. */
  private readonly keepAliveMs: number;
  /** Connections whose client is still without keepalive (see sweepKeepAlive). */
  private awaitingKeepAlive = 0;
  private readonly idleTimeoutMs: number;
  private readonly backlog: number;
  /** The next sweep time at which idle connections are looked for. */
  private nextIdleCheckMs = -Infinity;
  // TcpConnectionContext: each connection's way back to its service port. The socket is that
  // context itself, not an object of seven closures beside it (some 600 bytes a port, 6 MB of
  // heap at 10,000 service ports).
  readonly balancer: LoadBalancer;
  readonly dialer: Dialer;
  readonly dialTimeoutsMs: readonly number[];
  proxyProtocol: boolean;
  private readonly listeners = new Map<string, { server: Server; bound: BoundAddress }>();
  private readonly conns = new Set<TcpConnection>();
  /** Connections held for want of endpoints, oldest first (NO_HELD, never written to, until the first). */
  private held: Set<TcpConnection> = NO_HELD;
  private holdMs: number;
  private readonly holdBudget: HoldBudget;
  private readonly onHoldEpisode: (() => void) | undefined;
  private drainWaiters: (() => void)[] | undefined;
  /** Made on the first warning, as bugLines: most service ports never run out. */
  private fdWarnings: RateLimiter | undefined;
  private readonly reusePort: boolean;
  /** close() was called: no listener accepts, and no hand-off is taken. */
  private closed = false;
  private readonly portals: readonly PortalAddress[];
  /** Made on the first PROXY header for a NATed connection. */
  private natDestinations: PortalDestinations | undefined;
  private bugLines: RateLimiter | undefined;

  constructor(opts: TcpProxySocketOptions) {
    this.reusePort = opts.reusePort ?? false;
    this.stats = opts.stats ?? new ServicePortStats();
    this.parentLog = opts.logger;
    this.name = opts.name;
    this.keepAliveMs = keepAliveDelayMs(opts.keepAliveMs ?? DEFAULT_TCP_KEEPALIVE_MS);
    this.idleTimeoutMs = opts.idleTimeoutMs ?? 0;
    this.backlog = opts.backlog ?? listenBacklog();
    this.holdMs = opts.holdWhenEmptyMs ?? 0;
    this.holdBudget = opts.holdBudget ?? new HoldBudget();
    this.onHoldEpisode = opts.onHoldEpisode;
    this.portals = opts.portals ?? [];
    this.balancer = opts.balancer;
    this.dialer = opts.dialer;
    this.dialTimeoutsMs = opts.dialTimeoutsMs ?? DEFAULT_DIAL_TIMEOUTS_MS;
    this.proxyProtocol = opts.proxyProtocol ?? false;
  }

  /**
   * The child logger is made on first use: pino's child() serializes its bindings up front, and
   * with 10,000 service ports that was a tenth of start-up for loggers that mostly never log.
   * The level is the parent's, so level checks ask the parent.
   */
  private get serviceLog(): Logger {
    return (this.childLog ??= this.parentLog.child({ component: 'tcp-proxy', service: this.name }));
  }

  /** TcpConnectionContext: the service port's logger. */
  log(): Logger {
    return this.serviceLog;
  }

  debugEnabled(): boolean {
    return this.parentLog.isLevelEnabled('debug');
  }

  outOfDescriptors(err: unknown): void {
    this.warnOutOfDescriptors(err, 'dial');
  }

  listen(addr: ListenAddress): Promise<BoundAddress> {
    // pauseOnConnect: nothing is read from the client until its endpoint is connected, so bytes wait
    // in the kernel during the dial instead of piling up in memory.
    const server = createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true });
    const to: ListenerDestination = { host: undefined, port: 0 };
    if (addr.sources === undefined) {
      server.on('connection', (client) => this.accept(client, to));
    } else {
      // A load balancer's source ranges: others are reset at once, as kube-proxy drops them.
      const allowed = sourceFilter(addr.sources);
      server.on('connection', (client) => {
        if (allowed(client.remoteAddress ?? '')) this.accept(client, to);
        else this.refuseSource(client);
      });
    }
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      // Registered here, not passed as listen()'s callback: listen() looks for a backlog among its
      // later arguments by turning each into a number, and a function becomes its own source text
      // on the way (32 ms of a 10,000-port start's profile).
      server.once('listening', () => {
        server.off('error', reject);
        // A fixed port on an IPv4 literal is bound as asked; only port 0 (or an IPv6 spelling) needs
        // the getsockname() round trip, which is a few percent of start-up at 10,000 service ports.
        const info = addr.port !== 0 && isIPv4(addr.host) ? undefined : (server.address() as AddressInfo);
        const bound = info ? { host: info.address, port: info.port } : { host: addr.host, port: addr.port };
        Object.assign(to, this.destinationOf(bound, addr.nat === true));
        server.on('error', (err) => this.onListenerError(err, bound));
        this.listeners.set(hostPort(bound), { server, bound });
        resolve(bound);
      });
      // ipv6Only: a listener on :: must not also take the IPv4 port, which another listener may hold.
      server.listen({ host: addr.host, port: addr.port, ipv6Only: addr.host.includes(':'), backlog: this.backlog, reusePort: this.reusePort });
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

  /**
   * Connections held for want of endpoints are reset: the port is gone or made anew, so no
   * endpoint will reach them.
   */
  async close(): Promise<void> {
    this.closed = true;
    for (const bound of this.addresses()) await this.unlisten(bound);
    for (const conn of this.held) {
      this.holdEnded(conn);
      conn.expireHold();
    }
    // At shutdown the sweep stops while the connections drain: those still without keepalive get
    // it now (the held ones, just reset, are only counted down). It finds a vanished client only
    // when the grace period outlasts the keepalive delay and probes (15 s and more by default,
    // against a 10 s grace), as before this moved to the sweep. A retired port is still swept:
    // there it only comes a sweep or two early.
    if (this.awaitingKeepAlive > 0) {
      for (const conn of this.conns) if (conn.keepAliveNow(this.keepAliveMs)) this.awaitingKeepAlive--;
    }
  }

  update(unit: ProxyUnit): void {
    this.holdMs = unit.holdWhenEmptyMs ?? 0;
    // For connections accepted from now on; those already accepted keep what they began with.
    this.proxyProtocol = unit.proxyProtocol !== undefined;
    this.releaseHeld();
  }

  active(): number {
    return this.conns.size;
  }

  drained(): Promise<void> {
    if (this.conns.size === 0) return Promise.resolve();
    return new Promise((resolve) => (this.drainWaiters ??= []).push(resolve));
  }

  destroyAll(): void {
    for (const conn of this.conns) conn.destroy();
  }

  /**
   * From the proxier's one coarse timer, about once a second: keepalive for the clients that have
   * lived through two sweeps (sweepKeepAlive), the end of holds, and the idle limit: every tenth of
   * it (and at least every 10 s), each connection compares its byte counters with the last look,
   * so a connection is closed within a tenth past the limit. Nothing is done per read, and no timer
   * is set per connection.
   */
  sweep(nowMs: number): void {
    if (this.awaitingKeepAlive > 0) this.sweepKeepAlive();
    if (this.held.size > 0) this.sweepHeld(nowMs);
    if (this.idleTimeoutMs <= 0 || nowMs < this.nextIdleCheckMs) return;
    this.nextIdleCheckMs = nowMs + Math.min(this.idleTimeoutMs / 10, 10_000);
    for (const conn of this.conns) conn.sweepIdle(nowMs, this.idleTimeoutMs);
  }

  /**
   * Keepalive for the clients that have lived through two sweeps (one to two seconds, at the
   * sweep's pace of about one a second): keepalive only matters to a connection idle for the whole
   * delay (15 s by default), so a short connection, the common kind, never needs it, and a
   * listener's own setting (which Linux copies to every socket accept() returns) would cost four
   * setsockopt() calls per listening port at start-up (60 ms of a 10,000-port start's profile). A
   * client is never touched while no connection of the port awaits it; while some do, every open
   * one is looked at (one field) once a sweep: on a port with new connections all the time and
   * 100,000 long-lived ones, a millisecond a second.
   */
  private sweepKeepAlive(): void {
    for (const conn of this.conns) if (conn.keepAliveOnceLived(this.keepAliveMs)) this.awaitingKeepAlive--;
  }

  /**
   * TcpHandOff: a client accepted by the SOCKS/CONNECT front, taken as a listener's would be. Its
   * listener's option is set here instead (no Nagle), since no listener of ours made it; keepalive
   * comes as to every client (sweepKeepAlive).
   */
  adopt(client: Socket, written: number): boolean {
    if (this.closed) return false;
    client.setNoDelay(true);
    // The front's client: where it connected is the front, not a Service address of ours.
    this.accept(client, UNKNOWN_DESTINATION, written);
    return true;
  }

  /** A client outside the load balancer's source ranges: reset before anything is read, counted. */
  private refuseSource(client: Socket): void {
    this.stats.sourceRejects++;
    if (this.debugEnabled()) this.serviceLog.debug({ client: client.remoteAddress }, 'client outside loadBalancerSourceRanges: reset');
    client.on('error', () => undefined);
    client.resetAndDestroy();
  }

  private accept(client: Socket, to: ListenerDestination, written = 0): void {
    this.stats.accepted++;
    this.stats.active++;
    const conn = new TcpConnection(this, client, to, written);
    this.conns.add(conn);
    if (this.keepAliveMs > 0) this.awaitingKeepAlive++;
    conn.start();
  }

  /**
   * Where the clients of a listener connected, for PROXY headers: the address it is bound to, or,
   * when the portal NATs to it (a proxy port), the one portal of its family the client can have
   * connected to, if the unit's portals leave no choice. Unknown for a wildcard listener and for a
   * proxy port several portals lead to (node ports, several addresses): then each connection's
   * local address is read (for a proxy port, the node's address and the proxy port).
   */
  private destinationOf(bound: BoundAddress, nat: boolean): ListenerDestination {
    const family = bound.host.includes(':') ? 6 : 4;
    if (nat) {
      this.natDestinations ??= portalDestinations(this.portals);
      const portal = this.natDestinations[family];
      return portal === undefined ? { host: undefined, port: 0 } : { host: portal.host, port: portal.port };
    }
    const wildcard = bound.host === '0.0.0.0' || bound.host === '::' || bound.host === '';
    return wildcard ? { host: undefined, port: 0 } : { host: bound.host, port: bound.port };
  }

  /**
   * The PROXY v2 header for one accepted client: its address and port, and what it connected to
   * (`to`, else the socket's local address). Undefined when the client is already gone.
   */
  proxyHeader(client: Socket, to: ListenerDestination): Uint8Array | undefined {
    const sourceAddress = client.remoteAddress;
    const sourcePort = client.remotePort;
    // getsockname() only when the listener cannot tell.
    const destinationAddress = to.host ?? client.localAddress;
    const destinationPort = to.host === undefined ? client.localPort : to.port;
    if (sourceAddress === undefined || sourcePort === undefined || destinationAddress === undefined || destinationPort === undefined) return undefined;
    try {
      return proxyV2Header({ sourceAddress, sourcePort, destinationAddress, destinationPort });
    } catch (err) {
      // The kernel's addresses did not encode: a bug, said at most once a second.
      const suppressed = (this.bugLines ??= new RateLimiter(1000, systemClock.now)).take();
      if (suppressed !== undefined) this.serviceLog.error({ err, suppressed }, 'bug: cannot encode the PROXY protocol header: connection reset');
      return undefined;
    }
  }

  /** Within both bounds, and only while the Service asks for it: otherwise reset at once, as ever. */
  hold(conn: TcpConnection): boolean {
    const budget = this.holdBudget;
    if (this.holdMs <= 0 || this.held.size >= budget.maxPerServicePort || budget.held >= budget.maxPerNode) return false;
    if (this.held === NO_HELD) this.held = new Set();
    this.held.add(conn);
    budget.held++;
    this.stats.held++;
    this.stats.heldTotal++;
    if (this.held.size === 1) this.onHoldEpisode?.();
    return true;
  }

  holdEnded(conn: TcpConnection): void {
    if (!this.held.delete(conn)) return;
    this.holdBudget.held--;
    this.stats.held--;
  }

  /** Endpoints appeared: every held connection is dialed, in the order they came. */
  private releaseHeld(): void {
    if (this.held.size === 0) return;
    if (this.balancer.endpoints.length === 0) {
      // The Service no longer asks for holding: as if it never had.
      if (this.holdMs <= 0) this.sweepHeld(Infinity);
      return;
    }
    for (const conn of this.held) {
      this.holdEnded(conn);
      conn.leaveHold();
    }
  }

  /**
   * From the coarse sweep: the hold ran out for the oldest ones. Endpoints that came without an
   * update (none is expected) are caught up with here too.
   */
  private sweepHeld(nowMs: number): void {
    if (this.balancer.endpoints.length > 0) {
      this.releaseHeld();
      return;
    }
    for (const conn of this.held) {
      if (nowMs - conn.heldSince < this.holdMs) break; // oldest first: the rest are younger
      this.holdEnded(conn);
      conn.expireHold();
    }
  }

  released(conn: TcpConnection): void {
    this.conns.delete(conn);
    if (this.keepAliveMs > 0 && conn.awaitsKeepAlive) this.awaitingKeepAlive--;
    this.stats.active--;
    if (this.conns.size === 0) this.notifyDrained();
  }

  private notifyDrained(): void {
    // Runs whenever the port's last connection closes (every connection, on a quiet port).
    const waiters = this.drainWaiters;
    if (waiters === undefined) return;
    this.drainWaiters = undefined;
    for (const resolve of waiters) resolve();
  }

  private onListenerError(err: Error, bound: BoundAddress): void {
    // libuv absorbs most accept EMFILEs itself (it closes the pending connections with a reserved
    // descriptor); those that surface are logged the same way as a dial's.
    if (isOutOfDescriptors(err)) this.warnOutOfDescriptors(err, 'accept');
    else this.serviceLog.error({ err, address: hostPort(bound) }, 'listener error');
  }

  private warnOutOfDescriptors(err: unknown, during: 'accept' | 'dial'): void {
    const held = (this.fdWarnings ??= new RateLimiter(1000, systemClock.now)).take();
    if (held === undefined) return;
    this.serviceLog.warn({ err, during, suppressed: held }, 'out of file descriptors: connection dropped');
  }
}
