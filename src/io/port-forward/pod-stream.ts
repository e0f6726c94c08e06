import { EventEmitter } from 'node:events';
import type { OnReadOpts } from 'node:net';
import type { Upstream } from '../../seams/dialer.js';
import { PortForwardError } from './port-forward-error.js';
import { RstStatus } from './spdy-frames.js';
import type { SessionStream, SpdySession } from './spdy-session.js';

/** The bytes written to a stream before its pod spoke, kept for a re-dial; past this, none are kept. */
export const DEFAULT_KEEP_LIMIT = 256 * 1024;
/** A stream whose reader is slow holds this much before the whole tunnel stops reading. */
const QUEUE_HIGH = 256 * 1024;
/** The error stream carries one message; a peer that sends more is cut off here. */
const MAX_ERROR_MESSAGE = 64 * 1024;

export interface PodStreamOptions {
  session: SpdySession;
  /** The pod's port. */
  port: number;
  /** Pairs the error and data streams on the kubelet's side (client-go counts from 0 per tunnel). */
  requestId: number;
  onread?: OnReadOpts;
  keepLimit?: number;
  /** For messages: `namespace/name`. */
  pod: string;
}

/**
 * One connection to a pod's port through a tunnel (client-go's handleConnection): a pair of SPDY
 * streams, `error` then `data`, with headers `streamType`, `port` and `requestID`. The error
 * stream is half-closed at once (we never write to it); the kubelet writes a message on it when
 * the forward fails, then closes it.
 *
 * It is an Upstream (seams/dialer.ts), read through the connection's `onread`:
 *
 * - The pod's FIN is passed on ('end') only once the error stream has closed without a message:
 *   the kubelet closes the data stream before it reports a forward that failed midway, and a
 *   client must not mistake a cut stream for a complete one.
 * - A failure before the pod sent a byte (the error stream's message, a reset, the tunnel gone)
 *   is an EarlyFailure: the error carries every byte written (up to `keepLimit`), and the
 *   connection tries the next endpoint with them. Kept chunks are the caller's: the connection
 *   writes each chunk once and never reuses it.
 * - Backpressure: a read the connection refuses (onread answered false) is queued; past
 *   QUEUE_HIGH the whole tunnel stops reading until resume() drains it. Writes answer false while
 *   the tunnel's pipe is full.
 * - Half-close: end() sends the data stream's FIN, as kubectl does when its client half-closes.
 *   What the pod sees then is the runtime's doing: containerd and CRI-O stop copying one second
 *   after either direction ends and close the pod's connection (no shutdown(SHUT_WR)), so a reply
 *   that comes later than that after the client's FIN is lost, exactly as with kubectl.
 */
export class PodStream extends EventEmitter implements Upstream, SessionStream {
  bytesRead = 0;
  bytesWritten = 0;
  readonly writableLength = 0;
  readableEnded = false;
  destroyed = false;
  closed = false;

  private readonly session: SpdySession;
  private readonly errorStream: number;
  private readonly dataStream: number;
  private readonly onread: OnReadOpts | undefined;
  private readonly keepLimit: number;
  private readonly pod: string;
  private readonly port: number;
  /** Every byte written until the pod's first, for a re-dial; undefined once it spoke or past the limit. */
  private kept: Uint8Array[] | undefined = [];
  private keptBytes = 0;
  /** Reads the connection refused for now, copied; delivered by resume(). */
  private queue: Buffer[] = [];
  private queuedBytes = 0;
  private stopped = false;
  /** This stream holds the tunnel's reading paused. */
  private holdsTunnel = false;
  private localFin = false;
  private remoteFin = false;
  private errorClosed = false;
  private errorMessage: Buffer[] = [];
  private errorBytes = 0;
  /** The error stream's half, which arrives on its own SessionStream. */
  private readonly errorSide: SessionStream;

  constructor(opts: PodStreamOptions) {
    super();
    this.session = opts.session;
    this.onread = opts.onread;
    this.keepLimit = opts.keepLimit ?? DEFAULT_KEEP_LIMIT;
    this.pod = opts.pod;
    this.port = opts.port;
    const port = String(opts.port);
    const requestId = String(opts.requestId);
    this.errorSide = {
      onReply: () => {},
      onData: (data, fin) => this.onErrorData(data, fin),
      onReset: () => this.onErrorData(Buffer.alloc(0), true),
      onFail: (err) => this.fail(err),
      onDrain: () => {},
    };
    // client-go's order: the error stream first, half-closed at once, then the data stream.
    this.errorStream = opts.session.openStream([['streamtype', 'error'], ['port', port], ['requestid', requestId]], this.errorSide);
    opts.session.writeData(this.errorStream, Buffer.alloc(0), true, this.errorSide);
    this.dataStream = opts.session.openStream([['streamtype', 'data'], ['port', port], ['requestid', requestId]], this);
  }

  // --- Upstream -----------------------------------------------------------------------------------

