import type { OnReadOpts, Socket } from 'node:net';
import type { Endpoint } from '../core/model.js';

/**
 * The dialer seam. The default dials the endpoint directly over TCP; later dialers may tunnel
 * through the API server's port-forward, or prefix a PROXY protocol v2 header, which is why the
 * request carries the client's and the portal's addresses. Those may be getters that ask the kernel
 * (getpeername, getsockname) when read: read the ones you need rather than copying the request.
 */
export interface DialRequest {
  endpoint: Endpoint;
  /** The client as the proxy saw it. */
  clientAddress: string;
  clientPort: number;
  /** The address and port the client connected to (the portal or proxy port). */
  localAddress: string;
  localPort: number;
  /** Give up after this long: the socket is destroyed and the promise rejects with code ETIMEDOUT. */
  timeoutMs: number;
  /**
   * When given, every byte the endpoint sends is handed to this, and the socket emits no 'data'
   * (net.connect's `onread`: a read lands in the given buffer and reaches the callback without a
   * stream chunk, a 'data' event or a fresh 64 KiB allocation). A dialer whose socket is not its
   * own TCP socket (a tunnel) must feed the callback from its stream itself, and stop reading while
   * the callback's last answer was false, until resume(). Bytes, a FIN or a close that come before
   * the dial resolves are caught up with when it does; until then the dialer owns the socket,
   * its 'error' events included.
   */
  onread?: OnReadOpts;
}

export interface Dialer {
  /** Resolves with a connected socket, or rejects with a Node system error (ECONNREFUSED, ETIMEDOUT, ...). */
  dial(req: DialRequest): Promise<Socket>;
}
