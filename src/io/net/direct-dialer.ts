import { connect, type Socket } from 'node:net';
import type { Dialer, DialRequest } from '../../seams/dialer.js';

/** Go's net.Dialer and net.ListenConfig default: keepalive probes after 15 s without traffic. */
export const DEFAULT_TCP_KEEPALIVE_MS = 15_000;

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
 * already chose to write. Keepalive is given to connect(), which sets it with noDelay as the
 * socket connects: no extra call per connection.
 */
export class DirectDialer implements Dialer {
  private readonly keepAlive: boolean;
  private readonly keepAliveInitialDelay: number;

  constructor(opts: DirectDialerOptions = {}) {
    const ms = opts.keepAliveMs ?? DEFAULT_TCP_KEEPALIVE_MS;
    this.keepAlive = ms > 0;
    // Node passes whole seconds on; under one, the kernel would keep its default of two hours.
    this.keepAliveInitialDelay = this.keepAlive ? Math.max(1000, ms) : 0;
  }

  dial(req: DialRequest): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const socket = connect({
        host: req.endpoint.ip,
        port: req.endpoint.port,
        allowHalfOpen: true,
        noDelay: true,
        keepAlive: this.keepAlive,
        keepAliveInitialDelay: this.keepAliveInitialDelay,
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
        resolve(socket);
      });
    });
  }
}

function timeoutError(req: DialRequest): NodeJS.ErrnoException {
  const err: NodeJS.ErrnoException = new Error(`connect ETIMEDOUT ${req.endpoint.addr} (after ${req.timeoutMs} ms)`);
  err.code = 'ETIMEDOUT';
  err.syscall = 'connect';
  return err;
}
