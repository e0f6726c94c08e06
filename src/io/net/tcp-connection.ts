import type { OnReadOpts, Socket } from 'node:net';
import type { LoadBalancer } from '../../core/balancer/load-balancer.js';
import type { Endpoint } from '../../core/model.js';
import type { ServicePortStats } from '../../core/stats.js';
import type { Logger } from '../../seams/logger.js';
import { isEarlyFailure, type Dialer, type DialRequest, type EarlyFailure, type Upstream } from '../../seams/dialer.js';
import { dialFailureReason, isEndpointFault, isOutOfDescriptors } from './errno.js';

/**
 * Where the clients of one listener connected, as far as the listener knows without asking the
 * kernel per connection: the address it is bound to, or the Service portal a NAT rule sends there
 * from; `host` undefined when only the accepted socket can say (a wildcard listener, or a proxy
 * port several portals lead to). Filled in once the listener is bound.
 */
export interface ListenerDestination {
  host: string | undefined;
  port: number;
}

export const UNKNOWN_DESTINATION: ListenerDestination = { host: undefined, port: 0 };

/** What the connections of one service port share; built once by their TcpProxySocket. */
export interface TcpConnectionContext {
  readonly balancer: LoadBalancer;
  readonly dialer: Dialer;
  readonly stats: ServicePortStats;
  /** One dial attempt per entry (upstream's endpointDialTimeout). */
  readonly dialTimeoutsMs: readonly number[];
  /** The service port's logger (made on first use). */
  log(): Logger;
  /** Asked before building a debug line: most connections log nothing. */
  debugEnabled(): boolean;
  /** A dial ran out of descriptors: warned about at a bounded rate. */
  outOfDescriptors(err: unknown): void;
  /** Both sockets are closed and the books are closed: forget the connection. */
  released(conn: TcpConnection): void;
  /**
   * No endpoint at accept: may the connection wait for one (hold-when-empty, within its bounds)?
   * True when it is held from now on: the socket calls leaveHold or expireHold later.
   */
  hold(conn: TcpConnection): boolean;
  /** A held connection closed (cut by destroyAll): it is held no more. */
  holdEnded(conn: TcpConnection): void;
  /**
   * Begin each upstream with a PROXY protocol v2 header (the Service's annotation). Read once per
   * connection, at accept: a change applies to the connections accepted after it.
   */
  proxyProtocol: boolean;
  /**
   * The header for this client, `to` being what it connected to when its listener knows (else the
   * socket's local address); undefined when the client is gone or the header cannot be made: then
   * the connection is reset.
   */
  proxyHeader(client: Socket, to: ListenerDestination): Uint8Array | undefined;
}

/**
 * Where a connection is in its life. Every path ends in `closed`, and only there are the books
 * closed, once: when no dial is in flight and each socket it owns has emitted 'close'.
 *
 * - `holding`: there was no endpoint at accept and the Service holds connections until one
 *   appears (hold-when-empty). The client is read on, its bytes (up to HELD_READ_BYTES) and FIN
 *   kept in the replay for the endpoint, so that a client that gives up with a reset is released
 *   at once; nothing is written to it. Its socket calls leaveHold (endpoints appeared: dial) or
 *   expireHold (reset).
 * - `dialing`: an attempt is in flight. The client is paused (pauseOnConnect), its bytes wait in
 *   the kernel (after a hold, its first read pauses it and goes to the replay). The endpoint
 *   socket belongs to the dialer, 'error' events included, yet its reads already go to the client
 *   (onread): the endpoint may speak first. Whatever else it does before
 *   the hand-over (a FIN, a read stopped by backpressure, a failure, a close) is read off the
 *   socket at the hand-over, since no listener of ours was there to see it.
 * - `relaying`: both sockets are the connection's. Bytes flow both ways; each direction ends when
 *   its FIN is passed on (half-close); an error on one side resets the other. One exception: an
 *   upstream that fails early (EarlyFailure: before its endpoint sent a byte, every byte written
 *   to it kept) sends the connection back to `dialing`, the next endpoint, and those bytes.
 * - `ending`: no relay will start (no endpoint, every dial failed, the client gone or cut before
 *   the hand-over, a bug): the client has been reset, and the connection waits for the closes.
 * - `closed`: released.
 */
export type TcpConnectionPhase = 'holding' | 'dialing' | 'relaying' | 'ending' | 'closed';

