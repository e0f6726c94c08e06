import type { Socket } from 'node:net';
import { decodeHandoverLine, encodeHandoverMessage, type HandoverMessage } from '../../core/handover.js';

/** A welcome lists every unit's proxy port: a few MB at most; more is not our peer. */
const MAX_LINE = 32 << 20;

/**
 * One end of the hand-over line: JSON messages, one per line, over a unix socket. A line that is
 * not a protocol message, or too long, closes the connection: the other side is not a proxy.
 */
export class HandoverLine {
  private buffered = '';
  private readonly handlers: Array<(m: HandoverMessage) => void> = [];
  /** Resolves once the connection is closed, whichever side closed it. */
  readonly closed: Promise<void>;

  constructor(readonly socket: Socket) {
    socket.setEncoding('utf8');
    this.closed = new Promise((resolve) => socket.once('close', () => resolve()));
    socket.on('error', () => socket.destroy());
    socket.on('data', (chunk: string) => this.onData(chunk));
  }

  onMessage(handler: (m: HandoverMessage) => void): void {
    this.handlers.push(handler);
  }

  send(m: HandoverMessage): void {
    if (!this.socket.destroyed) this.socket.write(encodeHandoverMessage(m));
  }

  /** Sends the last message and closes the line once it is written. */
  end(m?: HandoverMessage): void {
    if (this.socket.destroyed) return;
    if (m === undefined) this.socket.end();
    else this.socket.end(encodeHandoverMessage(m));
  }

  destroy(): void {
    this.socket.destroy();
  }

  get isClosed(): boolean {
    return this.socket.destroyed || this.socket.closed;
  }

  private onData(chunk: string): void {
    this.buffered += chunk;
    if (this.buffered.length > MAX_LINE) {
      this.socket.destroy();
      return;
    }
    for (let nl = this.buffered.indexOf('\n'); nl >= 0; nl = this.buffered.indexOf('\n')) {
      const line = this.buffered.slice(0, nl);
      this.buffered = this.buffered.slice(nl + 1);
      const m = decodeHandoverLine(line);
      if (m === undefined) {
        this.socket.destroy();
        return;
      }
      for (const h of this.handlers) h(m);
    }
  }
}
