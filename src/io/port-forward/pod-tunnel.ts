import type { OnReadOpts } from 'node:net';
import type { PodRef } from '../../core/model.js';
import type { Logger } from '../../seams/logger.js';
import { PodStream } from './pod-stream.js';
import { PortForwardError } from './port-forward-error.js';
import { SpdySession } from './spdy-session.js';
import type { TunnelOpener } from './tunnel-opener.js';

export interface TunnelTimings {
  /** A tunnel quiet this long is pinged. */
  pingIntervalMs: number;
  /** A PING unanswered this long fails the tunnel (and its streams). */
  pingTimeoutMs: number;
  /** A tunnel without a stream this long is closed. */
  idleCloseMs: number;
}

export interface PodTunnelDeps {
  opener: TunnelOpener;
  now: () => number;
  logger: Logger;
  keepLimit?: number;
  /** Told of every failed open, for the dialer's one-line reports (403s, say). */
  onOpenFailed?: (pod: PodRef, err: PortForwardError) => void;
}

/**
 * The tunnel to one pod: one SPDY session over the API server's pods/portforward, carrying every
 * connection to that pod as its own pair of streams. Opened by the first connection that needs
 * it (the others wait for the same opening), kept alive by the dialer's sweep, closed after
 * `idleCloseMs` without a stream, and opened afresh by the next connection once it dropped. A
 * session the peer sent GOAWAY on serves its streams to their end beside a new one.
 */
export class PodTunnel {
  private session: SpdySession | undefined;
  private opening: Promise<SpdySession> | undefined;
  /** Every live session: the current one and those going away with streams still on them. */
  private readonly sessions = new Set<SpdySession>();
  private requestId = 0;
  /** close() was called: an opening that completes after it is closed at once, and no stream is made. */
  private closed = false;
  private idleSinceMs: number | undefined;
  private readonly label: string;
  /** The transport of the open tunnel, if one is open (for tests and logs). */
  transport: 'websocket' | 'spdy' | undefined;

  constructor(
    readonly pod: PodRef,
    private readonly deps: PodTunnelDeps,
  ) {
    this.label = `${pod.namespace}/${pod.name}`;
  }

  /**
   * A new stream pair to `port`, on the open tunnel at once, or once the tunnel opens. Rejects with
   * the opening's PortForwardError, or ETIMEDOUT after `timeoutMs` (the opening goes on for the
   * connections after this one).
   */
  stream(port: number, onread: OnReadOpts | undefined, timeoutMs: number): Promise<PodStream> {
    if (this.closed) return Promise.reject(new PortForwardError('tunnel-closed', `the tunnel to pod ${this.label} is closed (the proxy is stopping)`));
    const current = this.session;
    if (current?.usable) return Promise.resolve(this.newStream(current, port, onread));
    this.opening ??= this.open();
    return withTimeout(this.opening, timeoutMs, this.label).then((session) => {
      if (!session.usable) throw new PortForwardError('tunnel-closed', `the tunnel to pod ${this.label} closed as it opened`);
      return this.newStream(session, port, onread);
    });
  }

  /**
   * The dialer's coarse sweep: keepalive PINGs, and the idle close. True when nothing is left
   * (no session, none opening): the dialer may forget the tunnel.
   */
  sweep(nowMs: number, timings: TunnelTimings): boolean {
    for (const s of this.sessions) s.keepAlive(nowMs, timings.pingIntervalMs, timings.pingTimeoutMs);
    const current = this.session;
    if (current !== undefined && !current.closed && current.streamCount === 0) {
      this.idleSinceMs ??= nowMs;
      if (nowMs - this.idleSinceMs >= timings.idleCloseMs) {
        this.deps.logger.debug({ pod: this.label, idleMs: nowMs - this.idleSinceMs }, 'port-forward tunnel idle: closing');
        current.close();
      }
    } else {
      this.idleSinceMs = undefined;
    }
    return this.sessions.size === 0 && this.opening === undefined;
  }

  /** Close every session, and one still opening once it opens; their streams fail. */
  close(): void {
    this.closed = true;
    for (const s of [...this.sessions]) s.close();
  }

  private newStream(session: SpdySession, port: number, onread: OnReadOpts | undefined): PodStream {
    this.idleSinceMs = undefined;
    const opts = { session, port, requestId: this.requestId++, pod: this.label, ...(onread ? { onread } : {}), ...(this.deps.keepLimit !== undefined ? { keepLimit: this.deps.keepLimit } : {}) };
    return new PodStream(opts);
  }

  private async open(): Promise<SpdySession> {
    try {
      const opened = await this.deps.opener.open(this.pod);
      const session = new SpdySession({
        pipe: opened.pipe,
        ...(opened.head ? { head: opened.head } : {}),
        now: this.deps.now,
        onClosed: (s, err) => this.onClosed(s, err),
      });
      if (session.closed) throw new PortForwardError('tunnel-closed', `the tunnel to pod ${this.label} closed as it opened`);
      if (this.closed) {
        // Closed while it opened (the proxy stopping): nothing would ever ping or close it.
        session.close();
        throw new PortForwardError('tunnel-closed', `the tunnel to pod ${this.label} is closed (the proxy is stopping)`);
      }
      this.sessions.add(session);
      this.session = session;
      this.requestId = 0;
      this.idleSinceMs = undefined;
      this.transport = opened.transport;
      // Debug: tunnels open and close (idle) as connections come and go.
      this.deps.logger.debug({ pod: this.label, transport: opened.transport }, 'port-forward tunnel open');
      return session;
    } catch (err) {
      const failure = err instanceof PortForwardError ? err : new PortForwardError('network', `pod ${this.label}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
      this.deps.onOpenFailed?.(this.pod, failure);
      throw failure;
    } finally {
      this.opening = undefined;
    }
  }

  private onClosed(session: SpdySession, err: PortForwardError | undefined): void {
    this.sessions.delete(session);
    if (this.session === session) {
      this.session = undefined;
      this.transport = undefined;
    }
    if (err !== undefined) this.deps.logger.info({ pod: this.label, reason: err.failure, err: err.message }, 'port-forward tunnel dropped; the next connection opens a new one');
    else this.deps.logger.debug({ pod: this.label }, 'port-forward tunnel closed');
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number, label: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      const err: NodeJS.ErrnoException = new Error(`connect ETIMEDOUT: the tunnel to pod ${label} did not open within ${ms} ms`);
      err.code = 'ETIMEDOUT';
      err.syscall = 'connect';
      reject(err);
    }, ms);
    promise.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err instanceof Error ? err : new Error(String(err)));
      },
    );
  });
}
