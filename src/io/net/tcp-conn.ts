import type { OnReadOpts, Socket } from 'node:net';
import type { Endpoint } from '../../core/model.js';

/** One accepted client and, once dialed, its endpoint connection. */
export interface TcpConn {
  readonly client: Socket;
  /**
   * Kept from accept (the socket forgets its peer once closed), when the balancer or the debug
   * log needs it; '' otherwise.
   */
  readonly clientIP: string;
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
  relayEnd(from, to);
  from.resume();
}

/**
 * The endpoint-to-client direction of a connection whose endpoint socket delivers its bytes
 * through `readInto(to)` (net.connect's onread): the reads already reach `to`, so what is left is
 * backpressure's other half and the FIN.
 */
export function relayEnd(from: Socket, to: Socket): void {
  // A read callback that returned false stopped reading; resume() starts it again.
  to.on('drain', () => from.resume());
  from.on('end', () => passEnd(to));
}

/**
 * For relayEnd(from, to) set up after `from` was already reading into `to` (readInto): a dialer may
 * resolve some time after its socket connected (one that writes a PROXY header and waits for it, a
 * tunnel), and what relayEnd listens for may have happened before it listened. A FIN already seen
 * is passed on now; a read that stopped for backpressure (a false from the onread callback stops
 * the read without pausing the stream, so only `reads` can tell) is started again if its 'drain'
 * already came. With the direct dialer neither can have happened, and this does nothing.
 */
export function catchUp(from: Socket, to: Socket, reads: EndpointReads): void {
  if (from.readableEnded) passEnd(to);
  else if (reads.stopped && !to.writableNeedDrain) from.resume();
}

/**
 * The one buffer every endpoint socket of the process reads into. Node's default read path
 * allocates a 64 KiB buffer per read, wraps it in a stream chunk and emits 'data'; here a read lands
 * in memory that is always there and goes straight to the write. It is shared, so the bytes are
 * copied out before they are written on: a write that does not complete at once keeps a reference
 * to what it was given, and the next read, on any connection, would overwrite them. (A buffer per
 * connection would spare the copy but cost 64 KiB for every idle connection.)
 */
const sharedReadBuffer = new Uint8Array(64 * 1024);

/** net.connect's `onread` for an endpoint socket, and whether it ever stopped reading. */
export interface EndpointReads extends OnReadOpts {
  stopped: boolean;
}

/**
 * net.connect's `onread` for an endpoint socket whose bytes go to `to`. Returning false, when `to`
 * buffers past its high-water mark, makes Node stop reading until relayEnd's 'drain' resumes it.
 */
export function readInto(to: Socket): EndpointReads {
  const reads: EndpointReads = {
    stopped: false,
    buffer: sharedReadBuffer,
    callback: (bytes: number, buf: Uint8Array): boolean => {
      const chunk = Buffer.allocUnsafe(bytes); // from Node's pool when small
      chunk.set(bytes === buf.length ? buf : buf.subarray(0, bytes));
      if (to.write(chunk)) return true;
      reads.stopped = true;
      return false;
    },
  };
  return reads;
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
function passEnd(to: Socket): void {
  if (to.readableEnded) endOrClose(to);
  else setImmediate(endOrClose, to);
}

function endOrClose(to: Socket): void {
  if (to.destroyed) return;
  if (to.readableEnded && to.writableLength === 0) to.destroy();
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