/**
 * One accepted client, from accept() to its endpoint and to the end (Envoy's tcp_proxy filter,
 * upstream's per-connection goroutines): the first pick, the dial with its retries, the hand-over
 * of the dialed socket, the relay both ways with backpressure and half-close, and the release.
 *
 * This runs for every connection: no timer, no promise chain beyond the dialer's own, no
 * getpeername() unless a pick, a log line or a PROXY header needs the address, and three listeners
 * per direction.
 */
export class TcpConnection {
  private phase: TcpConnectionPhase = 'dialing';
  /**
   * Kept from accept (the socket forgets its peer once closed) when the balancer or the debug log
   * needs it; '' otherwise.
   */
  private clientIP = '';
  /** The endpoint of the attempt in flight, then of the relay: handed back to the balancer once. */
  private endpoint: Endpoint | undefined;
  private upstream: Upstream | undefined;
  /**
   * The client's bytes (and FIN, as clientFinPassed) an early-failed upstream gave back, written
   * to the next one at its hand-over.
   */
  private replay: Uint8Array[] | undefined;
  /** Bytes read from the client while held (into the replay). */
  private heldBytes = 0;
  /** The client's listeners are attached at the first hand-over, and serve every later one. */
  private clientWired = false;
  private attempt = 0;
  private dialStartedMs = 0;
  /** performance.now() when the hold began. */
  private heldSinceMs = 0;
  /**
   * Connected, and the endpoint has not answered yet: its first byte (or an orderly close) tells
   * passive health it is fine; an error before that counts against it.
   */
  private unproven = false;
  /**
   * The endpoint-to-client read stopped because the client's buffer was full. The onread
   * callback stops the read without pausing the stream, so only this can tell; the client's
   * 'drain' starts it again (and the hand-over, when that 'drain' came before it).
   */
  private endpointReadStopped = false;
  private clientClosed = false;
  /** True while there is no endpoint socket: nothing to wait for. */
  private upstreamClosed = true;
  /** The half-closed directions: each FIN once passed on. */
  private clientFinPassed = false;
  private endpointFinPassed = false;
  /**
   * The port's sweeps this connection has seen while its client is without keepalive; -1 once the
   * client has it (or needs it no more). See keepAliveOnceLived.
   */
  private sweepsWithoutKeepAlive = 0;
  /** The idle sweep's last reading of the byte counters (-1: none yet) and since when it held. */
  private idleMark = -1;
  private idleSinceMs = 0;
  private onread: OnReadOpts | undefined;
  /**
   * The PROXY protocol header every upstream of this connection begins with (made once, at
   * accept: the client and what it connected to are the same for each); undefined when the
   * Service does not ask for one.
   */
  private header: Uint8Array | undefined;

  /**
   * @param writtenBefore bytes written to the client before this connection took it over (a
   * handed-off client's SOCKS or CONNECT reply, seams/tcp-hand-off.ts): not the endpoint's, so
   * they neither stop a retry nor count in the port's bytes to clients.
   */
  constructor(
    private readonly ctx: TcpConnectionContext,
    private readonly client: Socket,
    /** What its listener knows of where the client connected (the PROXY header's destination). */
    private readonly to: ListenerDestination = UNKNOWN_DESTINATION,
    private readonly writtenBefore = 0,
  ) {}

  /** Bytes the endpoints' side wrote to the client (queued ones included). */
  private get toClient(): number {
    return this.client.bytesWritten - this.writtenBefore;
  }

