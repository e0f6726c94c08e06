import { createSocket, type RemoteInfo, type Socket as DgramSocket } from 'node:dgram';
import { lookup as dnsLookup } from 'node:dns';
import { isIP, isIPv6 } from 'node:net';
import type { LoadBalancer } from '../../core/balancer/load-balancer.js';
import { ServicePortStats } from '../../core/stats.js';
import { errnoCode } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';
import { isOutOfDescriptors } from './errno.js';
import { hostPort, sourceFilter } from '../../core/address.js';
import type { BoundAddress, CloseOptions, ListenAddress, ProxySocket } from '../../seams/proxy-socket.js';
import { systemClock } from '../../core/clock.js';
import { RateLimiter } from '../../core/rate-limiter.js';
import { UdpReceiveBuffers } from './udp-receive-buffers.js';
import { clientKey, type UdpListener, type UdpSession } from './udp-session.js';
import { SessionOrder } from './udp-session-order.js';
import { handOverPeer, openReplySocket, queueRead } from './udp-hand-over.js';
import type { ProxyUnit } from '../../core/units.js';

/** kube-proxy's --udp-timeout default. */
export const DEFAULT_UDP_IDLE_TIMEOUT_MS = 250;
export const DEFAULT_UDP_MAX_SESSIONS = 4096;
/** Datagrams held per session while its socket connects (a few event-loop ticks at most). */
const MAX_PENDING_DATAGRAMS = 64;
/**
 * Datagrams queued per service port while it has no endpoints and holds (hold-when-empty): enough
 * for the retries of a few clients' DNS-like exchanges, not a buffer for a stream.
 */
export const MAX_HELD_DATAGRAMS = 256;
export const MAX_HELD_DATAGRAM_BYTES = 1024 * 1024;
/** A handed-over listener is closed once its queue is read: at least this long after it is connected away... */
const HAND_OVER_SETTLE_MS = 20;
/** ...and read for at most this long (only its own address could still send to it). */
const HAND_OVER_MAX_MS = 5000;

/** A datagram that came while there were no endpoints, waiting for one. */
interface HeldDatagram {
  listener: UdpListener;
  msg: Buffer;
  address: string;
  port: number;
  /** performance.now() when it came. */
  at: number;
}

export interface UdpProxySocketOptions {
  /** The service port key, for logs. */
  name: string;
  balancer: LoadBalancer;
  logger: Logger;
  stats?: ServicePortStats;
  idleTimeoutMs?: number;
  maxSessions?: number;
  /**
   * Sizes the listeners' receive buffers and counts their drops; share one per process with
   * metrics, which refresh it at scrape time. Default: one of its own, which no one reads.
   */
  receiveBuffers?: UdpReceiveBuffers;
  /**
   * SO_REUSEPORT on every listener (`--workers`): the kernel hashes each client's flow (its
   * addresses and ports) to one of the workers' sockets, so a client's datagrams keep reaching
   * the worker that holds its session.
   */
  reusePort?: boolean;
  /** Queue datagrams this long while the port has no endpoints (hold-when-empty); 0 (the default) drops them. */
  holdWhenEmptyMs?: number;
  /** A hold episode began: the first datagram queued while none was (see TcpProxySocketOptions). */
  onHoldEpisode?: () => void;
}

/**
 * A proxied UDP service port (upstream udpProxySocket). Each client address gets a session: its
 * own connected socket to one endpoint, so the endpoint's replies can be told apart per client and
 * ICMP errors reach us. Replies go back from the listener socket, i.e. from the service's address.
 * Sessions idle out through sweep(), called from the proxier's one coarse timer. They are kept in
 * order of activity (SessionOrder), so neither the sweep nor a reclaim at maxSessions scans them.
 *
 * Node reads every datagram into a 64 KiB buffer, so datagrams up to 65507 bytes pass intact (the
 * Go proxy read into 4 KiB and truncated).
 */
