import { connect, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { constants as zlibConstants, createInflate, type Inflate } from 'node:zlib';
import {
  FLAG_FIN,
  FrameReader,
  FrameType,
  RstStatus,
  dataFrameHeader,
  pingFrame,
  readGoAway,
  readPing,
  readRstStream,
  readSynStream,
  rstStreamFrame,
  synReplyFrame,
} from '../../src/io/port-forward/spdy-frames.js';
import { HeaderBlockWriter, SPDY_DICTIONARY, decodeHeaderPairs } from '../../src/io/port-forward/spdy-headers.js';

/**
 * The kubelet's end of one port-forward connection, as kubelet 1.20 to 1.35 behave
 * (pkg/kubelet/cri/streaming/portforward/httpstream.go over moby/spdystream, with containerd's
 * sandbox_portforward_linux.go behind it), in-process, over any byte stream (the socket of a SPDY
 * upgrade, or a WebSocket as a stream):
 *
 * - header blocks are inflated with the SPDY dictionary in one zlib stream (kubectl's are real
 *   deflate; the proxy's stored blocks); frames are handled in order, waiting for each inflate;
 * - every stream must carry `streamtype` (error|data), `port`; `requestid` pairs them (missing: the
 *   stream-id arithmetic kubelet falls back on); a stream without them is reset, others get an
 *   immediate SYN_REPLY;
 * - once a pair is complete the pod's port is dialed; a failure is written on the error stream
 *   (containerd's message shape), then the error and the data stream are closed (FIN);
 * - forwarding copies both ways with no SPDY flow control: a pod socket that will not take more
 *   stops the whole tunnel's reading (spdystream blocks its frame workers), as on a real node;
 * - when either direction ends, the other gets one second (containerd's timeout), then the pod's
 *   connection is closed (no shutdown(SHUT_WR)) and the data stream FINed, then the error stream;
 * - PINGs from the client are answered; a GOAWAY ends the connection once its streams are done.
 */

export interface PodTarget {
  /** Where the pod's ports are, on loopback. */
  host: string;
  /** pod port -> loopback port; a port not here refuses (ECONNREFUSED, as containerd reports it). */
  ports: Map<number, number>;
  /** When set, the next stream pairs get this on their error stream instead of a forward. */
  failNext: string[];
  deleted: boolean;
}

export interface KubeletCounters {
  pairs: number;
  forwards: number;
  errors: number;
  pings: number;
}

interface StreamState {
  id: number;
  type: string;
  requestId: string;
  port: number;
  remoteFin: boolean;
  localFin: boolean;
  pair?: Pair;
}

interface Pair {
  requestId: string;
  error?: StreamState;
  data?: StreamState;
  pod?: Socket;
  closing?: NodeJS.Timeout;
  done: boolean;
}

/** containerd gives the other direction this long after one ends. */
const HALF_CLOSE_GRACE_MS = 1000;

export class FakeKubeletSession {
  private readonly reader: FrameReader;
  private readonly inflate: Inflate;
  private readonly writer = new HeaderBlockWriter();
  private readonly streams = new Map<number, StreamState>();
  private readonly pairs = new Map<string, Pair>();
  private readonly waiting: Array<() => Promise<void> | void> = [];
  private busy = false;
  private inflated: Buffer[] = [];
  private goneAway = false;
  /** Pod sockets paused because the tunnel's pipe is full. */
  private readonly pausedPods = new Set<Socket>();
  /** Pod sockets whose backlog stopped the tunnel's reading. */
  private readonly fullPods = new Set<Socket>();
  frozen = false;
  closed = false;

  constructor(
    private readonly pipe: Duplex,
    private readonly target: PodTarget,
    private readonly podName: string,
    private readonly counters: KubeletCounters,
    head?: Buffer,
  ) {
    this.reader = new FrameReader({
      data: (id, fin, data) => this.enqueue(() => this.onData(id, fin, Buffer.from(data))),
      control: (type, flags, payload) => {
        const copy = Buffer.from(payload);
        this.enqueue(() => this.onControl(type, flags, copy));
      },
    });
    this.inflate = createInflate({ dictionary: SPDY_DICTIONARY });
    this.inflate.on('data', (chunk: Buffer) => this.inflated.push(chunk));
    this.inflate.on('error', (err) => this.destroy(`inflate: ${err.message}`));
    pipe.on('data', (chunk: Buffer) => this.onChunk(chunk));
    pipe.on('drain', () => {
      for (const s of this.pausedPods) s.resume();
      this.pausedPods.clear();
    });
    pipe.on('error', (err) => this.destroy(`pipe: ${err.message}`));
    pipe.on('close', () => this.destroy('pipe closed'));
    if (head && head.length > 0) this.onChunk(head);
  }

  /** Cut the tunnel's connection, as a restarting kubelet or a broken network does. */
  destroy(why = 'destroyed'): void {
    if (this.closed) return;
    if (process.env.FAKE_KUBELET_DEBUG) process.stderr.write(`fake kubelet ${this.podName}: ${why}\n`);
    this.closed = true;
    for (const p of this.pairs.values()) {
      if (p.closing) clearTimeout(p.closing);
      p.pod?.destroy();
    }
    this.pairs.clear();
    this.pipe.destroy();
    this.inflate.destroy();
  }

  /** Pod sockets open through this tunnel. */
  forwardCount(): number {
    let n = 0;
    for (const p of this.pairs.values()) if (p.pod && !p.pod.destroyed) n++;
    return n;
  }

  /**
   * The pod was deleted: its process is killed and its connections reset, which containerd's copy
   * returns as an error; the kubelet writes it on the error stream. New pairs fail (no sandbox).
   */
  podDeleted(): void {
    for (const p of [...this.pairs.values()]) {
      if (!p.pod) continue;
      const port = p.data?.port ?? 0;
      this.finishPair(p, `error forwarding port ${port} to pod ${this.podName}, uid uid-${this.podName}: read tcp4 127.0.0.1:${p.pod.localPort ?? 0}->127.0.0.1:${p.pod.remotePort ?? 0}: read: connection reset by peer`);
    }
  }

  private onChunk(chunk: Buffer): void {
    if (this.closed || this.frozen) return;
    try {
      this.reader.push(chunk);
    } catch (err) {
      this.destroy(`framing: ${String(err)}`);
    }
  }

  /** Frames are handled one at a time, in order: a SYN_STREAM waits for its header block's inflate. */
  private enqueue(step: () => Promise<void> | void): void {
    if (this.busy || this.waiting.length > 0) {
      this.waiting.push(step);
      return;
    }
    const r = step();
    if (r instanceof Promise) {
      this.busy = true;
      void r.then(() => this.drainQueue());
    }
  }

  private async drainQueue(): Promise<void> {
    this.busy = true;
    while (this.waiting.length > 0 && !this.closed) {
      const step = this.waiting.shift() as () => Promise<void> | void;
      const r = step();
      if (r instanceof Promise) await r;
    }
    this.busy = false;
  }

  private inflateBlock(block: Buffer): Promise<Array<[string, string]>> {
    return new Promise((resolve, reject) => {
      this.inflated = [];
      this.inflate.write(block);
      this.inflate.flush(zlibConstants.Z_SYNC_FLUSH, () => {
        try {
          resolve(decodeHeaderPairs(Buffer.concat(this.inflated)));
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      });
    });
  }

  private onControl(type: number, flags: number, payload: Buffer): Promise<void> | void {
    if (this.closed) return;
    switch (type) {
      case FrameType.SYN_STREAM:
        return this.onSynStream(payload, flags);
      case FrameType.RST_STREAM: {
        const { streamId } = readRstStream(payload);
        const s = this.streams.get(streamId);
        if (s === undefined) return;
        this.streams.delete(streamId);
        // spdystream ends the stream's reads; containerd's copy ends and it closes the pod's connection.
        if (s.pair && s.type === 'data') this.endForward(s.pair, 0);
        return;
      }
      case FrameType.PING: {
        const id = readPing(payload);
        this.counters.pings++;
        if (id % 2 === 1) this.pipe.write(pingFrame(id));
        return;
      }
      case FrameType.GOAWAY:
        readGoAway(payload);
        this.goneAway = true;
        this.closeIfIdle();
        return;
      default:
        // SETTINGS, WINDOW_UPDATE, HEADERS: "unhandled frame type" in spdystream's log, nothing else.
        return;
    }
  }

  private async onSynStream(payload: Buffer, flags: number): Promise<void> {
    const syn = readSynStream(payload);
    let headers: Array<[string, string]>;
    try {
      headers = await this.inflateBlock(syn.headerBlock);
    } catch (err) {
      this.destroy(`header block: ${String(err)}`);
      return;
    }
    if (this.closed) return;
    const h = new Map(headers.map(([k, v]) => [k.toLowerCase(), v]));
    const port = Number(h.get('port') ?? '');
    const type = h.get('streamtype') ?? '';
    if (!Number.isInteger(port) || port < 1 || port > 65535 || (type !== 'error' && type !== 'data') || this.goneAway) {
      // httpStreamReceived's error: the stream is reset (apimachinery's stream.Reset()).
      this.pipe.write(rstStreamFrame(syn.streamId, RstStatus.CANCEL));
      return;
    }
    // kubelet's fallback for clients without request ids: stream-id arithmetic.
    const requestId = h.get('requestid') ?? String(type === 'error' ? syn.streamId : syn.streamId - 2);
    const state: StreamState = { id: syn.streamId, type, requestId, port, remoteFin: (flags & FLAG_FIN) !== 0, localFin: false };
    this.streams.set(syn.streamId, state);
    this.pipe.write(synReplyFrame(syn.streamId, this.writer.encode([])));
    let pair = this.pairs.get(requestId);
    if (pair === undefined) {
      pair = { requestId, done: false };
      this.pairs.set(requestId, pair);
    }
    state.pair = pair;
    if (type === 'error') pair.error = state;
    else pair.data = state;
    if (pair.error && pair.data) this.startForward(pair);
  }

  private onData(id: number, fin: boolean, data: Buffer): void {
    if (this.closed) return;
    const s = this.streams.get(id);
    if (s === undefined) return;
    if (fin) s.remoteFin = true;
    const pair = s.pair;
    if (s.type !== 'data' || pair === undefined) return;
    const pod = pair.pod;
    if (data.length > 0 && pod && !pod.destroyed) {
      if (!pod.write(data) && !this.fullPods.has(pod)) {
        // spdystream has no flow control: its worker blocks on this stream, and the whole
        // connection stops being read.
        this.fullPods.add(pod);
        this.pipe.pause();
        pod.once('drain', () => {
          this.fullPods.delete(pod);
          if (this.fullPods.size === 0) this.pipe.resume();
        });
      }
    }
    if (fin) this.endForward(pair, HALF_CLOSE_GRACE_MS);
  }

  private startForward(pair: Pair): void {
    this.counters.pairs++;
    const data = pair.data as StreamState;
    if (this.target.deleted) {
      this.failPair(pair, `failed to find sandbox "${this.podName}" in store: not found`);
      return;
    }
    const injected = this.target.failNext.shift();
    if (injected !== undefined) {
      this.failPair(pair, injected);
      return;
    }
    const backend = this.target.ports.get(data.port);
    const pod = connect({ host: this.target.host, port: backend ?? 1, allowHalfOpen: true });
    pair.pod = pod;
    let connected = false;
    pod.on('connect', () => {
      connected = true;
      this.counters.forwards++;
      pod.setNoDelay(true);
    });
    pod.on('data', (chunk: Buffer) => {
      if (this.closed || data.localFin) return;
      this.pipe.cork();
      this.pipe.write(dataFrameHeader(data.id, chunk.length, false));
      const ok = this.pipe.write(chunk);
      this.pipe.uncork();
      if (!ok) {
        pod.pause();
        this.pausedPods.add(pod);
      }
    });
    // The pod's side ended: containerd waits for the other direction at most a second.
    pod.on('end', () => this.endForward(pair, HALF_CLOSE_GRACE_MS));
    pod.on('error', (err: NodeJS.ErrnoException) => {
      if (!connected) {
        this.failPair(pair, `failed to execute portforward in network namespace "/var/run/netns/cni-${this.podName}": failed to connect to localhost:${data.port} inside namespace "${this.podName}", IPv4: dial tcp4 127.0.0.1:${data.port}: connect: ${err.code === 'ECONNREFUSED' ? 'connection refused' : String(err.code)} IPv6 dial tcp6 [::1]:${data.port}: connect: connection refused `);
        return;
      }
      // A copy error: containerd returns it, and the kubelet writes it after the streams close.
      this.finishPair(pair, `error forwarding port ${data.port} to pod ${this.podName}: ${String(err.code ?? err.message)}`);
    });
    pod.on('close', () => {
      // Its backlog no longer holds the tunnel: what still comes for it is dropped. (A real
      // spdystream worker can stay blocked on a stream whose reader is gone; the proxy's PINGs
      // find such a tunnel out.)
      if (this.fullPods.delete(pod) && this.fullPods.size === 0 && !this.closed) this.pipe.resume();
      if (connected) this.endForward(pair, 0);
    });
  }

  /**
   * One direction ended: after `graceMs` (unless both have), close the pod's connection and FIN the
   * data stream, then the error stream (the kubelet's deferred closes), with no message.
   */
  private endForward(pair: Pair, graceMs: number): void {
    if (pair.done) return;
    const data = pair.data as StreamState;
    const podEnded = pair.pod === undefined || pair.pod.readableEnded || pair.pod.destroyed;
    if (graceMs === 0 || (data.remoteFin && podEnded)) {
      this.finishPair(pair, undefined);
      return;
    }
    pair.closing ??= setTimeout(() => this.finishPair(pair, undefined), graceMs);
  }

  private failPair(pair: Pair, message: string): void {
    this.counters.errors++;
    const error = pair.error as StreamState;
    this.writeData(error, Buffer.from(message), false);
    this.finishPair(pair, undefined);
  }

  /** containerd's deferred stream.Close() (data FIN), then the kubelet's error write and its close. */
  private finishPair(pair: Pair, copyError: string | undefined): void {
    if (pair.done) return;
    pair.done = true;
    if (pair.closing) clearTimeout(pair.closing);
    pair.pod?.destroy();
    if (pair.pod) this.pausedPods.delete(pair.pod);
    const data = pair.data as StreamState;
    const error = pair.error as StreamState;
    this.writeData(data, Buffer.alloc(0), true);
    if (copyError !== undefined) {
      this.counters.errors++;
      this.writeData(error, Buffer.from(copyError), false);
    }
    this.writeData(error, Buffer.alloc(0), true);
    this.pairs.delete(pair.requestId);
    this.streams.delete(data.id);
    this.streams.delete(error.id);
    this.closeIfIdle();
  }

  private writeData(s: StreamState, data: Buffer, fin: boolean): void {
    if (this.closed || s.localFin || !this.streams.has(s.id)) return;
    if (fin) s.localFin = true;
    this.pipe.cork();
    this.pipe.write(dataFrameHeader(s.id, data.length, fin));
    if (data.length > 0) this.pipe.write(data);
    this.pipe.uncork();
  }

  private closeIfIdle(): void {
    if (this.goneAway && this.pairs.size === 0) {
      this.pipe.end();
      this.closed = true;
    }
  }
}
