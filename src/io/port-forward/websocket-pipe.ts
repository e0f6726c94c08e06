import { createHash, randomFillSync } from 'node:crypto';
import type { Socket } from 'node:net';
import { Duplex } from 'node:stream';

/**
 * A WebSocket connection (RFC 6455) as a byte stream: what port-forward's tunnelling needs of it
 * (KEP-4006; client-go's TunnelingConnection): every write goes out as one binary message, and the
 * payloads of the messages that come in are read as one stream of bytes, whatever their
 * boundaries. Pings are answered, a close is answered and ends the stream.
 *
 * Written here rather than taken from npm's `ws`: ws checks subprotocols against RFC 7230's
 * token characters, which exclude "/", so it refuses to ask for (or accept)
 * `SPDY/3.1+portforward.k8s.io` on either side. The handshake is a plain node:http(s) upgrade
 * (tunnel-opener.ts), with the kubeconfig's agent, so only the framing lives here.
 *
 * `role: 'client'` masks what it sends with a fresh random key per frame, as the RFC requires of
 * clients; `'server'` (the test fixture) sends unmasked. Either reads masked or unmasked frames.
 */

export const WEBSOCKET_GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

/** The Sec-WebSocket-Accept that answers a Sec-WebSocket-Key. */
export function websocketAccept(key: string): string {
  return createHash('sha1').update(key + WEBSOCKET_GUID).digest('base64');
}

/** A fresh Sec-WebSocket-Key. */
export function websocketKey(): string {
  return randomFillSync(Buffer.alloc(16)).toString('base64');
}

const OP_CONTINUATION = 0x0;
const OP_TEXT = 0x1;
const OP_BINARY = 0x2;
const OP_CLOSE = 0x8;
const OP_PING = 0x9;
const OP_PONG = 0xa;

/** A frame larger than this from the peer is a protocol error (client-go writes 32 KiB at most). */
const MAX_FRAME = 64 * 1024 * 1024;

export interface WebSocketPipeOptions {
  socket: Socket;
  /** Bytes read past the handshake's headers: the first frames. */
  head?: Buffer;
  role: 'client' | 'server';
}

export class WebSocketPipe extends Duplex {
  private readonly socket: Socket;
  private readonly mask: boolean;
  private readonly chunks: Buffer[] = [];
  private buffered = 0;
  /** Payload bytes of an unmasked binary frame still to come, streamed as they arrive. */
  private streamLeft = 0;
  private closeSent = false;
  /** Random bytes for masking keys, taken four at a time. */
  private keys = Buffer.alloc(0);
  private keyOffset = 0;

  constructor(opts: WebSocketPipeOptions) {
    super({ allowHalfOpen: false });
    this.socket = opts.socket;
    this.mask = opts.role === 'client';
    this.socket.on('data', (chunk: Buffer) => this.onChunk(chunk));
    this.socket.on('end', () => this.push(null));
    this.socket.on('error', (err) => this.destroy(err));
    this.socket.on('close', () => this.destroy());
    if (opts.head && opts.head.length > 0) this.onChunk(opts.head);
  }

  override _read(): void {
    this.socket.resume();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (err?: Error | null) => void): void {
    this.send(OP_BINARY, [chunk], callback);
  }

  /** Corked writes (a SPDY frame's header and payload) go out as one message, copied once into it. */
  override _writev(chunks: Array<{ chunk: Buffer }>, callback: (err?: Error | null) => void): void {
    this.send(OP_BINARY, chunks.map((c) => c.chunk), callback);
  }

  /** Our end: a close frame (1000, normal closure), then the socket's FIN. */
  override _final(callback: (err?: Error | null) => void): void {
    this.sendClose(1000);
    this.socket.end();
    callback();
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    this.socket.destroy();
    callback(err);
  }