  /**
   * Start at accept. The first pick is synchronous, so a port without endpoints resets the client
   * before any I/O, or holds it (hold-when-empty). Precondition: the client was accepted paused
   * (pauseOnConnect).
   */
  start(): void {
    const { ctx, client } = this;
    const on = TcpConnection.clientListeners;
    (client as ClientSocket)[CONNECTION] = this;
    client.on('error', on.error);
    // 'close' comes once; on() spares once()'s wrapper.
    client.on('close', on.close);
    if (ctx.balancer.usesClientIP || ctx.debugEnabled()) {
      const ip = client.remoteAddress;
      if (ip === undefined) {
        this.end(); // the client left before we saw it
        return;
      }
      this.clientIP = ip;
    }
    if (ctx.proxyProtocol) {
      // At accept, while the socket still knows both of its addresses (a held client may close).
      this.header = ctx.proxyHeader(client, this.to);
      if (this.header === undefined) {
        this.end();
        return;
      }
    }
    const endpoint = ctx.balancer.nextEndpoint(this.clientIP, false);
    if (endpoint === undefined) {
      if (ctx.hold(this)) {
        this.phase = 'holding';
        this.heldSinceMs = performance.now();
        // Read on while held (the bytes wait in the replay, up to HELD_READ_BYTES): a paused socket
        // is not polled, so a client that gave up with a reset would keep its place in the hold's
        // budget until the hold ran out, and live clients be reset for want of one. A FIN only
        // half-closes (it goes on with the replay), as HAProxy keeps a queued client that sent one.
        this.wireClient();
        client.resume();
        if (ctx.debugEnabled()) ctx.log().debug({ client: this.clientIP }, 'no endpoints: holding client');
        return;
      }
      ctx.stats.noEndpointRejects++;
      if (ctx.debugEnabled()) ctx.log().debug({ client: this.clientIP }, 'no endpoints: resetting client');
      this.end();
      return;
    }
    this.dial(endpoint);
  }

  /** performance.now() when the hold began (meaningful while holding). */
  get heldSince(): number {
    return this.heldSinceMs;
  }

  /**
   * Endpoints appeared: pick and dial as at accept. Precondition: the socket no longer counts the
   * connection as held. With still no endpoint (a pick raced a change), it is reset as at accept.
   */
  leaveHold(): void {
    if (this.phase !== 'holding') return;
    const endpoint = this.ctx.balancer.nextEndpoint(this.pickIP(), false);
    if (endpoint === undefined) {
      this.ctx.stats.noEndpointRejects++;
      this.end();
      return;
    }
    this.dial(endpoint);
  }

  /** The hold ran out: reset, as a connection without endpoints always was. Precondition: as leaveHold. */
  expireHold(): void {
    if (this.phase !== 'holding') return;
    this.ctx.stats.holdExpired++;
    if (this.ctx.debugEnabled()) this.ctx.log().debug({ client: this.clientIP }, 'no endpoints before the hold ran out: resetting client');
    this.end();
  }

  /** Cut both sides with RST (the end of a shutdown grace period). */
  destroy(): void {
    resetSocket(this.client);
    if (this.upstream) resetSocket(this.upstream);
  }

  /**
   * The idle limit, from the one coarse sweep: a relayed connection whose byte counters have not
   * moved for `idleTimeoutMs` is closed on both sides. Nothing is done per read: the counters are
   * the sockets' own. Progress is a read on either side or a write the kernel took in full
   * (bytesWritten counts a write when it is queued, writableLength until it completes), so a slow
   * reader draining a backlog is not idle.
   *
   * The close is a plain one (FIN), as nginx's proxy_timeout and Envoy's idle_timeout do: the
   * connections that idle longest are pooled keep-alive ones, whose clients recognise an orderly
   * end before reusing them.
   */
  sweepIdle(nowMs: number, idleTimeoutMs: number): void {
    if (this.phase !== 'relaying') return;
    const c = this.client;
    const u = this.upstream as Upstream;
    const mark = c.bytesRead + u.bytesRead + (c.bytesWritten - c.writableLength) + (u.bytesWritten - u.writableLength);
    if (mark !== this.idleMark) {
      this.idleMark = mark;
      this.idleSinceMs = nowMs;
      return;
    }
    if (nowMs - this.idleSinceMs < idleTimeoutMs) return;
    if (this.ctx.debugEnabled()) this.ctx.log().debug({ client: this.clientIP, endpoint: this.endpoint?.addr, idleMs: nowMs - this.idleSinceMs }, 'idle: closing');
    c.destroy();
    u.destroy();
  }

  /** The client does not have keepalive yet (meaningful while the port asks for it). */
  get awaitsKeepAlive(): boolean {
    return this.sweepsWithoutKeepAlive >= 0;
  }

  /**
   * From the port's sweep, while the port asks for keepalive: at the second sweep the connection
   * lives through, its client is given keepalive with this delay (accepted by then, so connected).
   * True when the client has it now and awaits it no more.
   */
  keepAliveOnceLived(delayMs: number): boolean {
    if (this.sweepsWithoutKeepAlive < 0 || this.sweepsWithoutKeepAlive++ === 0) return false;
    return this.keepAliveNow(delayMs);
  }

