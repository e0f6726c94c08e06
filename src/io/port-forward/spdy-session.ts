import type { Duplex } from 'node:stream';
import { PortForwardError } from './port-forward-error.js';
import {
  FLAG_FIN,
  FrameReader,
  FrameType,
  MAX_FRAME_PAYLOAD,
  RstStatus,
  dataFrameHeader,
  goAwayFrame,
  pingFrame,
  readGoAway,
  readPing,
  readRstStream,
  readStreamHeaders,
  readSynStream,
  rstStreamFrame,
  synStreamFrame,
} from './spdy-frames.js';
import { HeaderBlockWriter, type HeaderPairs } from './spdy-headers.js';

/** What a session tells the owner of one of its streams. Calls come in frame order. */
export interface SessionStream {
  /** The peer's SYN_REPLY: it took the stream. */
  onReply(): void;
  /** A DATA frame (`data` is a view into the read: copy what must outlive the call); `fin`: the peer's half is done. */
  onData(data: Buffer, fin: boolean): void;
  /** The peer reset the stream (RST_STREAM); the session has forgotten it. */
  onReset(status: number): void;
  /** The session failed, or went away before the peer took the stream; the session has forgotten it. */
  onFail(err: PortForwardError): void;
  /** write() may be called again after writeData returned false. */
  onDrain(): void;
}

export interface SpdySessionOptions {
  /** The tunnel: a socket after the SPDY upgrade, or a WebSocket as a byte stream. */
  pipe: Duplex;
  /** Bytes the pipe delivered with its upgrade (read past the HTTP headers): the first frames. */
  head?: Buffer;
  now: () => number;
  /** Once, when the session is over: `err` unless it closed cleanly (GOAWAY from us). */
  onClosed: (session: SpdySession, err: PortForwardError | undefined) => void;
}

const MAX_STREAM_ID = 0x7fffffff;
const EMPTY = Buffer.alloc(0);

/**
 * The client half of one SPDY/3.1 connection, as spdystream (the kubelet's end) speaks it:
 *
 * - Streams are opened by SYN_STREAM (odd ids, increasing) and may carry DATA at once: spdystream
 *   handles each stream's frames in order on one worker, so its reply is sent before our data is
 *   read, and nothing waits a round trip for the SYN_REPLY.
 * - No SPDY flow control: spdystream neither sends WINDOW_UPDATE nor reads it (an "unhandled
 *   frame" in its log), so windows would stall every stream after 64 KiB. Backpressure is TCP's,
 *   for the whole tunnel: pauseReading() stops reading the pipe, a full pipe refuses writes.
 * - PINGs keep the tunnel alive and prove it is: keepAlive() sends one after a quiet spell and
 *   fails the session when it is not answered in time.
 * - GOAWAY from the peer: streams above its last good id were never taken and fail at once;
 *   the others run on, and the session closes when they are done.
 */
export class SpdySession {
  private readonly pipe: Duplex;
  private readonly reader: FrameReader;
  private readonly headers = new HeaderBlockWriter();
  private readonly streams = new Map<number, SessionStream>();
  private readonly drainWaiters = new Set<SessionStream>();
  private nextStreamId = 1;
  private nextPingId = 1;
  private pauses = 0;
  private ended = false;
  private goingAway = false;
  /** When the last byte came from the peer (now()): a quiet tunnel is pinged. */
  private lastReceivedMs: number;
  /** The PING awaiting its answer, and since when. */
  private pingOutstanding: { id: number; sentMs: number } | undefined;
  /** The last PING's round trip, ms. */
  rttMs: number | undefined;

  constructor(private readonly opts: SpdySessionOptions) {
    this.pipe = opts.pipe;
    this.lastReceivedMs = opts.now();
    this.reader = new FrameReader({
      data: (id, fin, data) => this.onData(id, fin, data),
      control: (type, flags, payload) => this.onControl(type, flags, payload),
    });
    this.pipe.on('data', (chunk: Buffer) => this.onChunk(chunk));
    this.pipe.on('drain', () => this.onPipeDrain());
    this.pipe.on('end', () => this.fail(new PortForwardError('tunnel-closed', 'the tunnel was closed by the other end')));
    this.pipe.on('error', (err) => this.fail(new PortForwardError('tunnel-closed', `the tunnel failed: ${err.message}`, { cause: err })));
    this.pipe.on('close', () => this.fail(new PortForwardError('tunnel-closed', 'the tunnel was closed')));
    if (opts.head !== undefined && opts.head.length > 0) this.onChunk(opts.head);
  }

