import type { OnReadOpts } from 'node:net';
import type { Endpoint } from '../core/model.js';

/**
 * The dialer seam. The default dials the endpoint directly over TCP; the port-forward dialer
 * tunnels through the API server (io/port-forward/); a later one may prefix a PROXY protocol v2
 * header, which is why the request carries the client's and the portal's addresses. Those may be
 * getters that ask the kernel (getpeername, getsockname) when read: read the ones you need rather
 * than copying the request.
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
   * When given, every byte the endpoint sends is handed to this, and the upstream emits no 'data'
   * (net.connect's `onread`: a read lands in the given buffer and reaches the callback without a
   * stream chunk, a 'data' event or a fresh 64 KiB allocation). A dialer whose upstream is not its
   * own TCP socket (a tunnel) feeds the callback from its stream itself (it may pass its own
   * buffer rather than `buffer`), and stops reading while the callback's last answer was false,
   * until resume(). Bytes, a FIN or a close that come before the dial resolves are caught up with
   * when it does; until then the dialer owns the upstream, its 'error' events included.
   */
  onread?: OnReadOpts;
}

/**
 * What a dial resolves with: the endpoint's side of one connection, as the connection uses it.
 * A net.Socket is one (the direct dialer's, read through `onread`); a tunnelled stream is another,
 * with the same few members and events, so the direct path keeps its socket untouched.
 *
 * Events: 'error' (then 'close'), 'end' (the endpoint's FIN, once its bytes were handed on),
 * 'drain' (write() may be called again after it returned false), 'close' (every resource gone).
 */
export interface Upstream {
  /** Bytes read from the endpoint and bytes accepted by write(), for the idle sweep and the books. */
  readonly bytesRead: number;
  readonly bytesWritten: number;
  /** Bytes accepted by write() and not yet handed to the kernel (or the tunnel). */
  readonly writableLength: number;
  readonly readableEnded: boolean;
  readonly destroyed: boolean;
  readonly closed: boolean;
  /** False: buffer past the high-water mark; wait for 'drain'. */
  write(chunk: Uint8Array): boolean;
  /** Half-close: no more bytes to the endpoint. */
  end(): unknown;
  destroy(): unknown;
  /** Cut so the endpoint sees an error, not a clean end (TCP RST, a tunnel's RST_STREAM). */
  resetAndDestroy(): unknown;
  /** Read again after `onread`'s callback answered false. */
  resume(): unknown;
  on(event: 'error', listener: (err: Error) => void): unknown;
  on(event: 'close' | 'drain' | 'end', listener: () => void): unknown;
}

export interface Dialer {
  /** Resolves with a connected upstream, or rejects with a Node system error (ECONNREFUSED, ETIMEDOUT, ...). */
  dial(req: DialRequest): Promise<Upstream>;
}

/**
 * An upstream may fail after the dial resolved yet before its endpoint sent a byte, holding every
 * byte written to it: a tunnel learns only then that the pod refused the port (the kubelet reports
 * it on the port-forward error stream once it tried). Its 'error' then carries those bytes under
 * `unsent`, so the connection can treat the failure as a failed dial: pick the next endpoint and
 * write them there, as long as the client has received nothing.
 */
export interface EarlyFailure extends Error {
  /** Every byte the upstream accepted, in order; the FIN passed on is the connection's to repeat. */
  readonly unsent: readonly Uint8Array[];
}

export function isEarlyFailure(err: unknown): err is EarlyFailure {
  return err instanceof Error && Array.isArray((err as Partial<EarlyFailure>).unsent);
}