  /** Keepalive for the client now, if it awaits it (the port closes: no sweep will come). */
  keepAliveNow(delayMs: number): boolean {
    if (this.sweepsWithoutKeepAlive < 0) return false;
    this.sweepsWithoutKeepAlive = -1;
    if (!this.client.destroyed) this.client.setKeepAlive(true, delayMs);
    return true;
  }

  // --- dialing --------------------------------------------------------------------------------

  /**
   * Upstream tryConnect: one attempt per dial timeout, each after the first on an endpoint picked
   * afresh with sessionAffinityReset, so a sticky client is not stuck on a dead endpoint. Plain
   * promise callbacks rather than an async loop: this runs for every connection.
   */
  private dial(endpoint: Endpoint): void {
    const { ctx } = this;
    this.phase = 'dialing';
    this.endpoint = endpoint;
    this.endpointReadStopped = false;
    ctx.stats.dialAttempts++;
    this.dialStartedMs = performance.now();
    // The endpoint's bytes go to the client from its first read, through one onread per connection.
    this.onread ??= { buffer: sharedReadBuffer, callback: (bytes, buf) => this.fromEndpoint(bytes, buf) };
    let dialed: Promise<Upstream>;
    try {
      dialed = ctx.dialer.dial(new ClientDial(this.client, this.clientIP, endpoint, ctx.dialTimeoutsMs[this.attempt] as number, this.onread));
    } catch (err) {
      dialed = Promise.reject(err instanceof Error ? err : new Error(String(err))); // a dialer that throws has failed like one that rejects
    }
    dialed.then(
      (upstream) => this.guard(() => this.handOver(upstream), upstream),
      (err: unknown) => this.guard(() => this.dialFailed(err)),
    );
  }

  private dialFailed(err: unknown): void {
    const { ctx } = this;
    const failed = this.endpoint as Endpoint;
    this.endpoint = undefined;
    ctx.stats.dialFailures[dialFailureReason(err)]++;
    if (isEndpointFault(err) && ctx.balancer.reportDial(failed, false)) ctx.stats.outlierEjections++;
    // Every endpoint handed out is handed back, so a least-connections balancer keeps true counts.
    ctx.balancer.release(failed);
    if (isOutOfDescriptors(err)) ctx.outOfDescriptors(err);
    else if (ctx.debugEnabled()) ctx.log().debug({ err, client: this.clientIP, endpoint: failed.addr }, 'dial failed');
    const next = this.mayRetry(err) ? ctx.balancer.nextEndpoint(this.pickIP(), true, failed) : undefined;
    if (next === undefined) {
      this.giveUp();
      return;
    }
    this.attempt++;
    this.dial(next);
  }

  /**
   * Not when the attempts are used up, nor when another endpoint would fail the same way (out of
   * descriptors), nor for a client that is gone, nor for one that already got bytes from the
   * failed endpoint (a dialer that let it speak before failing): another endpoint's bytes would
   * follow them in one stream.
   */
  private mayRetry(err: unknown): boolean {
    return this.attempt + 1 < this.ctx.dialTimeoutsMs.length && !isOutOfDescriptors(err) && !this.client.destroyed && this.toClient === 0;
  }

  /**
   * The client IP for a retry's pick: the Service may have turned ClientIP affinity on since the
   * connection was accepted without looking its address up.
   */
  private pickIP(): string {
    if (this.clientIP !== '' || !this.ctx.balancer.usesClientIP) return this.clientIP;
    return this.client.remoteAddress ?? '';
  }

  private giveUp(): void {
    const { ctx } = this;
    // A client cut while we dialed (destroyAll) was not turned away for want of an endpoint.
    if (!this.client.destroyed) ctx.stats.dialExhausted++;
    if (ctx.debugEnabled()) ctx.log().debug({ client: this.clientIP }, 'no endpoint could be dialed: resetting client');
    this.end();
  }

  /** No relay will start: reset the client and wait for the closes. */
  private end(): void {
    this.phase = 'ending';
    resetSocket(this.client);
    this.settle();
  }

  /** A throw in the dial path is a bug: it must not end the process, nor leave the client hanging. */
  private guard(step: () => void, upstream?: Upstream): void {
    try {
      step();
    } catch (err) {
      this.ctx.log().error({ err }, 'bug: dial loop failed');
      upstream?.destroy();
      if (this.phase === 'dialing') this.end();
      else this.destroy();
    }
  }