  /** New streams may be opened: not failed, not going away, stream ids left for a pair. */
  get usable(): boolean {
    return !this.ended && !this.goingAway && this.nextStreamId < MAX_STREAM_ID - 4;
  }

  get closed(): boolean {
    return this.ended;
  }

  /** Streams open now. */
  get streamCount(): number {
    return this.streams.size;
  }

  /** Sends SYN_STREAM; returns the stream's id. Precondition: `usable`. */
  openStream(headers: HeaderPairs, handler: SessionStream): number {
    const id = this.nextStreamId;
    this.nextStreamId += 2;
    this.streams.set(id, handler);
    this.pipe.write(synStreamFrame(id, this.headers.encode(headers)));
    return id;
  }

  /**
   * One DATA frame per call (split only past the 16 MiB frame limit), its header written ahead of
   * the payload so the payload is never copied. False: the pipe is full, wait for onDrain.
   */
  writeData(id: number, data: Uint8Array, fin: boolean, waiter: SessionStream): boolean {
    if (this.ended) return false;
    const pipe = this.pipe;
    let ok = true;
    pipe.cork();
    let offset = 0;
    do {
      const piece = data.length - offset > MAX_FRAME_PAYLOAD ? data.subarray(offset, offset + MAX_FRAME_PAYLOAD) : offset === 0 ? data : data.subarray(offset);
      offset += piece.length;
      const last = offset >= data.length;
      pipe.write(dataFrameHeader(id, piece.length, fin && last));
      if (piece.length > 0) ok = pipe.write(piece);
    } while (offset < data.length);
    pipe.uncork();
    ok &&= !pipe.writableNeedDrain;
    if (!ok) this.drainWaiters.add(waiter);
    return ok;
  }

  /** RST_STREAM, and the stream is forgotten. */
  reset(id: number, status: number = RstStatus.CANCEL): void {
    this.streams.delete(id);
    if (!this.ended) this.pipe.write(rstStreamFrame(id, status));
    this.closeIfDrained();
  }

  /** Forget a stream both sides have finished. */
  release(id: number): void {
    this.streams.delete(id);
    this.closeIfDrained();
  }

  /** Stop reading the pipe (a stream's reader is slow): counted, so every pauser must resume. */
  pauseReading(): void {
    if (this.pauses++ === 0) this.pipe.pause();
  }

  resumeReading(): void {
    if (this.pauses > 0 && --this.pauses === 0) {
      // The clock of an outstanding PING starts over: its answer may be queued behind what we did not read.
      if (this.pingOutstanding) this.pingOutstanding.sentMs = this.opts.now();
      this.pipe.resume();
    }
  }

  /**
   * Called by the tunnel's sweep: PING after `intervalMs` without a byte from the peer, and fail
   * the session when a PING waits longer than `timeoutMs` (not while reading is paused: the
   * answer may wait behind the unread bytes).
   */
  keepAlive(nowMs: number, intervalMs: number, timeoutMs: number): void {
    if (this.ended) return;
    const ping = this.pingOutstanding;
    if (ping) {
      if (this.pauses === 0 && nowMs - ping.sentMs > timeoutMs) {
        this.fail(new PortForwardError('tunnel-unresponsive', `the tunnel answered no PING within ${timeoutMs} ms`));
      }
      return;
    }
    if (nowMs - this.lastReceivedMs < intervalMs) return;
    const id = this.nextPingId;
    this.nextPingId = id >= MAX_STREAM_ID - 2 ? 1 : id + 2;
    this.pingOutstanding = { id, sentMs: nowMs };
    this.pipe.write(pingFrame(id));
  }

  /** Close cleanly: GOAWAY, then the pipe once written. Streams still open fail. */
  close(): void {
    if (this.ended) return;
    this.pipe.write(goAwayFrame(0));
    this.finish(undefined, new PortForwardError('tunnel-closed', 'the tunnel was closed'));
    this.pipe.end();
  }