  private send(opcode: number, payload: Buffer[], callback?: (err?: Error | null) => void): void {
    const frame = this.frame(opcode, payload);
    if (this.socket.write(frame) || callback === undefined) {
      callback?.();
      return;
    }
    this.socket.once('drain', () => callback());
  }

  /**
   * One frame around `parts`, copied into it once. Masked in place, over 32-bit words: the
   * buffer is allocated so that the payload starts 4-aligned.
   */
  private frame(opcode: number, parts: Buffer[]): Buffer {
    let length = 0;
    for (const p of parts) length += p.length;
    const extended = length < 126 ? 0 : length < 0x10000 ? 2 : 8;
    const headerLength = 2 + extended + (this.mask ? 4 : 0);
    const pad = (4 - (headerLength % 4)) % 4;
    const frame = Buffer.allocUnsafe(pad + headerLength + length).subarray(pad);
    frame[0] = 0x80 | opcode; // FIN: every message is one frame
    const maskBit = this.mask ? 0x80 : 0;
    if (extended === 0) frame[1] = maskBit | length;
    else if (extended === 2) {
      frame[1] = maskBit | 126;
      frame.writeUInt16BE(length, 2);
    } else {
      frame[1] = maskBit | 127;
      frame.writeUInt32BE(Math.floor(length / 0x100000000), 2);
      frame.writeUInt32BE(length >>> 0, 6);
    }
    let at = headerLength;
    for (const p of parts) {
      p.copy(frame, at);
      at += p.length;
    }
    if (this.mask) {
      const keyAt = headerLength - 4;
      this.takeKey(frame, keyAt);
      const payload = frame.subarray(headerLength);
      maskInto(payload, payload, 0, frame, keyAt);
    }
    return frame;
  }

  private takeKey(into: Buffer, at: number): void {
    if (this.keyOffset + 4 > this.keys.length) {
      this.keys = randomFillSync(Buffer.allocUnsafe(4096));
      this.keyOffset = 0;
    }
    this.keys.copy(into, at, this.keyOffset, this.keyOffset + 4);
    this.keyOffset += 4;
  }

  private sendClose(code: number): void {
    if (this.closeSent || this.socket.destroyed) return;
    this.closeSent = true;
    const payload = Buffer.alloc(2);
    payload.writeUInt16BE(code, 0);
    this.socket.write(this.frame(OP_CLOSE, [payload]));
  }

  // --- reading ------------------------------------------------------------------------------------

  private onChunk(chunk: Buffer): void {
    if (this.streamLeft > 0) {
      // The rest of an unmasked binary frame: handed on as views, never joined.
      const n = Math.min(this.streamLeft, chunk.length);
      this.streamLeft -= n;
      this.pushData(n === chunk.length ? chunk : chunk.subarray(0, n));
      if (n === chunk.length) return;
      chunk = chunk.subarray(n);
    }
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    let buf = this.chunks.length === 1 ? (this.chunks[0] as Buffer) : Buffer.concat(this.chunks, this.buffered);
    let offset = 0;
    for (;;) {
      const parsed = this.parseFrame(buf, offset);
      if (parsed === undefined) break;
      if (parsed === 'stop') return;
      offset = parsed;
    }
    if (offset > 0) buf = buf.subarray(offset);
    this.chunks.length = 0;
    this.buffered = buf.length;
    if (buf.length > 0) this.chunks.push(buf);
  }

