import { ProxyError } from '../../core/errors.js';

/**
 * Why a port-forward tunnel or stream failed. Branch on this, never on message text:
 * - `refused`: the kubelet wrote an error on the stream's error stream (the pod's port refused,
 *   the pod's sandbox is gone, ...);
 * - `reset`: the peer reset the stream (RST_STREAM);
 * - `tunnel-closed`: the tunnel's connection ended or failed under the stream;
 * - `tunnel-unresponsive`: the tunnel answered no PING in time;
 * - `going-away`: the peer said GOAWAY before it took the stream;
 * - `protocol`: the peer broke SPDY framing;
 * - `status`: the API server answered the upgrade with an error status (see `status`);
 * - `upgrade`: the API server did not switch protocols as asked (no 101, wrong subprotocol);
 * - `network`: the API server could not be reached;
 * - `no-pod`: the endpoint names no pod (no targetRef);
 * - `credentials`: the kubeconfig's credentials could not be had.
 */
export type PortForwardFailure =
  | 'refused'
  | 'reset'
  | 'tunnel-closed'
  | 'tunnel-unresponsive'
  | 'going-away'
  | 'protocol'
  | 'status'
  | 'upgrade'
  | 'network'
  | 'no-pod'
  | 'credentials';

export class PortForwardError extends ProxyError {
  readonly failure: PortForwardFailure;
  /** The HTTP status of a `status` failure. */
  readonly status: number | undefined;
  /**
   * Set on a stream's failure before the pod sent a byte: every byte written to the stream, which
   * the connection may send to the next endpoint (seams/dialer.ts, EarlyFailure).
   */
  unsent?: Uint8Array[];

  constructor(failure: PortForwardFailure, message: string, opts: { status?: number; cause?: unknown } = {}) {
    super('PORT_FORWARD', message, { cause: opts.cause });
    this.name = 'PortForwardError';
    this.failure = failure;
    this.status = opts.status;
  }

  /** A copy for one stream: the session's failure is shared by every stream it carried. */
  forStream(unsent: Uint8Array[] | undefined): PortForwardError {
    const err = new PortForwardError(this.failure, this.message, { ...(this.status !== undefined ? { status: this.status } : {}), cause: this.cause });
    if (unsent !== undefined) err.unsent = unsent;
    return err;
  }
}