export class UdpProxySocket implements ProxySocket {
  readonly protocol = 'UDP' as const;
  readonly stats: ServicePortStats;
  private readonly balancer: LoadBalancer;
  private readonly parentLog: Logger;
  private readonly name: string;
  private childLog: Logger | undefined;
  private readonly idleTimeoutMs: number;
  private readonly maxSessions: number;
  private readonly listeners = new Map<string, UdpListener>();
  private readonly order = new SessionOrder();
  private readonly receiveBuffers: UdpReceiveBuffers;
  private sessionCount = 0;
  private holdMs: number;
  private held: HeldDatagram[] = [];
  private heldBytes = 0;
  private readonly onHoldEpisode: (() => void) | undefined;
  private drainWaiters: (() => void)[] = [];
  /** One line a second at most per kind of trouble; each limiter made on its first line (most ports never log). */
  private limiters: Partial<Record<'reclaim' | 'fd' | 'listener' | 'replySocket', RateLimiter>> | undefined;
  /** Reply sockets of ended sessions still read to the end of their queues (closeReplySocket). */
  private readonly replySocketsClosing = new Set<DgramSocket>();
  /** destroyAll() under way: reply sockets close at once. */
  private cutting = false;
  private readonly reusePort: boolean;

  constructor(opts: UdpProxySocketOptions) {
    this.reusePort = opts.reusePort ?? false;
    this.stats = opts.stats ?? new ServicePortStats();
    this.balancer = opts.balancer;
    this.parentLog = opts.logger;
    this.name = opts.name;
    this.idleTimeoutMs = opts.idleTimeoutMs ?? DEFAULT_UDP_IDLE_TIMEOUT_MS;
    this.maxSessions = Math.max(1, opts.maxSessions ?? DEFAULT_UDP_MAX_SESSIONS);
    this.receiveBuffers = opts.receiveBuffers ?? new UdpReceiveBuffers({ logger: opts.logger });
    this.holdMs = opts.holdWhenEmptyMs ?? 0;
    this.onHoldEpisode = opts.onHoldEpisode;
  }

  private limiter(kind: 'reclaim' | 'fd' | 'listener' | 'replySocket'): RateLimiter {
    const limiters = (this.limiters ??= {});
    return (limiters[kind] ??= new RateLimiter(1000, systemClock.now));
  }

  /** Made on first use, as in TcpProxySocket: most service ports never log. */
  private get log(): Logger {
    return (this.childLog ??= this.parentLog.child({ component: 'udp-proxy', service: this.name }));
  }

  private debugEnabled(): boolean {
    return this.parentLog.isLevelEnabled('debug');
  }

  listen(addr: ListenAddress): Promise<BoundAddress> {
    const socket = createSocket({ type: isIPv6(addr.host) ? 'udp6' : 'udp4', ipv6Only: isIPv6(addr.host), lookup: literalLookup, reusePort: this.reusePort });
    return new Promise((resolve, reject) => {
      const onBindError = (err: Error): void => {
        closeQuietly(socket);
        reject(err);
      };
      socket.once('error', onBindError);
      socket.bind({ address: addr.host, port: addr.port }, () => {
        socket.off('error', onBindError);
        const info = socket.address();
        const bound = { host: info.address, port: info.port };
        const listener: UdpListener = { socket, bound, sessions: new Map(), refused: new Set(), ...(addr.sources === undefined ? {} : { allowed: sourceFilter(addr.sources) }) };
        socket.on('message', (msg, rinfo) => this.onClientDatagram(listener, msg, rinfo));
        socket.on('error', (err) => this.onListenerError(bound, err));
        this.receiveBuffers.watch(socket, bound, this.stats);
        this.listeners.set(hostPort(bound), listener);
        resolve(bound);
      });
    });
  }

  addresses(): BoundAddress[] {
    return [...this.listeners.values()].map((l) => ({ ...l.bound }));
  }

  /**
   * Unlike TCP, the listener's sessions end with it: their replies leave through the listener
   * socket, so once it is closed they could not reach their clients.
   */
  async unlisten(addr: BoundAddress): Promise<void> {
    const key = hostPort(addr);
    const listener = this.listeners.get(key);
    if (!listener) return; // already gone is not a failure
    this.listeners.delete(key);
    for (const session of listener.sessions.values()) this.endSession(session);
    if (this.held.length > 0) this.dropHeld((d) => d.listener === listener, false);
    this.receiveBuffers.unwatch(listener.socket);
    closeQuietly(listener.socket);
  }

  /**
   * `handOver` (a successor listens beside us, SO_REUSEPORT): sessions live on, each replying
   * through a socket of its own, and every datagram queued on a listener is still served
   * (udp-hand-over.ts). Resolves once the listeners are closed.
   */
  async close(opts?: CloseOptions): Promise<void> {
    if (opts?.handOver === true && this.reusePort) {
      const listeners = [...this.listeners.values()];
      this.listeners.clear();
      await Promise.all(listeners.map((l) => this.handOver(l)));
      return;
    }
    for (const bound of this.addresses()) await this.unlisten(bound);
  }