  // --- the hand-over: dialing -> relaying -------------------------------------------------------

  /**
   * The dialer resolved: the socket is the connection's from here. With the direct dialer nothing
   * can have happened to it yet (it resolves on 'connect', before any read); a dialer that writes
   * a header or tunnels may resolve later, so the relay starts from whatever state the socket is in.
   */
  private handOver(upstream: Upstream): void {
    const { ctx, client } = this;
    ctx.stats.observeDialLatency((performance.now() - this.dialStartedMs) / 1000);
    this.upstream = upstream;
    // A dialer may have let the endpoint speak before resolving: then it has answered already.
    if (upstream.bytesRead > 0) ctx.balancer.reportDial(this.endpoint as Endpoint, true);
    else this.unproven = true;
    upstream.on('error', (err) => this.onEndpointError(upstream, err));
    // Closed meanwhile: its 'close' was the dialer's to see.
    this.upstreamClosed = upstream.closed;
    if (!upstream.closed) upstream.on('close', () => this.onUpstreamClose(upstream));
    if (client.destroyed) {
      // Cut (destroyAll) or gone while we dialed.
      this.phase = 'ending';
      this.replay = undefined;
      upstream.destroy();
      this.settle();
      return;
    }
    if (upstream.destroyed && !upstream.readableEnded) {
      // Failed after connecting, its 'error' taken by the dialer: as an error on the endpoint side,
      // the client is reset rather than left waiting.
      this.end();
      return;
    }
    this.phase = 'relaying';
    if (ctx.debugEnabled()) ctx.log().debug({ client: this.clientIP, endpoint: this.endpoint?.addr }, 'connected');
    // Client to endpoint: 'data', with backpressure through pause() and the endpoint's 'drain'.
    upstream.on('drain', () => client.resume());
    if (!this.clientWired) this.wireClient();
    // The PROXY header first, on every upstream (a retry's too), before any byte of the client's:
    // they wait in the kernel or in the replay until here.
    let drained = this.header === undefined || upstream.write(this.header);
    if (this.replay !== undefined) drained = this.writeReplay(upstream) && drained;
    if (drained) client.resume();
    // Endpoint to client: the reads already reach the client (fromEndpoint); what is left is the
    // other half of backpressure and the FIN, each caught up with if it came before the hand-over.
    upstream.on('end', () => this.onEndpointEnd());
    if (upstream.readableEnded) this.onEndpointEnd();
    else if (this.endpointReadStopped && !client.writableNeedDrain) upstream.resume();
  }

  /** Once per connection: the client's listeners reach whichever upstream is current. */
  private wireClient(): void {
    const { client } = this;
    const on = TcpConnection.clientListeners;
    this.clientWired = true;
    client.on('data', on.data);
    client.on('end', on.end);
    client.on('drain', on.drain);
  }

  /** The client's listeners: shared by every connection, each finds its own through the socket (CONNECTION). */
  private static readonly clientListeners: ClientListeners = {
    error(this: ClientSocket, err: Error): void {
      this[CONNECTION].onClientError(err);
    },
    close(this: ClientSocket): void {
      this[CONNECTION].onClientClose();
    },
    data(this: ClientSocket, chunk: Buffer): void {
      this[CONNECTION].toEndpoint(chunk);
    },
    end(this: ClientSocket): void {
      this[CONNECTION].onClientEnd();
    },
    drain(this: ClientSocket): void {
      this[CONNECTION].upstream?.resume();
    },
  };

  /** The bytes (and FIN) an early-failed upstream gave back: false when the new one needs a 'drain' first. */
  private writeReplay(upstream: Upstream): boolean {
    const chunks = this.replay as Uint8Array[];
    this.replay = undefined;
    let drained = true;
    for (const chunk of chunks) drained = upstream.write(chunk);
    if (this.clientFinPassed) passEnd(upstream);
    return drained;
  }

  // --- relaying ---------------------------------------------------------------------------------

  /** The client's 'data': written on, with backpressure through pause() and the endpoint's 'drain'. */
  private toEndpoint(chunk: Buffer): void {
    const upstream = this.upstream;
    if (upstream === undefined) {
      // Held (read on up to a bound), or between an early failure and the next hand-over (the
      // client is paused, so this is rare): kept for the endpoint.
      (this.replay ??= []).push(chunk);
      if (this.phase !== 'holding' || (this.heldBytes += chunk.length) >= HELD_READ_BYTES) this.client.pause();
    } else if (!upstream.write(chunk)) {
      this.client.pause();
    }
  }

