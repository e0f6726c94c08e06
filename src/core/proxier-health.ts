import type { Clock } from './clock.js';

/**
 * kube-proxy's health server (pkg/proxy/healthcheck/proxier_health.go), same semantics and body:
 *
 * - healthy unless an update was queued more than `healthTimeoutMs` (2 x the sync period) ago
 *   and no sync has applied it since; healthy while starting up, before the first update;
 * - `/livez`: that alone; `/healthz`: that, and this Node is eligible: not being deleted and not
 *   tainted `ToBeDeletedByClusterAutoscaler` (cloud load balancers probe it to drain the node);
 * - 200 or 503, `{"lastUpdated": ..., "currentTime": ...}` (+ `"nodeEligible"` on /healthz);
 *   when healthy, lastUpdated is reported as now, as kube-proxy does for compatibility.
 *
 * Times are RFC 3339 (kube-proxy prints Go's time.Time String form; probes read the status).
 */

export const TO_BE_DELETED_TAINT = 'ToBeDeletedByClusterAutoscaler';

/** What a never-updated lastUpdated reads as: Go's zero time. */
const ZERO_TIME = '0001-01-01T00:00:00Z';

/** The parts of a v1 Node that eligibility reads (a V1Node from client-node fits). */
export interface NodeLike {
  metadata?: { deletionTimestamp?: Date | string | null };
  spec?: { taints?: ReadonlyArray<{ key: string }> | null };
}

export interface HealthClocks {
  /** Monotonic milliseconds: ages are measured on it. */
  clock: Clock;
  /** Wall-clock milliseconds since the epoch: what the body reports. */
  wallNow: () => number;
}

export interface HealthReport {
  status: 200 | 503;
  body: { lastUpdated: string; currentTime: string; nodeEligible?: boolean; message?: string };
}

/** The health state alone: no I/O, clocks injected. */
export class ProxierHealth {
  private readonly clock: Clock;
  private readonly wallNow: () => number;
  /** Monotonic time of the oldest update queued and not yet applied. */
  private oldestPendingQueued: number | undefined;
  /** Wall time of the last applied update. */
  private lastUpdatedWall: number | undefined;
  private nodeEligible = true;
  /** A hand-over under way (`--handover-socket`): what /readyz says meanwhile. */
  private swapping: string | undefined;

  constructor(
    private readonly healthTimeoutMs: number,
    clocks: HealthClocks,
  ) {
    this.clock = clocks.clock;
    this.wallNow = clocks.wallNow;
  }

  /** A change arrived that a sync must apply (kube-proxy QueuedUpdate: only the oldest counts). */
  queuedUpdate(): void {
    this.oldestPendingQueued ??= this.clock.now();
  }

  /** A sync applied every queued change (kube-proxy Updated). */
  updated(): void {
    this.oldestPendingQueued = undefined;
    this.lastUpdatedWall = this.wallNow();
  }

  /**
   * This Node as the API last showed it (kube-proxy SyncNode); `undefined` once it is deleted.
   * Eligible until the first Node event says otherwise.
   */
  setNode(node: NodeLike | undefined): void {
    if (node === undefined || (node.metadata?.deletionTimestamp !== undefined && node.metadata.deletionTimestamp !== null)) {
      this.nodeEligible = false;
      return;
    }
    this.nodeEligible = !(node.spec?.taints ?? []).some((t) => t.key === TO_BE_DELETED_TAINT);
  }

  /**
   * A successor is taking over (its pid), or none is any more (undefined: it went away). Meanwhile
   * both processes answer on the health port (SO_REUSEPORT): this one says not ready on /readyz,
   * so that the successor's pod is not made ready by this process's answers before it serves.
   */
  setHandingOver(successorPid: number | undefined): void {
    this.swapping = successorPid === undefined ? undefined : `handing over to pid ${successorPid}`;
  }

  /** This process is taking over from the running one (its pid) until it serves (undefined). */
  setTakingOver(fromPid: number | undefined): void {
    this.swapping = fromPid === undefined ? undefined : `taking over from pid ${fromPid}`;
  }

  isHealthy(): boolean {
    return this.oldestPendingQueued === undefined || this.clock.now() - this.oldestPendingQueued < this.healthTimeoutMs;
  }

  livez(): HealthReport {
    return this.report(this.isHealthy());
  }

  healthz(): HealthReport {
    const nodeEligible = this.nodeEligible;
    const report = this.report(this.isHealthy() && nodeEligible);
    report.body.nodeEligible = nodeEligible;
    return report;
  }

  /**
   * /healthz, except while a hand-over is under way: then 503 from both processes. The
   * DaemonSet's readiness probe asks this, so that a new pod turns ready only once its process
   * serves. /healthz itself stays kube-proxy's: cloud load balancers probe it to tell whether the
   * node forwards, and it does all through a hand-over.
   */
  readyz(): HealthReport {
    const report = this.healthz();
    if (this.swapping !== undefined) {
      report.status = 503;
      report.body.message = this.swapping;
    }
    return report;
  }

  private report(healthy: boolean): HealthReport {
    const now = this.wallNow();
    const currentTime = new Date(now).toISOString();
    const lastUpdated = healthy ? currentTime : this.lastUpdatedWall === undefined ? ZERO_TIME : new Date(this.lastUpdatedWall).toISOString();
    return { status: healthy ? 200 : 503, body: { lastUpdated, currentTime } };
  }
}