  /**
   * Sessions first get their reply sockets (their clients' next datagrams reach those), then the
   * listener is connected away from the group and read to the end of its queue.
   */
  private async handOver(listener: UdpListener): Promise<void> {
    const watch = { read: false };
    listener.handOver = watch;
    // Swapped rather than tested on every datagram: the listener's path stays as it was until now.
    listener.socket.removeAllListeners('message');
    listener.socket.on('message', (msg, rinfo) => {
      watch.read = true;
      this.onClientDatagram(listener, msg, rinfo);
    });
    if (this.held.length > 0) this.dropHeld((d) => d.listener === listener, false);
    for (const session of [...listener.sessions.values()]) this.replyOnOwnSocket(session);
    const peer = handOverPeer(listener.bound);
    const failed = await new Promise<Error | undefined>((resolve) => {
      try {
        listener.socket.connect(peer.port, peer.host, (err?: Error) => resolve(err));
      } catch (err) {
        resolve(err instanceof Error ? err : new Error(String(err)));
      }
    });
    if (failed === undefined) await queueRead(watch, HAND_OVER_SETTLE_MS, HAND_OVER_MAX_MS);
    else if (!UdpProxySocket.saidConnectFailed) {
      UdpProxySocket.saidConnectFailed = true;
      this.log.warn({ err: failed, address: hostPort(listener.bound), peer: hostPort(peer) }, 'cannot take a UDP listener out of its SO_REUSEPORT group (connect failed): closing it at once, so datagrams queued on it are lost; its sessions reply through sockets of their own');
    }
    this.receiveBuffers.unwatch(listener.socket);
    closeQuietly(listener.socket);
  }

  /** Said once per process: the fallback is the same for every listener. */
  private static saidConnectFailed = false;

  /** The session's replies leave through a socket of its own from now on; ended if it cannot have one. */
  private replyOnOwnSocket(session: UdpSession): boolean {
    const listener = session.listener;
    try {
      session.reply = openReplySocket(listener.bound, { address: session.clientAddress, port: session.clientPort }, {
        lookup: literalLookup,
        onMessage: (msg, rinfo) => this.onClientDatagram(listener, msg, rinfo),
        onError: (err) => this.onReplySocketError(session, err),
      });
      return true;
    } catch (err) {
      this.onReplySocketError(session, err instanceof Error ? err : new Error(String(err)));
      return false;
    }
  }

  /**
   * A session that ends (idle, say) may end as its client's next datagram reaches its reply socket:
   * the socket is connected away, as a handed-over listener is, and read to the end of its queue
   * (each datagram there begins a new session) before it is closed. Until then drained() waits.
   */
  private closeReplySocket(listener: UdpListener, reply: DgramSocket): void {
    const watch = { read: false };
    reply.removeAllListeners('message');
    reply.on('message', (msg, rinfo) => {
      watch.read = true;
      this.onClientDatagram(listener, msg, rinfo);
    });
    const peer = handOverPeer(listener.bound);
    try {
      reply.disconnect();
      // A failed connect is emitted as 'error', which the ended session's handler ignores: the
      // socket is then read the same way.
      reply.connect(peer.port, peer.host);
    } catch {
      closeQuietly(reply);
      return;
    }
    this.replySocketsClosing.add(reply);
    void queueRead(watch, HAND_OVER_SETTLE_MS, HAND_OVER_MAX_MS).then(() => {
      if (!this.replySocketsClosing.delete(reply)) return; // cut meanwhile
      closeQuietly(reply);
      if (this.sessionCount === 0 && this.replySocketsClosing.size === 0) this.notifyDrained();
    });
  }

  /** ECONNREFUSED: the client's port is closed (ICMP port unreachable), so the session is over. */
  private onReplySocketError(session: UdpSession, err: Error): void {
    if (session.closed) return;
    if (errnoCode(err) !== 'ECONNREFUSED') {
      const held = this.limiter('replySocket').take();
      if (held !== undefined) this.log.warn({ err, client: session.key, suppressed: held }, 'udp session after hand-over: its reply socket failed, session ended');
    }
    this.endSession(session);
  }