  /**
   * net.connect's `onread`: a read lands in the shared buffer and is written on. Returning false,
   * when the client buffers past its high-water mark, makes Node stop reading until the client's
   * 'drain' resumes it.
   */
  private fromEndpoint(bytes: number, buf: Uint8Array): boolean {
    if (this.unproven) this.proven();
    const chunk = Buffer.allocUnsafe(bytes); // from Node's pool when small
    chunk.set(bytes === buf.length ? buf : buf.subarray(0, bytes));
    if (this.client.write(chunk)) return true;
    this.endpointReadStopped = true;
    return false;
  }

  /** The endpoint answered: passive health hears of it once per connection. */
  private proven(): void {
    this.unproven = false;
    if (this.endpoint) this.ctx.balancer.reportDial(this.endpoint, true);
  }

  private onClientEnd(): void {
    this.clientFinPassed = true;
    // Held, or between an early failure and the next hand-over: the FIN waits with the replay,
    // which must exist for the hand-over to pass it on, bytes or none.
    if (this.upstream !== undefined) passEnd(this.upstream);
    else this.replay ??= [];
  }

  private onEndpointEnd(): void {
    this.endpointFinPassed = true;
    passEnd(this.client);
  }

  /**
   * An error on one side ends the connection: the other side is reset rather than ended, so the
   * peer cannot mistake a truncated stream for a complete one. While dialing there is no other
   * side yet: the dial's outcome finds the client destroyed.
   */
  private onClientError(err: Error): void {
    if (this.ctx.debugEnabled()) this.logError(err, 'client');
    if (this.upstream) resetSocket(this.upstream);
  }

  private onEndpointError(upstream: Upstream, err: Error): void {
    // A failed upstream's late error, once the connection has moved on to the next.
    if (upstream !== this.upstream) return;
    // Nothing reached the client either way: a failed dial after all (dialFailed decides whether
    // another endpoint is tried).
    if (isEarlyFailure(err) && this.phase === 'relaying' && !this.endpointFinPassed && !this.client.destroyed && this.toClient === 0) {
      this.guard(() => this.redial(upstream, err));
      return;
    }
    if (this.ctx.debugEnabled()) this.logError(err, 'endpoint');
    // Reset (or timed out) before a byte: to passive health, as good as a failed dial.
    if (this.unproven) {
      this.unproven = false;
      if (this.endpoint && this.ctx.balancer.reportDial(this.endpoint, false)) this.ctx.stats.outlierEjections++;
    }
    resetSocket(this.client);
  }

  /**
   * The upstream failed before its endpoint sent a byte and gave back what the client had sent:
   * a failed dial after all. The client waits (paused) while the next endpoint is dialed; the
   * bytes and the FIN go there at the hand-over.
   */
  private redial(failed: Upstream, err: EarlyFailure): void {
    this.phase = 'dialing';
    this.client.pause();
    // The failed upstream's header is not the client's: the next upstream is sent its own.
    const unsent = this.header === undefined ? err.unsent : dropFirstBytes(err.unsent, this.header.length);
    this.replay = [...unsent, ...(this.replay ?? [])];
    // Its 'close' no longer concerns the connection (onUpstreamClose checks which upstream).
    this.upstream = undefined;
    this.upstreamClosed = true;
    failed.destroy();
    this.dialFailed(err);
  }

  private logError(err: Error, side: 'client' | 'endpoint'): void {
    this.ctx.log().debug({ err, client: this.clientIP, endpoint: this.endpoint?.addr, side }, 'connection error');
  }

  // --- release ----------------------------------------------------------------------------------

  private onClientClose(): void {
    this.clientClosed = true;
    this.settle();
  }

  private onUpstreamClose(upstream: Upstream): void {
    if (upstream !== this.upstream) return;
    this.upstreamClosed = true;
    this.settle();
  }

