/**
 * SPDY/3.1 framing, as far as Kubernetes' port-forward uses it (moby/spdystream on the kubelet's
 * side, k8s.io/apimachinery/pkg/util/httpstream/spdy on kubectl's): the frame layout, the frames
 * written, and an incremental reader. No I/O: the session (spdy-session.ts) owns the connection.
 *
 * Written by hand rather than taken from npm's spdy-transport: that package (node-spdy's framing)
 * has had no release since 2018, drags in a readable-stream 3 and an HPACK implementation for the
 * HTTP/2 half it also speaks, and runs each stream as a full Duplex with its own buffering and
 * SPDY flow-control windows that spdystream never answers. Port-forward needs eight frame types
 * and one header block per stream; they fit in this file.
 *
 * Frame layout (all integers big-endian):
 *   control: 1 | version (15) | type (16) | flags (8) | length (24) | payload
 *   data:    0 | stream id (31)             | flags (8) | length (24) | payload
 */

export const SPDY_VERSION = 3;

export const FrameType = {
  SYN_STREAM: 1,
  SYN_REPLY: 2,
  RST_STREAM: 3,
  SETTINGS: 4,
  PING: 6,
  GOAWAY: 7,
  HEADERS: 8,
  WINDOW_UPDATE: 9,
} as const;

/** FLAG_FIN on SYN_STREAM, SYN_REPLY, HEADERS and DATA: the sender's half of the stream is done. */
export const FLAG_FIN = 0x01;
export const FLAG_UNIDIRECTIONAL = 0x02;

/** RST_STREAM status codes. */
export const RstStatus = {
  PROTOCOL_ERROR: 1,
  INVALID_STREAM: 2,
  REFUSED_STREAM: 3,
  UNSUPPORTED_VERSION: 4,
  CANCEL: 5,
  INTERNAL_ERROR: 6,
  FLOW_CONTROL_ERROR: 7,
  STREAM_IN_USE: 8,
  STREAM_ALREADY_CLOSED: 9,
  FRAME_TOO_LARGE: 11,
} as const;

export const GoAwayStatus = { OK: 0, PROTOCOL_ERROR: 1, INTERNAL_ERROR: 2 } as const;

/** The largest payload one frame carries (the 24-bit length). */
export const MAX_FRAME_PAYLOAD = 0xffffff;

const HEADER_BYTES = 8;

// --- writing ------------------------------------------------------------------------------------

function controlFrame(type: number, flags: number, payloadLength: number): Buffer {
  const frame = Buffer.allocUnsafe(HEADER_BYTES + payloadLength);
  frame.writeUInt32BE((0x8000 | SPDY_VERSION) * 0x10000 + type, 0);
  frame.writeUInt32BE(flags * 0x1000000 + payloadLength, 4);
  return frame;
}

/** SYN_STREAM: opens stream `streamId` (odd from a client) with a compressed header block. */
export function synStreamFrame(streamId: number, headerBlock: Uint8Array, flags = 0): Buffer {
  const frame = controlFrame(FrameType.SYN_STREAM, flags, 10 + headerBlock.length);
  frame.writeUInt32BE(streamId, 8);
  frame.writeUInt32BE(0, 12); // associated-to stream: none
  frame.writeUInt16BE(0, 16); // priority 0 (the highest, as spdystream's CreateStream), slot 0
  frame.set(headerBlock, 18);
  return frame;
}

export function synReplyFrame(streamId: number, headerBlock: Uint8Array, flags = 0): Buffer {
  const frame = controlFrame(FrameType.SYN_REPLY, flags, 4 + headerBlock.length);
  frame.writeUInt32BE(streamId, 8);
  frame.set(headerBlock, 12);
  return frame;
}

/** A control frame whose payload is two 32-bit words (RST_STREAM, GOAWAY, WINDOW_UPDATE). */
function twoWordFrame(type: number, first: number, second: number): Buffer {
  const frame = controlFrame(type, 0, 8);
  frame.writeUInt32BE(first, 8);
  frame.writeUInt32BE(second, 12);
  return frame;
}