  active(): number {
    return this.sessionCount;
  }

  drained(): Promise<void> {
    if (this.sessionCount === 0 && this.replySocketsClosing.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.drainWaiters.push(resolve));
  }

  /**
   * Every session, also those of listeners handed over (and so no longer listed), and the reply
   * sockets still read after theirs ended: a datagram read there now would begin a session that
   * nothing would end.
   */
  destroyAll(): void {
    this.cutting = true;
    for (let s = this.order.oldest(); s !== undefined; s = this.order.oldest()) this.endSession(s);
    this.cutting = false;
    if (this.replySocketsClosing.size === 0) return;
    for (const reply of this.replySocketsClosing) closeQuietly(reply);
    this.replySocketsClosing.clear();
    this.notifyDrained();
  }

  /**
   * End sessions idle for idleTimeoutMs or longer. `nowMs` is performance.now() time. From the
   * least recently active on, up to the first that is not idle: no session behind it can be.
   */
  sweep(nowMs: number): void {
    if (this.held.length > 0) this.sweepHeld(nowMs);
    for (let s = this.order.oldest(); s !== undefined && nowMs - s.lastActivity >= this.idleTimeoutMs; s = this.order.oldest()) {
      this.endSession(s);
    }
  }

  update(unit: ProxyUnit): void {
    this.holdMs = unit.holdWhenEmptyMs ?? 0;
    if (this.held.length > 0) this.sweepHeld(performance.now());
  }

  private onClientDatagram(listener: UdpListener, msg: Buffer, rinfo: RemoteInfo): void {
    this.stats.udpDatagrams++;
    // UDP allows source port 0 ("no reply expected"), and anyone can forge it. No reply can go
    // there: dgram's send() throws on port 0, which out of the endpoint's 'message' handler would
    // end the process.
    if (rinfo.port === 0) {
      this.stats.udpDatagramsDropped++;
      return;
    }
    if (listener.allowed !== undefined && !listener.allowed(rinfo.address)) {
      this.stats.sourceRejects++;
      return;
    }
    this.forward(listener, msg, rinfo.address, rinfo.port);
  }

  /**
   * `pendingCap`: how many datagrams may wait for the session's socket to connect. A released hold
   * queue goes out in one go, all of it to sessions still connecting, and was already bounded by
   * the hold (MAX_HELD_DATAGRAMS): it must not be cut to the per-session cap on the way out.
   */
  private forward(listener: UdpListener, msg: Buffer, address: string, port: number, pendingCap = MAX_PENDING_DATAGRAMS): void {
    const key = clientKey(address, port);
    const session = listener.sessions.get(key) ?? this.openSession(listener, key, address, port);
    if (session === null) {
      this.stats.udpDatagramsDropped++; // its socket failed at once
      return;
    }
    if (session === undefined) {
      if (this.hold(listener, msg, address, port)) return;
      this.stats.noEndpointRejects++;
      if (this.debugEnabled()) this.log.debug({ client: address }, 'no endpoints: datagram dropped');
      return;
    }
    this.markActive(session);
    if (session.pending === undefined) {
      session.socket.send(msg);
      this.stats.bytesToEndpoint += msg.length;
    } else if (session.pending.length < pendingCap) {
      session.pending.push(msg);
    } else {
      this.stats.udpDatagramsDropped++;
    }
  }

  /** A datagram either way: the session becomes the most recently active. */
  private markActive(session: UdpSession): void {
    session.lastActivity = performance.now();
    this.order.touch(session);
  }

