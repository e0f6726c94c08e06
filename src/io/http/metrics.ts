import type { V1EndpointSlice } from '@kubernetes/client-node';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics, exponentialBuckets, linearBuckets } from 'prom-client';
import type { Clock } from '../../core/clock.js';
import { systemClock } from '../../core/clock.js';
import { DIAL_LATENCY_BUCKETS, type ServicePortStats } from '../../core/stats.js';
import { StatsLedger, type Reading, type Totals } from '../../core/stats-ledger.js';
import type { StateSink } from '../../core/state-cache.js';
import { ProgrammingLatencyTracker } from '../kube/programming-latency.js';
import type { ProxyUnit } from '../../core/units.js';
import type { SinkObserver } from '../../observed-sink.js';
import type { SyncSummary } from '../../proxier.js';
import type { ProbeObserver } from './healthz.js';
import type { HttpServer } from './http-server.js';
import { sendText } from './http-server.js';
import { renderServicePortMetrics } from './service-port-metrics.js';

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

/** The parts of the Proxier that metrics read. */
export interface MetricsProxier {
  unitStats(): Array<{ unit: ProxyUnit; stats: ServicePortStats }>;
  readonly onSync: Array<(s: SyncSummary) => void>;
  readonly lastSyncAt: number | undefined;
  /** When the oldest change not yet applied was queued, on the proxier's clock. */
  readonly pendingSince: number | undefined;
  /** Service ports whose Local traffic policy finds no endpoint on this node, as of the last sync. */
  noLocalEndpoints(): { internal: number; external: number };
}

export interface MetricsOptions {
  /** The proxier's clock (pendingSince is read on it). */
  clock?: Clock;
  /** Wall-clock milliseconds since the epoch, for timestamps and trigger-time latencies. */
  wallNow?: () => number;
  /** Node's process_* and nodejs_* metrics (default true). */
  processMetrics?: boolean;
  /** Counters kept by the kernel (UDP receive-buffer drops), brought up to date before each reading. */
  kernelCounters?: { refresh(): Promise<void> };
}

/** Upstream's buckets for network programming latency: 0, 0.25 s, 0.5 s, 1-59 s, 60-115 s by 5, 2-5 min by 30 s. */
const NETWORK_PROGRAMMING_BUCKETS = [0, ...linearBuckets(0.25, 0.25, 2), ...linearBuckets(1, 1, 59), ...linearBuckets(60, 5, 12), ...linearBuckets(120, 30, 7)];

/** Bound on trigger times waiting for a sync: far above what one sync period collects. */

export class ProxyMetrics implements SinkObserver, ProbeObserver {
  readonly registry = new Registry();
  private readonly clock: Clock;
  private readonly wallNow: () => number;
  private readonly ledger = new StatsLedger();
  private readonly kernelCounters: MetricsOptions['kernelCounters'];
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
  private readonly healthzTotal: Counter<'code'>;
  private readonly livezTotal: Counter<'code'>;

  constructor(
    private readonly proxier: MetricsProxier,
    opts: MetricsOptions = {},
  ) {
    this.clock = opts.clock ?? systemClock;
    this.wallNow = opts.wallNow ?? Date.now;
    this.kernelCounters = opts.kernelCounters;
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
    this.healthzTotal = new Counter({ name: 'kubeproxy_proxy_healthz_total', help: 'Cumulative proxy healthz HTTP status', labelNames: ['code'], registers });
    this.livezTotal = new Counter({ name: 'kubeproxy_proxy_livez_total', help: 'Cumulative proxy livez HTTP status', labelNames: ['code'], registers });
    this.defineReadingMetrics();
    proxier.onSync.push((s) => this.synced(s));
  }

