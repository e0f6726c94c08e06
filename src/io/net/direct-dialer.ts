import { connect, type Socket } from 'node:net';
import type { Dialer, DialRequest } from '../../seams/dialer.js';

/** Go's net.Dialer and net.ListenConfig default: keepalive probes after 15 s without traffic. */
export const DEFAULT_TCP_KEEPALIVE_MS = 15_000;

/**
 * A keepalive delay as the kernel takes it: whole seconds (Node passes ms / 1000 on, floored),
 * at least one (0 would leave the kernel's default of two hours); 0 for off. Both legs use it.
 */
export function keepAliveDelayMs(ms: number): number {
  return ms > 0 ? Math.max(1, Math.floor(ms / 1000)) * 1000 : 0;
}

/**
 * How long a dialed socket lives before it is given keepalive: a second to two (the batch's tick).
 * Keepalive only matters to a connection idle for the whole keepalive delay (15 s by default), so
 * one that ends within a second never needs it, and a short connection, the common kind, is spared
 * its four setsockopt() calls.
 */
export const KEEPALIVE_AFTER_MS = 1000;

export interface DirectDialerOptions {
  /**
   * TCP keepalive on dialed sockets: probes after this long without traffic, so an endpoint that
   * vanished without FIN or RST is found out. Whole seconds (the kernel's unit); 0 turns it off.
   */
  keepAliveMs?: number;
}

/**
 * Dials the endpoint directly over TCP. Half-open is allowed so a client's FIN can be passed on
 * while the reply still flows back; Nagle is off because the proxy only relays what the peers
 * already chose to write.
 *
 * Keepalive is set in batches, on the sockets still open one to two ticks after they connected
 * (see KEEPALIVE_AFTER_MS): one timer for the dialer, not one per connection, and running only
 * while sockets wait. A socket leaves the batch when it closes, so a short connection is not kept
 * reachable (and promoted to the old generation) for the second it would otherwise wait. The
 * accepted leg gets keepalive the same way, from its port's sweep (TcpProxySocket.sweepKeepAlive).
 */
export class DirectDialer implements Dialer {
  private readonly keepAliveDelayMs: number;
  /** Sockets waiting for keepalive, with the tick during which each connected. */
  private readonly waiting = new Map<Socket, number>();
  private tickCount = 0;
  private ticker: NodeJS.Timeout | undefined;
  /** A 'close' listener shared by every socket (EventEmitter calls it with the socket as `this`). */
  private readonly forget: (this: Socket) => void;

  constructor(opts: DirectDialerOptions = {}) {
    this.keepAliveDelayMs = keepAliveDelayMs(opts.keepAliveMs ?? DEFAULT_TCP_KEEPALIVE_MS);
    const waiting = this.waiting;
    this.forget = function (this: Socket): void {
      waiting.delete(this);
    };
  }

  dial(req: DialRequest): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const socket = connect({
        host: req.endpoint.ip,
        port: req.endpoint.port,
        allowHalfOpen: true,
        noDelay: true,
        onread: req.onread,
      });
      const onError = (err: Error): void => {
        clearTimeout(timer);
        reject(err);
      };
      // destroy() without an error emits no 'error', so the timeout rejection is the only outcome.
      const timer = setTimeout(() => {
        socket.off('error', onError);
        socket.destroy();
        reject(timeoutError(req));
      }, req.timeoutMs);
      socket.once('error', onError);
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.off('error', onError);
        if (this.keepAliveDelayMs > 0) this.keepAliveLater(socket);
        resolve(socket);
      });
    });
  }

  private keepAliveLater(socket: Socket): void {
    this.waiting.set(socket, this.tickCount);
    socket.on('close', this.forget);
    if (this.ticker !== undefined) return;
    this.ticker = setInterval(() => this.tick(), KEEPALIVE_AFTER_MS);
    this.ticker.unref();
  }

  /** The sockets that connected before the last tick, and are still open, get keepalive. */
  private tick(): void {
    for (const [socket, connectedIn] of this.waiting) {
      if (connectedIn === this.tickCount) continue;
      this.waiting.delete(socket);
      socket.setKeepAlive(true, this.keepAliveDelayMs);
    }
    this.tickCount++;
    if (this.waiting.size === 0) {
      clearInterval(this.ticker);
      this.ticker = undefined;
    }
  }
}

function timeoutError(req: DialRequest): NodeJS.ErrnoException {
  const err: NodeJS.ErrnoException = new Error(`connect ETIMEDOUT ${req.endpoint.addr} (after ${req.timeoutMs} ms)`);
  err.code = 'ETIMEDOUT';
  err.syscall = 'connect';
  return err;
}