  /** Close the books once no dial is in flight and every descriptor is gone. */
  private settle(): void {
    if (this.phase === 'dialing' || this.phase === 'closed' || !this.clientClosed || !this.upstreamClosed) return;
    const { ctx, upstream, endpoint } = this;
    if (this.phase === 'holding') ctx.holdEnded(this);
    this.phase = 'closed';
    // Closed without an error from the endpoint: it answered, if only with a FIN.
    if (this.unproven) this.proven();
    ctx.stats.bytesToClient += this.toClient;
    // The client's bytes: the PROXY header, when one went first, is ours.
    if (upstream) ctx.stats.bytesToEndpoint += Math.max(0, upstream.bytesWritten - (this.header?.length ?? 0));
    if (endpoint) ctx.balancer.release(endpoint);
    if (ctx.debugEnabled()) {
      const halfClosed = { byClient: this.clientFinPassed, byEndpoint: this.endpointFinPassed };
      ctx.log().debug({ client: this.clientIP, endpoint: endpoint?.addr, toEndpoint: upstream?.bytesWritten, toClient: this.toClient, fin: halfClosed }, 'connection closed');
    }
    ctx.released(this);
  }
}

/**
 * An accepted client socket carries its connection under a symbol, so its five listeners can be
 * functions shared by every connection (EventEmitter calls a listener with the socket as `this`)
 * rather than five closures and their contexts per connection: about 200 bytes of every idle
 * connection's heap. Only the client side: it is always a net.Socket, while an Upstream may be a
 * dialer's own object.
 */
const CONNECTION = Symbol('tcp-connection');

type ClientSocket = Socket & { [CONNECTION]: TcpConnection };

/** Plain function-typed fields: each is attached as is, with the socket as `this`. */
interface ClientListeners {
  readonly error: (this: ClientSocket, err: Error) => void;
  readonly close: (this: ClientSocket) => void;
  readonly data: (this: ClientSocket, chunk: Buffer) => void;
  readonly end: (this: ClientSocket) => void;
  readonly drain: (this: ClientSocket) => void;
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

/**
 * How much of a held client's bytes is read and kept before it is paused (the rest waits in the
 * kernel): a request's head, typically. Past it, a reset is noticed only at the hold's end.
 */
const HELD_READ_BYTES = 16 * 1024;

/**
 * The one buffer every endpoint socket of the process reads into. Node's default read path
 * allocates a 64 KiB buffer per read, wraps it in a stream chunk and emits 'data'; here a read lands
 * in memory that is always there and goes straight to the write. It is shared, so the bytes are
 * copied out before they are written on: a write that does not complete at once keeps a reference
 * to what it was given, and the next read, on any connection, would overwrite them. (A buffer per
 * connection would spare the copy but cost 64 KiB for every idle connection.)
 */
const sharedReadBuffer = new Uint8Array(64 * 1024);

/**
 * `chunks` without their first `n` bytes. An early-failed upstream gives back every byte it
 * accepted, in order, and the PROXY header was the first write to it; counted in bytes rather than
 * by the chunk's identity, as an upstream may keep copies.
 */
function dropFirstBytes(chunks: readonly Uint8Array[], n: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  let left = n;
  for (const chunk of chunks) {
    if (left >= chunk.length) {
      left -= chunk.length;
    } else {
      out.push(left === 0 ? chunk : chunk.subarray(left));
      left = 0;
    }
  }
  return out;
}

/**
 * Pass a FIN on. When `to`'s own peer has already ended and nothing waits to be written, both
 * directions are done: closing the socket sends the FIN itself, which spares a shutdown() and the
 * stream's finish round (the second FIN of every short connection). Otherwise end() half-closes.
 *
 * Both FINs often arrive in the same poll round (a reply ends the endpoint's side, and the client
 * closes as soon as it has read it), but 'end' is emitted per socket as each read is handled:
 * when `to` has not ended yet, the choice waits for the end of the round (setImmediate), by which
 * time every read of the round has been handled.
 */
export function passEnd(to: Socket | Upstream): void {
  if (to.readableEnded) endOrClose(to);
  else setImmediate(endOrClose, to);
}

function endOrClose(to: Socket | Upstream): void {
  if (to.destroyed) return;
  if (to.readableEnded && to.writableLength === 0) to.destroy();
  else to.end();
}

/**
 * Close with RST (SO_LINGER 0) so the peer sees ECONNRESET, not a clean end. Falls back to a
 * plain destroy for a socket whose handle is gone.
 */
function resetSocket(socket: Socket | Upstream): void {
  try {
    socket.resetAndDestroy();
  } catch {
    socket.destroy();
  }
}