  /** The offset after one whole frame handled; undefined when the frame is not all in; 'stop' after a close or a failure. */
  private parseFrame(buf: Buffer, offset: number): number | undefined | 'stop' {
    if (buf.length - offset < 2) return undefined;
    const b0 = buf[offset] as number;
    const b1 = buf[offset + 1] as number;
    const opcode = b0 & 0x0f;
    const masked = (b1 & 0x80) !== 0;
    let length = b1 & 0x7f;
    let at = offset + 2;
    if (length === 126) {
      if (buf.length - at < 2) return undefined;
      length = buf.readUInt16BE(at);
      at += 2;
    } else if (length === 127) {
      if (buf.length - at < 8) return undefined;
      length = buf.readUInt32BE(at) * 0x100000000 + buf.readUInt32BE(at + 4);
      at += 8;
    }
    if (length > MAX_FRAME || (b0 & 0x70) !== 0) {
      this.fail(new Error(length > MAX_FRAME ? `a WebSocket frame of ${length} bytes` : 'a WebSocket frame with reserved bits set'));
      return 'stop';
    }
    const keyAt = at;
    if (masked) at += 4;
    const data = opcode === OP_BINARY || opcode === OP_CONTINUATION;
    if (data && !masked && buf.length - at < length) {
      // Stream the payload: what is here now, the rest as it comes (onChunk).
      const have = buf.length - at;
      this.streamLeft = length - have;
      if (have > 0) this.pushData(buf.subarray(at));
      return buf.length;
    }
    if (buf.length - at < length) return undefined;
    let payload = buf.subarray(at, at + length);
    if (masked) {
      const plain = Buffer.allocUnsafe(length);
      maskInto(payload, plain, 0, buf, keyAt);
      payload = plain;
    }
    const end = at + length;
    switch (opcode) {
      case OP_BINARY:
      case OP_CONTINUATION:
        this.pushData(payload);
        break;
      case OP_TEXT:
        // client-go's TunnelingConnection: "invalid message type received".
        this.fail(new Error('a text message on a port-forward tunnel'));
        return 'stop';
      case OP_PING:
        this.socket.write(this.frame(OP_PONG, [Buffer.from(payload)]));
        break;
      case OP_PONG:
        break;
      case OP_CLOSE:
        this.sendClose(payload.length >= 2 ? payload.readUInt16BE(0) : 1000);
        this.socket.end();
        this.push(null);
        return 'stop';
      default:
        this.fail(new Error(`WebSocket opcode ${opcode}`));
        return 'stop';
    }
    return end;
  }

  /** A view into the read, which nothing writes to again: pushed as it is. */
  private pushData(payload: Buffer): void {
    if (payload.length > 0 && !this.push(payload)) this.socket.pause();
  }

  private fail(err: Error): void {
    this.sendClose(1002);
    this.destroy(err);
  }
}

/** XOR `src` with the 4-byte key at `key[keyAt]` into `dst[dstAt]`, four bytes at a time. */
function maskInto(src: Buffer, dst: Buffer, dstAt: number, key: Buffer, keyAt: number): void {
  const k0 = key[keyAt] as number;
  const k1 = key[keyAt + 1] as number;
  const k2 = key[keyAt + 2] as number;
  const k3 = key[keyAt + 3] as number;
  const n = src.length;
  const whole = n - (n % 4);
  if (whole > 0) {
    const dstOffset = dst.byteOffset + dstAt;
    if (src.byteOffset % 4 === 0 && dstOffset % 4 === 0) {
      // Word views where both sides are aligned (pooled buffers mostly are): a quarter of the
      // steps. The key is read in the views' own (the platform's) byte order.
      const word = new Int32Array(Uint8Array.of(k0, k1, k2, k3).buffer)[0] as number;
      const s32 = new Int32Array(src.buffer, src.byteOffset, whole / 4);
      const d32 = new Int32Array(dst.buffer, dstOffset, whole / 4);
      for (let i = 0; i < s32.length; i++) d32[i] = (s32[i] as number) ^ word;
    } else {
      const word = key.readInt32LE(keyAt);
      for (let i = 0; i < whole; i += 4) dst.writeInt32LE(src.readInt32LE(i) ^ word, dstAt + i);
    }
  }
  for (let i = whole; i < n; i++) {
    const k = i % 4 === 0 ? k0 : i % 4 === 1 ? k1 : i % 4 === 2 ? k2 : k3;
    dst[dstAt + i] = (src[i] as number) ^ k;
  }
}