export function rstStreamFrame(streamId: number, status: number): Buffer {
  return twoWordFrame(FrameType.RST_STREAM, streamId, status);
}

export function pingFrame(id: number): Buffer {
  const frame = controlFrame(FrameType.PING, 0, 4);
  frame.writeUInt32BE(id, 8);
  return frame;
}

export function goAwayFrame(lastGoodStreamId: number, status: number = GoAwayStatus.OK): Buffer {
  return twoWordFrame(FrameType.GOAWAY, lastGoodStreamId, status);
}

/** SETTINGS with id/value pairs (flags 0 each). */
export function settingsFrame(entries: ReadonlyArray<readonly [number, number]>): Buffer {
  const frame = controlFrame(FrameType.SETTINGS, 0, 4 + 8 * entries.length);
  frame.writeUInt32BE(entries.length, 8);
  entries.forEach(([id, value], i) => {
    frame.writeUInt32BE(id, 12 + 8 * i);
    frame.writeUInt32BE(value, 16 + 8 * i);
  });
  return frame;
}

export function windowUpdateFrame(streamId: number, delta: number): Buffer {
  return twoWordFrame(FrameType.WINDOW_UPDATE, streamId, delta);
}

/**
 * The 8 bytes before a DATA frame's payload: written ahead of the payload itself, so a chunk is
 * never copied into a frame. Precondition: `length` <= MAX_FRAME_PAYLOAD.
 */
export function dataFrameHeader(streamId: number, length: number, fin: boolean): Buffer {
  const header = Buffer.allocUnsafe(HEADER_BYTES);
  header.writeUInt32BE(streamId, 0);
  header.writeUInt32BE((fin ? FLAG_FIN : 0) * 0x1000000 + length, 4);
  return header;
}

// --- reading ------------------------------------------------------------------------------------

/** What the reader hands on, in order. */
export interface FrameHandler {
  /**
   * DATA: a frame's payload, whole or in pieces as it arrives (`fin` on the last piece only).
   * `data` is a view into the reader's input: copy what must outlive the call.
   */
  data(streamId: number, fin: boolean, data: Buffer): void;
  /** A control frame of the given type, whole; decode the payload with the read* helpers below. */
  control(type: number, flags: number, payload: Buffer): void;
}

/** The peer broke the framing (a version other than 3): the connection cannot go on. */
export class SpdyProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SpdyProtocolError';
  }
}

const EMPTY = Buffer.alloc(0);

/**
 * Splits a byte stream into frames. A DATA frame's payload is handed on as it arrives, as views of
 * the input chunks, never joined: the bulk of a tunnel's bytes are read once, by whoever takes
 * them. A control frame (small) and a frame header split across chunks are joined first.
 */
export class FrameReader {
  /** Bytes of a header or a control frame not yet whole. */
  private readonly chunks: Buffer[] = [];
  private buffered = 0;
  /** The DATA frame whose payload is arriving: its stream, its FIN, and the bytes still to come. */
  private dataStream = 0;
  private dataFin = false;
  private dataLeft = 0;

  constructor(private readonly handler: FrameHandler) {}

  /** Throws SpdyProtocolError on a frame this reader cannot take; the handler's throws pass through. */
  push(chunk: Buffer): void {
    let buf = chunk;
    if (this.dataLeft > 0) {
      const n = Math.min(this.dataLeft, buf.length);
      this.dataLeft -= n;
      this.handler.data(this.dataStream, this.dataFin && this.dataLeft === 0, n === buf.length ? buf : buf.subarray(0, n));
      if (n === buf.length) return;
      buf = buf.subarray(n);
    }
    if (this.buffered > 0) {
      this.chunks.push(buf);
      this.buffered += buf.length;
      const needed = this.headNeeds();
      if (this.buffered < needed) return;
      buf = Buffer.concat(this.chunks, this.buffered);
      this.chunks.length = 0;
      this.buffered = 0;
    }
    this.parse(buf);
  }