  /** Fail the session and every stream on it. */
  destroy(err: PortForwardError): void {
    this.fail(err);
  }

  // --- reading ----------------------------------------------------------------------------------

  private onChunk(chunk: Buffer): void {
    if (this.ended) return;
    this.lastReceivedMs = this.opts.now();
    try {
      this.reader.push(chunk);
    } catch (err) {
      this.fail(new PortForwardError('protocol', `the tunnel broke SPDY framing: ${err instanceof Error ? err.message : String(err)}`, { cause: err }));
    }
  }

  private onData(id: number, fin: boolean, data: Buffer): void {
    const stream = this.streams.get(id);
    // A stream we reset or released: its late frames are dropped, as spdystream does.
    if (stream === undefined) return;
    stream.onData(data, fin);
  }

  private onControl(type: number, flags: number, payload: Buffer): void {
    switch (type) {
      case FrameType.SYN_REPLY: {
        const { streamId } = readStreamHeaders(payload, 'SYN_REPLY');
        const stream = this.streams.get(streamId);
        stream?.onReply();
        if ((flags & FLAG_FIN) !== 0) this.streams.get(streamId)?.onData(EMPTY, true);
        break;
      }
      case FrameType.HEADERS: {
        const { streamId } = readStreamHeaders(payload, 'HEADERS');
        if ((flags & FLAG_FIN) !== 0) this.streams.get(streamId)?.onData(EMPTY, true);
        break;
      }
      case FrameType.RST_STREAM: {
        const { streamId, status } = readRstStream(payload);
        const stream = this.streams.get(streamId);
        if (stream === undefined) break;
        this.streams.delete(streamId);
        stream.onReset(status);
        this.closeIfDrained();
        break;
      }
      case FrameType.PING: {
        const id = readPing(payload);
        // Even ids are the server's: echo them. Odd ones answer ours.
        if (id % 2 === 0) this.pipe.write(pingFrame(id));
        else if (this.pingOutstanding?.id === id) {
          this.rttMs = this.opts.now() - this.pingOutstanding.sentMs;
          this.pingOutstanding = undefined;
        }
        break;
      }
      case FrameType.GOAWAY:
        this.onGoAway(readGoAway(payload).lastGoodStreamId);
        break;
      case FrameType.SYN_STREAM: {
        // Port-forward's server opens no streams: refuse, as spdystream's client does.
        const { streamId } = readSynStream(payload);
        this.pipe.write(rstStreamFrame(streamId, RstStatus.REFUSED_STREAM));
        break;
      }
      default:
        // SETTINGS, WINDOW_UPDATE (no flow control here, see above) and types unknown: ignored.
        break;
    }
  }

  private onGoAway(lastGood: number): void {
    this.goingAway = true;
    for (const [id, stream] of [...this.streams]) {
      if (id <= lastGood) continue;
      this.streams.delete(id);
      stream.onFail(new PortForwardError('going-away', 'the tunnel went away (GOAWAY) before the stream was taken'));
    }
    this.closeIfDrained();
  }

  private onPipeDrain(): void {
    if (this.drainWaiters.size === 0) return;
    const waiters = [...this.drainWaiters];
    this.drainWaiters.clear();
    for (const w of waiters) w.onDrain();
  }

  /** A session that went away (either side) ends once its last stream does. */
  private closeIfDrained(): void {
    if (this.goingAway && !this.ended && this.streams.size === 0) {
      this.finish(undefined, undefined);
      this.pipe.end();
    }
  }

  private fail(err: PortForwardError): void {
    if (this.ended) return;
    this.finish(err, err);
    this.pipe.destroy();
  }

  /** Ends the session once: open streams fail with `streamErr`, the owner hears `err`. */
  private finish(err: PortForwardError | undefined, streamErr: PortForwardError | undefined): void {
    this.ended = true;
    this.drainWaiters.clear();
    const open = [...this.streams.values()];
    this.streams.clear();
    if (streamErr !== undefined) for (const s of open) s.onFail(streamErr);
    this.opts.onClosed(this, err);
  }
}
