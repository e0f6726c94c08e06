import type { Endpoint, PortalAddress } from '../core/model.js';
import type { ServicePortStats } from '../core/stats.js';
import type { ProxyUnit } from '../core/units.js';
import type { ListenSpec, RunningUnitView } from './portal.js';
import type { CloseOptions } from './proxy-socket.js';

/**
 * The unit set: the sockets of every running unit (listeners, balancers, connections), kept in
 * line with what the sync loop sends. The loop plans and programs the portal; the unit set only
 * opens, updates and closes what it is told. Everything crossing this seam is plain data, so the
 * unit set can live in another process than the loop (workers).
 */

export interface UnitOpen {
  unit: ProxyUnit;
  /** The sockets the portal asks for (Portal.listenSpecs). */
  listen: ListenSpec[];
  /**
   * The proxy port to bind first, when the portal has one (Portal.preferredProxyPort: the one its
   * rules, and so the conntrack entries of ongoing flows, pointed at last). Any other will do.
   */
  preferredProxyPort?: number;
  /**
   * The proxy port to bind, exactly: another worker of this node bound it first (`--workers`), and
   * the portal sends every worker's share of the traffic there. 0: that worker has none yet (its
   * bind failed); the unit waits for one (UnitBatch.proxyPorts).
   */
  proxyPort?: number;
}

/** One sync's worth of changes, applied in this order: close, recreate, open, update. */
export interface UnitBatch {
  /** Unit ids. */
  close: string[];
  /** Units whose sockets must be made anew (their protocol or portals changed). */
  recreate: UnitOpen[];
  open: UnitOpen[];
  /** Units whose endpoints or affinity changed: the balancer follows, the sockets stay. */
  update: ProxyUnit[];
  /**
   * Bind again the listeners that failed before (default true). The loop's fast lane, which only
   * moves endpoints, leaves that to the next full sync.
   */
  retryFailedListeners?: boolean;
  /**
   * Running units whose proxy port the first worker bound only now (it had failed before): bind
   * that one (`--workers`). Port 0, to the worker that binds the proxy ports: none has one yet;
   * choose one, as for a new unit.
   */
  proxyPorts?: UnitProxyPort[];
}

export interface UnitProxyPort {
  id: string;
  port: number;
}

export interface UnitBatchResult {
  /** Listeners that failed to bind, in this batch and at the retry of earlier failures. */
  listenErrors: number;
  /** Listeners that failed before and are bound now: the portal has more to program. */
  rebound: number;
  /** Proxy ports bound in this apply (new units' and rebound ones'): what the other workers bind. */
  proxyPorts?: UnitProxyPort[];
  /**
   * Proxy ports of the range this batch freed (closed units'), held from other units until the
   * next batch (the portal still points them at the closed units): a listener failing for want of
   * one binds at the next sync, which the loop then asks for.
   */
  proxyPortsHeld?: number;
}

/** What /services reports for a unit. */
export interface UnitStatus {
  name: string;
  servicePort: string;
  protocol: string;
  scope: string;
  portals: PortalAddress[];
  reachable: string[];
  proxyPort: number | null;
  endpoints: string[];
  sessionAffinity: string;
  /** `round-robin` or `least-connections` (annotation kube-userspace-proxy.io/load-balancer). */
  loadBalancer: string;
  /** Endpoints passive health has set aside, and until when (ISO 8601). */
  setAside: Array<{ endpoint: string; until: string }>;
  /** How long a connection is held while there are no endpoints (a Go duration); absent when not held. */
  holdWhenEmpty?: string;
  /** `v2` when TCP connections to the endpoints begin with a PROXY protocol header; absent when not. */
  proxyProtocol?: string;
  /** TCP connections held, or UDP datagrams queued, for want of endpoints now. */
  held: number;
  active: number;
  errors: string[];
  /** Endpoints left out because the dialer cannot reach them, with why. */
  unreachable?: Array<{ endpoint: string; reason: string }>;
  /** Why the port is not served at all (the dialer cannot carry its protocol): no listener then. */
  notServed?: string;
}

export interface UnitStats {
  unit: ProxyUnit;
  stats: ServicePortStats;
  active: number;
}

export interface UnitSet {
  apply(batch: UnitBatch): Promise<UnitBatchResult>;
  /** Every running unit and its proxy port: what the portal programs. */
  views(): RunningUnitView[];
  /** As of the last refresh() where the units live in other processes. */
  status(): UnitStatus[];
  /**
   * The live counters of the units in this process; empty when they live in worker processes, whose
   * counters are read and summed elsewhere (workers/worker-pool.ts).
   */
  stats(): UnitStats[];
  /**
   * Bring status() and activeConnections() up to date where they are read from other processes
   * (`--workers`): ask them. Nothing to do for the units of this process.
   */
  refresh(): Promise<void>;
  /** The endpoints a unit's balancer holds now (tests, /services). */
  endpoints(id: string): readonly Endpoint[] | undefined;
  listenerCount(): number;
  /** Listeners wanted and not bound now; each is retried at every full sync. */
  failedListenerCount(): number;
  /** Connections and sessions alive, on running and retired sockets. */
  activeConnections(): number;
  /** Starts the one coarse sweep (idle UDP sessions, expired affinity). */
  start(): void;
  /**
   * Stop accepting everywhere, let established connections finish for up to `graceMs`, then cut
   * what remains. `handOver`: a successor serves the same addresses (ProxySocket.close).
   */
  shutdown(graceMs: number, opts?: ShutdownOptions): Promise<{ cut: number }>;
  /**
   * No sync is to complete from now on (the proxier stops for good): a wait inside apply() ends at
   * once, failing that apply (the worker pool's, for a worker that serves, while every one is down).
   */
  interrupt?(): void;
}

export interface ShutdownOptions extends CloseOptions {
  /** Aborted: the grace period ends now, and what remains is cut (a second SIGTERM or Ctrl-C). */
  endGrace?: AbortSignal;
}
