import type { AddressInfo } from 'node:net';
import type { ServerResponse } from 'node:http';
import type { Clock } from '../../core/clock.js';
import { systemClock } from '../../core/clock.js';
import type { Logger } from '../../log.js';
import type { SinkObserver } from '../../observed-sink.js';
import type { SyncSummary } from '../../proxier.js';
import { HttpServer } from './http-server.js';

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
  body: { lastUpdated: string; currentTime: string; nodeEligible?: boolean };
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

  constructor(
    private readonly healthTimeoutMs: number,
    clocks: Partial<HealthClocks> = {},
  ) {
    this.clock = clocks.clock ?? systemClock;
    this.wallNow = clocks.wallNow ?? Date.now;
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

  private report(healthy: boolean): HealthReport {
    const now = this.wallNow();
    const currentTime = new Date(now).toISOString();
    const lastUpdated = healthy ? currentTime : this.lastUpdatedWall === undefined ? ZERO_TIME : new Date(this.lastUpdatedWall).toISOString();
    return { status: healthy ? 200 : 503, body: { lastUpdated, currentTime } };
  }
}

/** The part of the Proxier health follows: its sync callbacks and whether it has synced yet. */
export interface HealthProxier {
  readonly onSync: Array<(s: SyncSummary) => void>;
  readonly lastSyncAt: number | undefined;
}

/**
 * Feeds `health` from the proxier: a sync without portal errors is an update (a failed portal
 * sync is kube-proxy's failed iptables-restore: the update stays pending). Returns the observer
 * to put on the sink, which queues an update per change once the first sync has run (kube-proxy
 * queues nothing before it is initialized: a slow first list does not fail liveness).
 */
export function followProxier(health: ProxierHealth, proxier: HealthProxier): SinkObserver {
  proxier.onSync.push((s) => {
    if (s.portalErrors === 0) health.updated();
  });
  const changed = (): void => {
    if (proxier.lastSyncAt !== undefined) health.queuedUpdate();
  };
  return { servicesChanged: changed, endpointSlicesChanged: changed, nodeChanged: changed };
}

/** Counts probe answers (kubeproxy_proxy_healthz_total / _livez_total); metrics.ts implements it. */
export interface ProbeObserver {
  probed(path: 'healthz' | 'livez', status: number): void;
}

function send(res: ServerResponse, report: HealthReport): void {
  // One line, as kube-proxy writes it.
  const text = JSON.stringify(report.body);
  res.writeHead(report.status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), 'X-Content-Type-Options': 'nosniff' });
  res.end(text);
}

/** Adds `/healthz` and `/livez` to a server. */
export function healthRoutes(server: HttpServer, health: ProxierHealth, probes?: ProbeObserver): HttpServer {
  return server
    .route('/healthz', (_req, res) => {
      const report = health.healthz();
      probes?.probed('healthz', report.status);
      send(res, report);
    })
    .route('/livez', (_req, res) => {
      const report = health.livez();
      probes?.probed('livez', report.status);
      send(res, report);
    });
}

export interface HealthServerOptions {
  host: string;
  port: number;
  health: ProxierHealth;
  logger: Logger;
  probes?: ProbeObserver;
}

/** Starts the health server on `--healthz-bind-address`. */
export async function startHealthServer(opts: HealthServerOptions): Promise<{ server: HttpServer; address: AddressInfo }> {
  const server = healthRoutes(new HttpServer(opts.logger.child({ component: 'healthz' })), opts.health, opts.probes);
  const address = await server.listen(opts.host, opts.port);
  return { server, address };
}
