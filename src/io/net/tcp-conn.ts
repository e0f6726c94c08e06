import type { Socket } from 'node:net';
import type { Endpoint } from '../../core/model.js';

/** One accepted client and, once dialed, its endpoint connection. */
export interface TcpConn {
  readonly client: Socket;
  /** Kept from accept: the socket forgets its peer once closed. */
  readonly clientIP: string;
  readonly clientPort: number;
  upstream: Socket | undefined;
  endpoint: Endpoint | undefined;
  /** A dial (with its retries) is in flight; it holds the connection open. */
  dialing: boolean;
  /**
   * What still holds the connection open: the client socket until its 'close', a dial in flight,
   * the upstream socket until its 'close'. At zero every descriptor is gone and the books close.
   */
  holds: number;
}

/**
 * Copy `from` into `to` with backpressure, and pass `from`'s end (FIN) on as `to`'s end. This is
 * what `from.pipe(to)` does for a socket pair, without its bookkeeping: pipe() registers about
 * seven listeners per direction, and unpipe handling that a proxied connection never needs, as
 * both sockets live and die together (an error on one resets the other; see TcpProxySocket).
 * Here it is three listeners per direction, and per chunk one listener call and one write.
 *
 * Precondition: `from` is paused (pauseOnConnect) and nothing else reads it.
 */
export function relay(from: Socket, to: Socket): void {
  from.on('data', (chunk: Buffer) => {
    if (!to.write(chunk)) from.pause();
  });
  to.on('drain', () => from.resume());
  from.on('end', () => passEnd(to));
  from.resume();
}

/**
 * Pass a FIN on. When `to`'s own peer has already ended and nothing waits to be written, both
 * directions are done: closing the socket sends the FIN itself, which spares a shutdown() and the
 * stream's finish round (the second FIN of every short connection). Otherwise end() half-closes.
 */
function passEnd(to: Socket): void {
  if (to.readableEnded && to.writableLength === 0 && !to.destroyed) to.destroy();
  else to.end();
}

/**
 * Close with RST (SO_LINGER 0) so the peer sees ECONNRESET, not a clean end. Falls back to a
 * plain destroy for sockets without a TCP handle (a dialer may hand back a tunnelled stream).
 */
export function resetSocket(socket: Socket): void {
  try {
    socket.resetAndDestroy();
  } catch {
    socket.destroy();
  }
}
