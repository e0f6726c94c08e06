import { connect, type Socket } from 'node:net';
import type { Dialer, DialRequest } from '../../seams/dialer.js';

/** Go's net.Dialer and net.ListenConfig default: keepalive probes after 15 s without traffic. */
export const DEFAULT_TCP_KEEPALIVE_MS = 15_000;

/**
 * How long a dialed socket lives before it is given keepalive: a second to two (the batch's tick).
 * Keepalive only matters to a connection idle for the whole keepalive delay (15 s by default), so
 * one that ends within a second never needs it, and a short connection, the common kind, is spared
 * its four setsockopt() calls (about 2% of its CPU on loopback).
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
 * while there are young sockets. The accepted leg gets it for free from the listening socket.
 */
export class DirectDialer implements Dialer {
  private readonly keepAliveDelayMs: number;
  /** Connected during the current tick, then during the last: the latter get keepalive at the next tick. */
  private young: Socket[] = [];
  private older: Socket[] = [];
  private ticker: NodeJS.Timeout | undefined;

  constructor(opts: DirectDialerOptions = {}) {
    const ms = opts.keepAliveMs ?? DEFAULT_TCP_KEEPALIVE_MS;
    // Node passes whole seconds on; under one, the kernel would keep its default of two hours.
    this.keepAliveDelayMs = ms > 0 ? Math.max(1000, ms) : 0;
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
    this.young.push(socket);
    if (this.ticker !== undefined) return;
    this.ticker = setInterval(() => this.tick(), KEEPALIVE_AFTER_MS);
    this.ticker.unref();
  }

  /** The sockets that connected during the tick before last and are still open get keepalive. */
  private tick(): void {
    for (const socket of this.older) {
      if (!socket.destroyed) socket.setKeepAlive(true, this.keepAliveDelayMs);
    }
    this.older = this.young;
    this.young = [];
    if (this.older.length === 0) {
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