  /**
   * Undefined when there is no endpoint (a refused client keeps its reset for the next try), null
   * when the session's socket failed at once (ended already).
   */
  private openSession(listener: UdpListener, key: string, address: string, port: number): UdpSession | undefined | null {
    const reset = listener.refused.has(key);
    if (this.sessionCount >= this.maxSessions && this.balancer.endpoints.length > 0) this.reclaimLeastRecentlyActive();
    const endpoint = this.balancer.nextEndpoint(address, reset);
    if (endpoint === undefined) return undefined;
    if (reset) listener.refused.delete(key);
    const socket = createSocket({ type: isIPv6(endpoint.ip) ? 'udp6' : 'udp4' });
    const session: UdpSession = {
      key,
      listener,
      clientAddress: address,
      clientPort: port,
      endpoint,
      socket,
      reply: undefined,
      lastActivity: performance.now(),
      unproven: true,
      pending: [],
      closed: false,
      older: undefined,
      newer: undefined,
    };
    // Counted before anything can fail: from here endSession, and only it, releases the endpoint.
    listener.sessions.set(key, session);
    this.order.append(session);
    this.sessionCount++;
    this.stats.udpSessionsActive++;
    this.stats.udpSessionsCreated++;
    try {
      this.wireSession(session);
    } catch (err) {
      this.onSessionError(session, err instanceof Error ? err : new Error(String(err)));
      return null;
    }
    // A datagram read from a handed-over listener's queue, or from a reply socket before it was
    // connected: the listener cannot send to this client any more.
    if (listener.handOver !== undefined && !this.replyOnOwnSocket(session)) return null;
    if (this.debugEnabled()) this.log.debug({ client: key, endpoint: endpoint.addr, reset }, 'udp session opened');
    return session;
  }

  /** No endpoints: queue the datagram if the Service holds (within the bounds), else it is dropped. */
  private hold(listener: UdpListener, msg: Buffer, address: string, port: number): boolean {
    if (this.holdMs <= 0 || this.held.length >= MAX_HELD_DATAGRAMS || this.heldBytes + msg.length > MAX_HELD_DATAGRAM_BYTES) return false;
    this.held.push({ listener, msg, address, port, at: performance.now() });
    this.heldBytes += msg.length;
    this.stats.held++;
    this.stats.heldTotal++;
    if (this.held.length === 1) this.onHoldEpisode?.();
    return true;
  }

  /**
   * From the coarse sweep and at updates: with endpoints, the queue goes out in the order it came;
   * without, what waited longer than the hold (or everything, once the Service stops holding) is
   * dropped.
   */
  private sweepHeld(nowMs: number): void {
    if (this.balancer.endpoints.length > 0) {
      const held = this.held;
      this.held = [];
      this.heldBytes = 0;
      this.stats.held -= held.length;
      for (const d of held) {
        // Its listener closed meanwhile: a reply could not reach the client.
        if (this.listeners.get(hostPort(d.listener.bound)) !== d.listener) this.stats.udpDatagramsDropped++;
        else this.forward(d.listener, d.msg, d.address, d.port, MAX_HELD_DATAGRAMS);
      }
      return;
    }
    const holdMs = this.holdMs;
    this.dropHeld((d) => holdMs <= 0 || nowMs - d.at >= holdMs, true);
  }

  private dropHeld(drop: (d: HeldDatagram) => boolean, expired: boolean): void {
    const kept: HeldDatagram[] = [];
    let bytes = 0;
    for (const d of this.held) {
      if (!drop(d)) {
        kept.push(d);
        bytes += d.msg.length;
      } else if (expired) {
        this.stats.holdExpired++;
      } else {
        this.stats.udpDatagramsDropped++;
      }
    }
    this.stats.held -= this.held.length - kept.length;
    this.held = kept;
    this.heldBytes = bytes;
  }

  /**
   * Connected, so the kernel filters replies to this endpoint and reports its ICMP errors to us
   * (as receive errors: 'error' on the socket, to onSessionError). Sends pass no callback, so a
   * datagram costs no callback on the next tick; dgram then drops a failed send's error silently.
   */
  private wireSession(session: UdpSession): void {
    const { socket, endpoint } = session;
    socket.on('message', (msg) => this.onEndpointDatagram(session, msg));
    socket.on('error', (err) => this.onSessionError(session, err));
    // A failed connect (no route to the endpoint, a broadcast address) is handed to this callback,
    // not emitted: sending on the unconnected socket would throw outside any handler.
    socket.connect(endpoint.port, endpoint.ip, (err?: Error) => {
      if (err) {
        this.onSessionError(session, err);
        return;
      }
      // Ended meanwhile (reclaimed, its listener closed): the socket is closed and send() would throw.
      if (session.closed) return;
      const pending = session.pending ?? [];
      session.pending = undefined;
      for (const msg of pending) {
        socket.send(msg);
        this.stats.bytesToEndpoint += msg.length;
      }
    });
  }

  private onEndpointDatagram(session: UdpSession, msg: Buffer): void {
    // Ended already (a datagram read in the same batch): it has no client to go to, and a session
    // out of the order must not be touched.
    if (session.closed) return;
    if (session.unproven) {
      session.unproven = false;
      this.balancer.reportDial(session.endpoint, true);
    }
    this.markActive(session);
    this.stats.bytesToClient += msg.length;
    if (session.reply === undefined) session.listener.socket.send(msg, session.clientPort, session.clientAddress);
    else this.replyAfterHandOver(session.reply, msg);
  }

