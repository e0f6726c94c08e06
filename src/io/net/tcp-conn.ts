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
