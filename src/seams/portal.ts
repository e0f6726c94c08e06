import type { PortalAddress } from '../core/model.js';
import type { ProxyUnit } from '../core/units.js';

export type PortalMode = 'loopback' | 'bind' | 'iptables';
export const PORTAL_MODES: readonly PortalMode[] = ['loopback', 'bind', 'iptables'];

/** One socket the proxier must open for a unit. */
export interface ListenSpec {
  host: string;
  /** The port to bind; ignored when `proxyPort` is set. */
  port: number;
  /** Bind a proxy port from `--proxy-port-range` (or the kernel's pick) instead of a fixed port. */
  proxyPort?: boolean;
  /** The portals this socket serves (for /services and errors). */
  portals: PortalAddress[];
}

/**
 * A unit as running: what the portal needs to program forwarding to it. A unit object is never
 * changed once planned (a change is a new object): the portals keep what they derived from one
 * (its families, its rules) for as long as the same object comes back.
 */
export interface RunningUnitView {
  unit: ProxyUnit;
  /** The proxy port bound for this unit, when the portal asked for one. */
  proxyPort?: number;
}

export interface PortalSyncResult {
  /** One line per portal that could not be programmed; the others are in force. */
  errors: string[];
  /**
   * One line per unit whose portals this mode cannot program, by its configuration rather than
   * the node's state (an IPv6 ClusterIP with an IPv4 --bind-address): the rest are in force, and
   * no retry would change it, so the sync is not failed for it (kube-proxy skips such a Service).
   */
  skipped?: string[];
}

/**
 * The portal seam: how traffic for a Service's addresses reaches the proxy's sockets.
 * - loopback: every Service gets an address in 127/8 and the proxy listens there (no root).
 * - bind: the service addresses are made local and the proxy listens on them (no netfilter).
 * - iptables: nat REDIRECT/DNAT rules steer portal traffic into proxy ports (the legacy layout).
 */
export interface Portal {
  readonly mode: PortalMode;
  /** Remove leftovers of an earlier run (also one killed with SIGKILL) before programming afresh. */
  start(): Promise<void>;
  /**
   * Make the addresses of these units local before their sockets bind (bind mode: one batch per
   * sync rather than one command per unit). Optional: the other modes need nothing beforehand.
   */
  prepare?(units: readonly ProxyUnit[]): Promise<PortalSyncResult>;
  /** The sockets a unit needs. Called when a unit is opened or recreated. */
  listenSpecs(unit: ProxyUnit): ListenSpec[];
  /**
   * The proxy port to try first for a unit: the one its portal rules (and the conntrack entries of
   * its ongoing flows) pointed at last, in this run or, after a restart, in the previous one.
   * Optional: only the iptables portal NATs to proxy ports.
   */
  preferredProxyPort?(unit: ProxyUnit): number | undefined;
  /**
   * Program node-level forwarding for every running unit, replacing what this portal installed
   * before (one transaction where the mode has one). `periodic` is true on the resync timer.
   */
  sync(units: readonly RunningUnitView[], periodic: boolean): Promise<PortalSyncResult>;
  /** Remove everything this mode installed. Safe to call twice; "already gone" is not a failure. */
  cleanup(): Promise<void>;
}
