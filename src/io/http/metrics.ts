import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics, exponentialBuckets, linearBuckets } from 'prom-client';
import type { Clock } from '../../core/clock.js';
import { systemClock } from '../../core/clock.js';
import { StatsLedger, type Reading } from '../../core/stats-ledger.js';
import { ProgrammingLatencyTracker } from '../../core/programming-latency.js';
import type { ChangeEvent, ProxierEvents, SyncEvent } from '../../seams/proxier-events.js';
import type { UnitStats } from '../../seams/unit-set.js';
import type { ProbeObserver } from './healthz.js';
import type { HttpServer } from './http-server.js';
import { sendText } from './http-server.js';
import { renderDialLatencyHistogram, renderServicePortMetrics } from './service-port-metrics.js';

/**
 * `/metrics` in Prometheus text format, with prom-client.
 *
 * kube-proxy's own metrics keep their names and buckets (pkg/proxy/metrics/metrics.go), so its
 * dashboards and alerts work unchanged; they, the process metrics and node-wide dial latency are
 * prom-client metrics. The userspace-only ones (`kube_userspace_proxy_*`) are labelled by service
 * port and READ at scrape time from the ServicePortStats counters the data path bumps in place:
 * no label set is built and no string formatted per connection, and the data path never touches
 * prom-client. A ledger keeps them monotonic across a service port's recreation; they are
 * rendered in one pass (service-port-metrics.ts says why). Series come from running service ports
 * only, never a client or endpoint address, so their number is bounded by the cluster's Services.
 */

/**
 * What metrics read: the sync loop's events, and at scrape time the units' counters: this
 * process's live ones (`stats`, read through a ledger here), or a reading taken elsewhere (`read`:
 * worker processes, each reading its own through a ledger, summed by the controller).
 */
export type MetricsSources = LiveStatsSources | ReadingSources;

export interface LiveStatsSources {
  events: ProxierEvents;
  stats(): ReadonlyArray<Pick<UnitStats, 'unit' | 'stats'>>;
}

export interface ReadingSources {
  events: ProxierEvents;
  read(): Promise<{ reading: Reading; running: number }>;
}

export interface MetricsOptions {
  /** The sync loop's clock (its events' times are on it). */
  clock?: Clock;
  /** Wall-clock milliseconds since the epoch, for timestamps and trigger-time latencies. */
  wallNow?: () => number;
  /** Node's process_* and nodejs_* metrics (default true). */
  processMetrics?: boolean;
  /** Counters kept by the kernel (UDP receive-buffer drops), brought up to date before each reading. */
  kernelCounters?: { refresh(): Promise<void> };
  /** More families in text format, rendered last at each scrape (the workers' own: worker-metrics.ts). */
  renderMore?: () => string;
}

/** Upstream's buckets for network programming latency: 0, 0.25 s, 0.5 s, 1-59 s, 60-115 s by 5, 2-5 min by 30 s. */
const NETWORK_PROGRAMMING_BUCKETS = [0, ...linearBuckets(0.25, 0.25, 2), ...linearBuckets(1, 1, 59), ...linearBuckets(60, 5, 12), ...linearBuckets(120, 30, 7)];

export class ProxyMetrics implements ProbeObserver {
  readonly registry = new Registry();
  private readonly clock: Clock;
  private readonly wallNow: () => number;
  private readonly ledger = new StatsLedger();
  private readonly kernelCounters: MetricsOptions['kernelCounters'];
  private readonly renderMore: MetricsOptions['renderMore'];
  private reading: Reading | undefined;
  private running = 0;
  /** Network programming latency: which slice changes are new, and when a sync applied them. */
  private readonly latency: ProgrammingLatencyTracker;

  private readonly syncDuration: Histogram;
  private readonly lastSynced: Gauge;
  private readonly lastQueued: Gauge;
  private readonly networkProgramming: Histogram;
  private readonly endpointChanges: Counter;
  private readonly serviceChanges: Counter;
  private readonly noLocalEndpoints: Gauge<'traffic_policy'>;
  private readonly listenersFailed: Gauge;
  private readonly healthzTotal: Counter<'code'>;
  private readonly livezTotal: Counter<'code'>;

