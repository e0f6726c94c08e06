import type { Socket } from 'node:net';
import type { Endpoint } from '../../core/model.js';

/**
 * The dialer seam. The default dials the endpoint directly over TCP; later dialers may tunnel
 * through the API server's port-forward, or prefix a PROXY protocol v2 header, which is why the
 * request carries the client's and the portal's addresses.
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
}

export interface Dialer {
  /** Resolves with a connected socket, or rejects with a Node system error (ECONNREFUSED, ETIMEDOUT, ...). */
  dial(req: DialRequest): Promise<Socket>;
}