  /** A reply socket whose connect failed throws on send (its error ends the session on the next tick). */
  private replyAfterHandOver(reply: DgramSocket, msg: Buffer): void {
    try {
      reply.send(msg);
    } catch {
      this.stats.udpDatagramsDropped++;
    }
  }

  /** ECONNREFUSED is the ICMP port-unreachable of a connected socket: the endpoint is not there. */
  private onSessionError(session: UdpSession, err: Error): void {
    if (session.closed) return;
    if (errnoCode(err) === 'ECONNREFUSED') {
      this.rememberRefused(session);
      if (this.balancer.reportDial(session.endpoint, false)) this.stats.outlierEjections++;
      if (this.debugEnabled()) this.log.debug({ client: session.key, endpoint: session.endpoint.addr }, 'endpoint refused: udp session ended');
    } else if (isOutOfDescriptors(err)) {
      const held = this.limiter('fd').take();
      if (held !== undefined) this.log.warn({ err, suppressed: held }, 'out of file descriptors: udp session dropped');
    } else {
      this.log.warn({ err, client: session.key, endpoint: session.endpoint.addr }, 'udp session error');
    }
    this.endSession(session);
  }

  private rememberRefused(session: UdpSession): void {
    const refused = session.listener.refused;
    refused.add(session.key);
    if (refused.size > this.maxSessions) {
      const oldest = refused.values().next();
      if (!oldest.done) refused.delete(oldest.value);
    }
  }

  /**
   * Past the bound, the least recently active session makes room. O(1): a resolver that uses a
   * fresh source port per query lands here on every datagram.
   */
  private reclaimLeastRecentlyActive(): void {
    const oldest = this.order.oldest();
    if (oldest === undefined) return;
    this.stats.udpSessionsReclaimed++;
    const held = this.limiter('reclaim').take();
    if (held !== undefined) {
      this.log.warn({ maxSessions: this.maxSessions, client: oldest.key, suppressed: held }, 'udp session bound reached: least recently active session reclaimed');
    }
    this.endSession(oldest);
  }

  private endSession(session: UdpSession): void {
    if (session.closed) return;
    session.closed = true;
    session.listener.sessions.delete(session.key);
    this.order.remove(session);
    if (session.pending !== undefined) {
      this.stats.udpDatagramsDropped += session.pending.length;
      session.pending = undefined;
    }
    this.sessionCount--;
    this.stats.udpSessionsActive--;
    closeQuietly(session.socket);
    if (session.reply !== undefined) {
      if (this.cutting) closeQuietly(session.reply);
      else this.closeReplySocket(session.listener, session.reply);
    }
    this.balancer.release(session.endpoint);
    if (this.sessionCount === 0 && this.replySocketsClosing.size === 0) this.notifyDrained();
  }

  /**
   * Receive errors on the listener socket. Rate-limited: one per datagram is possible, and at
   * error level each would otherwise cost a log line.
   */
  private onListenerError(bound: BoundAddress, err: Error): void {
    const held = this.limiter('listener').take();
    if (held !== undefined) this.log.error({ err, address: hostPort(bound), suppressed: held }, 'listener error');
  }

  private notifyDrained(): void {
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const resolve of waiters) resolve();
  }
}

/**
 * dgram resolves the destination of every unconnected send() with dns.lookup, which for an IP
 * literal still defers the send to the next tick (and costs a closure and an isIP test). Replies
 * go to client addresses as the kernel reported them, always literals: those are handed back at
 * once. Anything else (a bind to a name) goes to dns.lookup as before. dgram passes the family
 * (4 or 6) as the second argument.
 */
function literalLookup(hostname: string, family: unknown, callback: (err: NodeJS.ErrnoException | null, address: string, family: number) => void): void {
  const literal = isIP(hostname);
  if (literal !== 0) callback(null, hostname, literal);
  else dnsLookup(hostname, family as number, callback);
}

/** dgram's close() throws when the socket is already closed; here that is "already gone". */
function closeQuietly(socket: { close(): unknown }): void {
  try {
    socket.close();
  } catch {
    // already closed
  }
}
