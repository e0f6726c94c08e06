import type { Protocol } from '../core/model.js';
import type { ServicePortStats } from '../core/stats.js';
import type { ProxyUnit } from '../core/units.js';

export interface ListenAddress {
  host: string;
  /** 0 lets the kernel pick. */
  port: number;
  /**
   * A proxy port the portal NATs the unit's portals to (iptables): its clients connected to a
   * portal, not to this address. Absent: they connected to this very address.
   */
  nat?: boolean;
  /**
   * Clients only from these CIDRs (a load balancer's spec.loadBalancerSourceRanges, where the
   * portal's address is this very one: bind mode); others are refused. Absent: any client.
   */
  sources?: readonly string[];
}

export interface CloseOptions {
  /**
   * A successor listens on the same addresses (SO_REUSEPORT, `--handover-socket`): UDP sessions
   * live on until they idle out, and what the listeners' queues hold is still served.
   */
  handOver?: boolean;
}

export interface BoundAddress {
  host: string;
  port: number;
}

/**
 * One proxied service port's sockets (upstream ProxySocket): a set of listeners sharing one
 * balancer, dialer and stats. TCP and UDP implement it.
 */
export interface ProxySocket {
  readonly protocol: Protocol;
  readonly stats: ServicePortStats;
  /** Open one more listener. Rejects with the system error (EADDRINUSE, EACCES, ...) on failure. */
  listen(addr: ListenAddress): Promise<BoundAddress>;
  /** Addresses listened on now. */
  addresses(): BoundAddress[];
  /**
   * Close one listener. Established TCP connections through it are not cut; UDP sessions through it
   * end (their replies leave through the listener socket, so they could not reach the client).
   */
  unlisten(addr: BoundAddress): Promise<void>;
  /**
   * Stop accepting on every listener. TCP connections already established live on until they end;
   * UDP sessions are closed (their replies could not reach the client once the socket is gone),
   * unless `handOver`.
   */
  close(opts?: CloseOptions): Promise<void>;
  /** Connections (TCP) or sessions (UDP) alive now. */
  active(): number;
  /** Resolves when no connection or session is left. */
  drained(): Promise<void>;
  /** Cut every remaining connection or session at once (end of a shutdown grace period). */
  destroyAll(): void;
  /** Periodic housekeeping from the proxier's one coarse timer (idle UDP sessions and TCP connections, expired holds). */
  sweep(nowMs: number): void;
  /**
   * The unit changed and its balancer has the new endpoints: the socket takes the unit's own
   * settings (hold-when-empty), and what it holds for want of endpoints goes on if there are some.
   */
  update(unit: ProxyUnit): void;
}
