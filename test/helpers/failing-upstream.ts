import { EventEmitter } from 'node:events';
import { ProxyError } from '../../src/core/errors.js';
import type { Upstream } from '../../src/seams/dialer.js';

/**
 * An upstream that fails after the hand-over and before its endpoint sent a byte, giving back what
 * it was sent (the port-forward dialer's case: the kubelet reports a refused pod port on the error
 * stream only once it tried). It keeps copies of what it was written (`written`), and hands
 * copies back: a connection must not rely on the chunks' identity.
 */
export class FailingUpstream extends EventEmitter implements Upstream {
  bytesRead = 0;
  bytesWritten = 0;
  writableLength = 0;
  readableEnded = false;
  destroyed = false;
  closed = false;
  readonly written: Buffer[] = [];
  ended = false;

  /** Fails once `failAfter` bytes arrived (or at the FIN), giving them back unless `keep` is false. */
  constructor(private readonly failAfter: number, private readonly keep = true) {
    super();
  }

  write(chunk: Uint8Array): boolean {
    this.written.push(Buffer.from(chunk));
    this.bytesWritten += chunk.length;
    if (this.bytesWritten >= this.failAfter) setImmediate(() => this.fail());
    return true;
  }

  end(): void {
    this.ended = true;
    setImmediate(() => this.fail());
  }

  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    setImmediate(() => {
      this.closed = true;
      this.emit('close');
    });
  }

  resetAndDestroy(): void {
    this.destroy();
  }

  resume(): void {}

  private fail(): void {
    if (this.destroyed) return;
    const err = new ProxyError('API', 'the pod refused the port') as ProxyError & { unsent?: Uint8Array[] };
    if (this.keep) err.unsent = this.written.map((c) => Buffer.from(c));
    this.emit('error', err);
    this.destroy();
  }
}
