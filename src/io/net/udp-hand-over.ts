import { createSocket, type RemoteInfo, type Socket as DgramSocket, type SocketOptions } from 'node:dgram';
import { isIPv6 } from 'node:net';
import type { BoundAddress } from '../../seams/proxy-socket.js';

/**
 * A UDP listener's hand-over to a successor bound beside it (`--handover-socket`,
 * docs/handover.md "UDP"), with public dgram APIs only. Linux's UDP lookup (compute_score,
 * udp4_lib_lookup2 and udp6_lib_lookup2 since Linux 5.4's "udp: correct reuseport selection with
 * connected sockets") prefers a connected socket whose peer is the datagram's source over the
 * unconnected members of an SO_REUSEPORT group, and the group's hash never picks a connected
 * member for a new flow. So:
 *
 * - each live session gets a reply socket: bound to the listener's address (SO_REUSEPORT, joining
 *   the group) and connected to its client. That client's datagrams reach it (this process, the
 *   same session and endpoint), and what it sends leaves from the service address;
 * - the listener itself is then connected to a peer that never sends (handOverPeer): new flows go
 *   to the successor, while what its receive queue holds stays readable; once read it is closed.
 */

/**
 * Where a handing-over listener connects to: its own address, which sends nothing to it (its
 * port is the service's). A wildcard bind takes the family's loopback address: connecting it
 * binds it to the source address routing picks, and the kernel then hashes it there, out of the
 * group.
 */
export function handOverPeer(bound: BoundAddress): { host: string; port: number } {
  if (bound.host === '0.0.0.0') return { host: '127.0.0.1', port: bound.port };
  if (bound.host === '::') return { host: '::1', port: bound.port };
  return { host: bound.host, port: bound.port };
}

export interface ReplySocketHandlers {
  /** dgram's lookup: a literal must resolve at once, so that bind() and connect() are synchronous. */
  lookup: NonNullable<SocketOptions['lookup']>;
  /**
   * Any client's datagram: between bind() and connect() the socket is an unconnected member of
   * the group, and the kernel may hand it the first datagram of another flow.
   */
  onMessage: (msg: Buffer, rinfo: RemoteInfo) => void;
  /** A receive error (ECONNREFUSED: the client's port is closed) or a failed connect. */
  onError: (err: Error) => void;
}

/**
 * A socket bound to `bound` beside the listener and connected to the client. With a literal
 * lookup, dgram binds and connects synchronously (its bind error is emitted at once, its connect
 * error comes on the next tick, to onError), so send(msg) works as soon as this returns. Throws
 * the bind error.
 */
export function openReplySocket(bound: BoundAddress, client: { address: string; port: number }, handlers: ReplySocketHandlers): DgramSocket {
  const v6 = isIPv6(bound.host);
  const socket = createSocket({ type: v6 ? 'udp6' : 'udp4', ipv6Only: v6, reusePort: true, lookup: handlers.lookup });
  let bindError: Error | undefined;
  const onBindError = (err: Error): void => {
    bindError = err;
  };
  socket.once('error', onBindError);
  socket.on('message', handlers.onMessage);
  socket.bind({ address: bound.host, port: bound.port });
  socket.off('error', onBindError);
  if (bindError !== undefined) {
    closeQuietly(socket);
    throw bindError;
  }
  socket.on('error', handlers.onError);
  try {
    socket.connect(client.port, client.address, (err?: Error) => {
      if (err) handlers.onError(err);
    });
  } catch (err) {
    // dgram's own argument checks (a client address it will not take): never leave it bound.
    closeQuietly(socket);
    throw err;
  }
  return socket;
}

/** Set by the listener's handler on every datagram it reads once it hands over. */
export interface QueueWatch {
  read: boolean;
}

/**
 * Resolves once a connected listener's receive queue has been read. After connect() only its own
 * address could send to it (no client has it), so what is left is what the kernel queued before:
 * libuv reads a readable socket in the loop's poll phase (a bounded batch at a time), and a
 * setImmediate runs right after that phase, so a loop iteration in which no datagram was read
 * means the queue is empty. The first `settleMs` cover a datagram a receive path on another CPU
 * matched to the socket an instant before connect() and had yet to queue. `maxMs`, counted from
 * then (a loop stalled meanwhile has read nothing yet), bounds the reading.
 */
export function queueRead(watch: QueueWatch, settleMs: number, maxMs: number): Promise<void> {
  return new Promise((resolve) => {
    let start = 0;
    const check = (): void => {
      if (!watch.read || performance.now() - start >= maxMs) {
        resolve();
        return;
      }
      watch.read = false;
      setImmediate(check);
    };
    setTimeout(() => {
      start = performance.now();
      watch.read = true; // at least one full loop iteration from here
      check();
    }, settleMs);
  });
}

function closeQuietly(socket: DgramSocket): void {
  try {
    socket.close();
  } catch {
    // already closed
  }
}
