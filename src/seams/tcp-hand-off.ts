import type { Socket } from 'node:net';

/**
 * A TCP connection accepted elsewhere in this process (the SOCKS/CONNECT front) handed to a
 * Service port's proxy socket, as if one of its listeners had accepted it: the balancer, session
 * affinity (with the client's own address), retries, hold-when-empty, the dialer and the port's
 * stats all apply, and no listener is needed (on macOS without root, the loopback portal's
 * 127.96.x.y addresses cannot be bound at all).
 */
export interface TcpHandOff {
  /**
   * Takes `client` over; from here it is the proxy socket's (its 'data', 'end', 'error' and
   * 'close'). Preconditions: `client` is paused and has no listeners of the caller's left on
   * 'data', 'end' or 'error'; bytes already read from it that belong to the stream were put back
   * (unshift), so they reach the endpoint first. `written` is how many bytes the caller wrote to
   * the client before (its handshake replies): they do not count as the endpoint's, so a failed
   * dial may still be retried on the next endpoint. False when the socket no longer takes
   * connections (its unit closed, or shutting down): the caller still owns `client` then.
   */
  adopt(client: Socket, written: number): boolean;
}

/** Where the hand-off for a unit is found: the unit set of this process (not the worker pool's). */
export interface TcpHandOffs {
  /** The TCP proxy socket of the running unit `id` (`ns/name:port`), or undefined. */
  tcpHandOff(id: string): TcpHandOff | undefined;
}