  constructor(
    private readonly sources: MetricsSources,
    opts: MetricsOptions = {},
  ) {
    this.clock = opts.clock ?? systemClock;
    this.wallNow = opts.wallNow ?? Date.now;
    this.kernelCounters = opts.kernelCounters;
    this.renderMore = opts.renderMore;
    this.latency = new ProgrammingLatencyTracker({
      clock: this.clock,
      wallNow: this.wallNow,
      observe: (change) => this.networkProgramming.observe(change.sinceTriggerSeconds),
    });
    const registers = [this.registry];
    if (opts.processMetrics !== false) collectDefaultMetrics({ register: this.registry });

    this.syncDuration = new Histogram({ name: 'kubeproxy_sync_proxy_rules_duration_seconds', help: 'SyncProxyRules latency in seconds', buckets: exponentialBuckets(0.001, 2, 15), registers });
    this.lastSynced = new Gauge({ name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds', help: 'The last time proxy rules were successfully synced', registers });
    this.lastQueued = new Gauge({ name: 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', help: 'The last time a sync of proxy rules was queued', registers });
    this.networkProgramming = new Histogram({ name: 'kubeproxy_network_programming_duration_seconds', help: 'In Cluster Network Programming Latency in seconds', buckets: NETWORK_PROGRAMMING_BUCKETS, registers });
    this.endpointChanges = new Counter({ name: 'kubeproxy_sync_proxy_rules_endpoint_changes_total', help: 'Cumulative proxy rules Endpoint changes', registers });
    this.serviceChanges = new Counter({ name: 'kubeproxy_sync_proxy_rules_service_changes_total', help: 'Cumulative proxy rules Service changes', registers });
    this.noLocalEndpoints = new Gauge({ name: 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', help: 'Number of services with a Local traffic policy and no endpoints', labelNames: ['traffic_policy'], registers });
    this.noLocalEndpoints.set({ traffic_policy: 'internal' }, 0);
    this.noLocalEndpoints.set({ traffic_policy: 'external' }, 0);
    this.listenersFailed = new Gauge({ name: 'kube_userspace_proxy_listeners_failed', help: 'Listening sockets wanted but not bound (address in use, privilege, out of open files); each names its service port in /services and is retried at every sync', registers });
    this.healthzTotal = new Counter({ name: 'kubeproxy_proxy_healthz_total', help: 'Cumulative proxy healthz HTTP status', labelNames: ['code'], registers });
    this.livezTotal = new Counter({ name: 'kubeproxy_proxy_livez_total', help: 'Cumulative proxy livez HTTP status', labelNames: ['code'], registers });
    this.defineReadingMetrics();
    sources.events.onChange((e) => this.changed(e));
    sources.events.onSync((e) => this.synced(e));
  }

  /** Takes one reading of every service port's counters and renders the registry. */
  async render(): Promise<string> {
    await this.kernelCounters?.refresh();
    if ('read' in this.sources) {
      const { reading, running } = await this.sources.read();
      this.running = running;
      this.reading = reading;
    } else {
      const live = this.sources.stats();
      this.running = live.length;
      this.reading = this.ledger.read(live.map(({ unit, stats }) => ({ labels: { servicePort: unit.servicePort, protocol: unit.protocol, scope: unit.scope }, stats })));
    }
    return (await this.registry.metrics()) + renderDialLatencyHistogram(this.reading.node) + renderServicePortMetrics(this.reading.series) + (this.renderMore?.() ?? '');
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  // --- the sync loop's events ---------------------------------------------------------------------

  /**
   * A change reached the loop. Like kube-proxy's change trackers, only a change that altered
   * something counts and queues a sync (a re-list or a resync brings nothing new).
   */
  private changed(e: ChangeEvent): void {
    const c = e.change;
    switch (c.kind) {
      case 'upsertEndpointSlice':
        this.latency.upserted(c.object);
        break;
      case 'deleteEndpointSlice':
        this.latency.deleted(c.namespace, c.name);
        break;
      case 'replaceEndpointSlices':
        this.latency.replaced(c.objects);
        break;
      default:
        break;
    }
    if (e.changed === 0) return;
    if (c.kind === 'upsertService' || c.kind === 'deleteService' || c.kind === 'replaceServices') this.serviceChanges.inc(e.changed);
    else if (c.kind !== 'setNode') this.endpointChanges.inc(e.changed);
    // kube-proxy queues syncs (and stamps this gauge) once initialized: after the first sync.
    if (e.initialized) this.lastQueued.set(this.wallNow() / 1000);
  }

  // --- ProbeObserver -------------------------------------------------------------------------------

  probed(path: 'healthz' | 'livez', status: number): void {
    (path === 'healthz' ? this.healthzTotal : this.livezTotal).inc({ code: String(status) });
  }

  private synced(e: SyncEvent): void {
    this.syncDuration.observe(e.summary.durationMs / 1000);
    this.listenersFailed.set(e.listenersFailed);
    // A failed portal sync is upstream's failed iptables-restore: not "successfully synced", and
    // the changes it carried are not programmed yet.
    if (e.summary.portalErrors > 0) return;
    this.lastSynced.set(this.wallNow() / 1000);
    this.latency.synced(e);
    this.noLocalEndpoints.set({ traffic_policy: 'internal' }, e.noLocalEndpoints.internal);
    this.noLocalEndpoints.set({ traffic_policy: 'external' }, e.noLocalEndpoints.external);
  }

  /** What is read from the reading rather than recorded: the service-port count. */
  private defineReadingMetrics(): void {
    const registers = [this.registry];
    const running = (): number => this.running;
    new Gauge({
      name: 'kube_userspace_proxy_service_ports',
      help: 'Service ports proxied now (one whose internal and external traffic policies differ counts twice)',
      registers,
      collect() {
        this.set(running());
      },
    });
  }
}

/**
 * Adds `/metrics` (and kube-proxy's `/proxyMode`) to the admin server. The returned metrics
 * follow the sync loop's events; hand them to the health server as its ProbeObserver.
 */
export function attachMetrics(admin: HttpServer, sources: MetricsSources, opts: MetricsOptions = {}): ProxyMetrics {
  const metrics = new ProxyMetrics(sources, opts);
  admin.route('/metrics', async (_req, res) => sendText(res, 200, await metrics.render(), metrics.contentType));
  admin.route('/proxyMode', (_req, res) => sendText(res, 200, 'userspace'));
  return metrics;
}