  /** Takes one reading of every service port's counters and renders the registry. */
  async render(): Promise<string> {
    await this.kernelCounters?.refresh();
    const live = this.proxier.unitStats();
    this.running = live.length;
    this.reading = this.ledger.read(live.map(({ unit, stats }) => ({ labels: { servicePort: unit.servicePort, protocol: unit.protocol, scope: unit.scope }, stats })));
    return (await this.registry.metrics()) + renderServicePortMetrics(this.reading.series);
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  // --- SinkObserver: changes as they reach the proxier -------------------------------------------

  servicesChanged(count: number): void {
    this.serviceChanges.inc(count);
    this.queued();
  }

  endpointSlicesChanged(upserted: readonly V1EndpointSlice[], deleted: number): void {
    this.endpointChanges.inc(upserted.length + deleted);
    this.queued();
  }

  /**
   * The sink between a source and the proxier, noting the trigger times of changed slices: a
   * slice counts when its `last-change-trigger-time` is new, so a re-list does not count again.
   */
  wrapSink(sink: StateSink): StateSink {
    return this.latency.wrap(sink);
  }

  nodeChanged(): void {
    this.queued();
  }

  // --- ProbeObserver -------------------------------------------------------------------------------

  probed(path: 'healthz' | 'livez', status: number): void {
    (path === 'healthz' ? this.healthzTotal : this.livezTotal).inc({ code: String(status) });
  }

  private queued(): void {
    // kube-proxy queues syncs (and stamps this gauge) once initialized: after the first sync.
    if (this.proxier.lastSyncAt !== undefined) this.lastQueued.set(this.wallNow() / 1000);
  }

  private synced(s: SyncSummary): void {
    this.syncDuration.observe(s.durationMs / 1000);
    // A failed portal sync is upstream's failed iptables-restore: not "successfully synced", and
    // the changes it carried are not programmed yet.
    if (s.portalErrors > 0) return;
    const now = this.wallNow();
    this.lastSynced.set(now / 1000);
    this.latency.synced(s);
    // The proxier keeps these counts per Service as it syncs: reading them is free, and a change
    // that arrived during this sync shows at the next one.
    const counts = this.proxier.noLocalEndpoints();
    this.noLocalEndpoints.set({ traffic_policy: 'internal' }, counts.internal);
    this.noLocalEndpoints.set({ traffic_policy: 'external' }, counts.external);
  }

  /** What is read from the reading rather than recorded: the service-port count and node-wide dial latency. */
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
    new DialLatencyHistogram(registers, () => this.reading?.node);
  }
}

/**
 * Dial latency over every service port of the node (per service port it would be 15 series
 * each). prom-client cannot take bucket counts, so the reading is rendered directly.
 */
const DIAL_DURATION_NAME = 'kube_userspace_proxy_dial_duration_seconds';
const DIAL_DURATION_HELP = 'Time to connect to an endpoint, successful dials only';

class DialLatencyHistogram extends Histogram {
  constructor(
    registers: Registry[],
    private readonly node: () => Totals | undefined,
  ) {
    super({ name: DIAL_DURATION_NAME, help: DIAL_DURATION_HELP, buckets: [...DIAL_LATENCY_BUCKETS], registers });
  }

  override async get(): ReturnType<Histogram['get']> {
    const t = this.node();
    const name = DIAL_DURATION_NAME;
    const values: Array<{ labels: Record<string, string | number>; value: number; metricName: string }> = [];
    let cumulative = 0;
    DIAL_LATENCY_BUCKETS.forEach((le, i) => {
      cumulative += t?.dialLatencyCounts[i] ?? 0;
      values.push({ labels: { le }, value: cumulative, metricName: `${name}_bucket` });
    });
    values.push({ labels: { le: '+Inf' }, value: t?.dialLatencyCount ?? 0, metricName: `${name}_bucket` });
    values.push({ labels: {}, value: t?.dialLatencySum ?? 0, metricName: `${name}_sum` });
    values.push({ labels: {}, value: t?.dialLatencyCount ?? 0, metricName: `${name}_count` });
    // Histogram.get() would render its own (empty) observations: build the whole object here.
    const metric = { name, help: DIAL_DURATION_HELP, type: 'histogram', aggregator: 'sum', values };
    return metric as unknown as Awaited<ReturnType<Histogram['get']>>;
  }

  /** The registry renders through this when present. */
  getForPromString(): ReturnType<Histogram['get']> {
    return this.get();
  }
}

/**
 * Adds `/metrics` (and kube-proxy's `/proxyMode`) to the admin server. The returned metrics
 * observe the proxier's syncs; put them on the sink too (`observeSink(proxier.sink, metrics)`)
 * for the change counters, and hand them to the health server as its ProbeObserver.
 */
export function attachMetrics(admin: HttpServer, proxier: MetricsProxier, opts: MetricsOptions = {}): ProxyMetrics {
  const metrics = new ProxyMetrics(proxier, opts);
  admin.route('/metrics', async (_req, res) => sendText(res, 200, await metrics.render(), metrics.contentType));
  admin.route('/proxyMode', (_req, res) => sendText(res, 200, 'userspace'));
  return metrics;
}