  write(chunk: Uint8Array): boolean {
    if (this.destroyed || this.localFin) return false;
    this.bytesWritten += chunk.length;
    if (this.kept !== undefined) {
      this.keptBytes += chunk.length;
      if (this.keptBytes <= this.keepLimit) this.kept.push(chunk);
      else this.kept = undefined;
    }
    return this.session.writeData(this.dataStream, chunk, false, this);
  }

  end(): void {
    if (this.destroyed || this.localFin) return;
    this.localFin = true;
    this.session.writeData(this.dataStream, Buffer.alloc(0), true, this);
    this.closeIfDone();
  }

  /**
   * Both directions done, or the pod's done and ours with nothing to say: closed quietly. Otherwise
   * the streams are reset, as a socket closed with unread data is.
   */
  destroy(): void {
    if (this.destroyed) return;
    if (this.readableEnded && !this.localFin) this.end();
    if (this.destroyed) return;
    this.teardown(!(this.localFin && this.remoteFin && this.errorClosed));
  }

  resetAndDestroy(): void {
    if (this.destroyed) return;
    this.teardown(true);
  }

  resume(): void {
    if (!this.stopped || this.destroyed) return;
    this.stopped = false;
    while (this.queue.length > 0 && !this.stopped) {
      const chunk = this.queue.shift() as Buffer;
      this.queuedBytes -= chunk.length;
      this.deliver(chunk);
    }
    if (this.holdsTunnel && this.queuedBytes < QUEUE_HIGH / 2) {
      this.holdsTunnel = false;
      this.session.resumeReading();
    }
    this.maybeEnd();
  }

  // --- SessionStream (the data stream) --------------------------------------------------------------

  onReply(): void {}

  onData(data: Buffer, fin: boolean): void {
    if (this.destroyed) return;
    if (data.length > 0) {
      this.kept = undefined;
      this.bytesRead += data.length;
      if (this.stopped || this.queue.length > 0) this.enqueue(data);
      else this.deliver(data);
    }
    if (fin) {
      this.remoteFin = true;
      this.maybeEnd();
    }
  }

  onReset(status: number): void {
    this.fail(new PortForwardError('reset', `the stream to pod ${this.pod} port ${this.port} was reset (status ${status})`));
  }

  onFail(err: PortForwardError): void {
    this.fail(err);
  }

  onDrain(): void {
    if (!this.destroyed) this.emit('drain');
  }

  // --- inside -------------------------------------------------------------------------------------

  private deliver(data: Buffer): void {
    const onread = this.onread;
    if (onread === undefined) {
      this.emit('data', Buffer.from(data));
      return;
    }
    // The connection copies what it keeps: a view of the tunnel's read is enough.
    if (!onread.callback(data.length, data)) this.stopped = true;
  }

  private enqueue(data: Buffer): void {
    this.queue.push(Buffer.from(data));
    this.queuedBytes += data.length;
    if (!this.holdsTunnel && this.queuedBytes > QUEUE_HIGH) {
      this.holdsTunnel = true;
      this.session.pauseReading();
    }
  }

  private onErrorData(data: Buffer, fin: boolean): void {
    if (this.destroyed) return;
    if (data.length > 0 && this.errorBytes < MAX_ERROR_MESSAGE) {
      this.errorMessage.push(Buffer.from(data));
      this.errorBytes += data.length;
    }
    if (!fin) return;
    this.errorClosed = true;
    if (this.errorBytes > 0) {
      const message = Buffer.concat(this.errorMessage).toString('utf8').slice(0, 1000);
      this.fail(new PortForwardError('refused', `pod ${this.pod} port ${this.port}: ${message}`));
      return;
    }
    this.maybeEnd();
  }

  /** The pod's FIN goes on once its bytes have and the error stream closed clean. */
  private maybeEnd(): void {
    if (this.readableEnded || this.destroyed || !this.remoteFin || !this.errorClosed || this.queue.length > 0) return;
    this.readableEnded = true;
    this.emit('end');
    this.closeIfDone();
  }

  private closeIfDone(): void {
    if (this.localFin && this.readableEnded) this.teardown(false);
  }

  /** A failure: an EarlyFailure (with the kept bytes) when the pod has sent nothing yet. */
  private fail(err: PortForwardError): void {
    if (this.destroyed) return;
    const early = this.kept !== undefined && this.bytesRead === 0 && !this.readableEnded;
    const own = err.forStream(early ? this.kept : undefined);
    this.teardown(true);
    this.emit('error', own);
  }

  private teardown(reset: boolean): void {
    this.destroyed = true;
    this.kept = undefined;
    this.queue = [];
    this.queuedBytes = 0;
    if (this.holdsTunnel) {
      this.holdsTunnel = false;
      this.session.resumeReading();
    }
    if (reset && !this.session.closed) {
      this.session.reset(this.dataStream, RstStatus.CANCEL);
      this.session.reset(this.errorStream, RstStatus.CANCEL);
    } else {
      this.session.release(this.dataStream);
      this.session.release(this.errorStream);
    }
    process.nextTick(() => {
      this.closed = true;
      this.emit('close');
    });
  }
}
