import type { Socket as DgramSocket } from 'node:dgram';
import type { Endpoint } from '../../core/model.js';
import type { BoundAddress } from '../../seams/proxy-socket.js';
import type { QueueWatch } from './udp-hand-over.js';

/** One UDP listener (a service address and port) and the client sessions behind it. */
export interface UdpListener {
  readonly socket: DgramSocket;
  readonly bound: BoundAddress;
  /** By client `address|port`. */
  readonly sessions: Map<string, UdpSession>;
  /**
   * Clients whose last session ended on an ICMP error: their next pick resets affinity. Bounded
   * (oldest first out), as a client that never comes back would otherwise stay forever.
   */
  readonly refused: Set<string>;
  /** A load balancer's source ranges (bind mode): datagrams from elsewhere are dropped. Absent: any. */
  readonly allowed?: (ip: string) => boolean;
  /**
   * Set once it hands over (udp-hand-over.ts): its sessions reply through sockets of their own,
   * and its own socket is connected away until its queue is read, then closed.
   */
  handOver?: QueueWatch;
}

/** One client's conversation with one endpoint, over its own connected socket. */
export interface UdpSession {
  readonly key: string;
  readonly listener: UdpListener;
  readonly clientAddress: string;
  readonly clientPort: number;
  readonly endpoint: Endpoint;
  readonly socket: DgramSocket;
  /**
   * After a hand-over: the session's own socket on the service address, connected to the client,
   * through which its replies leave and its client's datagrams come (udp-hand-over.ts).
   */
  reply: DgramSocket | undefined;
  /** performance.now() of the last datagram either way: the idle sweep reads only this. */
  lastActivity: number;
  /** No reply from the endpoint yet: the first one tells passive health it answers. */
  unproven: boolean;
  /** Datagrams that came before the socket finished connecting; undefined once connected. */
  pending: Buffer[] | undefined;
  closed: boolean;
  /** Neighbours in the proxy's SessionOrder (udp-session-order.ts); undefined at either end. */
  older: UdpSession | undefined;
  newer: UdpSession | undefined;
}

export function clientKey(address: string, port: number): string {
  return `${address}|${port}`;
}