  /** Bytes held for a header or a control frame not yet whole. */
  get pending(): number {
    return this.buffered;
  }

  /** How many kept bytes the frame at their head needs before it can be parsed. */
  private headNeeds(): number {
    if (this.buffered < HEADER_BYTES) return HEADER_BYTES;
    const head = this.chunks[0] as Buffer;
    const header = head.length >= HEADER_BYTES ? head : Buffer.concat(this.chunks, HEADER_BYTES);
    // A DATA frame needs only its header: its payload streams.
    return (header.readUInt32BE(0) & 0x80000000) === 0 ? HEADER_BYTES : HEADER_BYTES + (header.readUInt32BE(4) & MAX_FRAME_PAYLOAD);
  }

  private parse(buf: Buffer): void {
    let offset = 0;
    while (buf.length - offset >= HEADER_BYTES) {
      const first = buf.readUInt32BE(offset);
      const second = buf.readUInt32BE(offset + 4);
      const length = second & MAX_FRAME_PAYLOAD;
      const flags = second >>> 24;
      const start = offset + HEADER_BYTES;
      if ((first & 0x80000000) === 0) {
        const id = first & 0x7fffffff;
        const fin = (flags & FLAG_FIN) !== 0;
        const have = Math.min(length, buf.length - start);
        offset = start + have;
        if (have < length) {
          this.dataStream = id;
          this.dataFin = fin;
          this.dataLeft = length - have;
          if (have > 0) this.handler.data(id, false, buf.subarray(start, offset));
          return;
        }
        this.handler.data(id, fin, length === 0 ? EMPTY : buf.subarray(start, offset));
        continue;
      }
      const end = start + length;
      if (end > buf.length) break;
      offset = end;
      const version = (first >>> 16) & 0x7fff;
      if (version !== SPDY_VERSION) throw new SpdyProtocolError(`SPDY version ${version} frame; only version 3 is spoken`);
      this.handler.control(first & 0xffff, flags, buf.subarray(start, end));
    }
    if (offset < buf.length) {
      const rest = buf.subarray(offset);
      this.chunks.push(rest);
      this.buffered = rest.length;
    }
  }
}

export interface SynStream {
  streamId: number;
  associatedTo: number;
  priority: number;
  headerBlock: Buffer;
}

export function readSynStream(payload: Buffer): SynStream {
  need(payload, 10, 'SYN_STREAM');
  return {
    streamId: payload.readUInt32BE(0) & 0x7fffffff,
    associatedTo: payload.readUInt32BE(4) & 0x7fffffff,
    priority: payload[8] as number >> 5,
    headerBlock: payload.subarray(10),
  };
}

/** SYN_REPLY and HEADERS: a stream id and a header block. */
export function readStreamHeaders(payload: Buffer, what: string): { streamId: number; headerBlock: Buffer } {
  need(payload, 4, what);
  return { streamId: payload.readUInt32BE(0) & 0x7fffffff, headerBlock: payload.subarray(4) };
}

export function readRstStream(payload: Buffer): { streamId: number; status: number } {
  need(payload, 8, 'RST_STREAM');
  return { streamId: payload.readUInt32BE(0) & 0x7fffffff, status: payload.readUInt32BE(4) };
}

export function readPing(payload: Buffer): number {
  need(payload, 4, 'PING');
  return payload.readUInt32BE(0);
}

export function readGoAway(payload: Buffer): { lastGoodStreamId: number; status: number } {
  need(payload, 4, 'GOAWAY');
  return { lastGoodStreamId: payload.readUInt32BE(0) & 0x7fffffff, status: payload.length >= 8 ? payload.readUInt32BE(4) : GoAwayStatus.OK };
}

function need(payload: Buffer, bytes: number, what: string): void {
  if (payload.length < bytes) throw new SpdyProtocolError(`${what} frame of ${payload.length} bytes; at least ${bytes} expected`);
}
