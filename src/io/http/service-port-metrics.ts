import { DIAL_FAILURE_REASONS, type Series, type Totals } from '../../core/stats-ledger.js';
import { DIAL_LATENCY_BUCKETS } from '../../core/stats.js';

/**
 * The per-service-port metrics (`kube_userspace_proxy_*`), rendered straight from a ledger
 * reading in Prometheus text format 0.0.4.
 *
 * They are the bulk of a scrape (about a dozen series per service port) and a scrape runs on the
 * event loop that also copies every proxied byte. Going through prom-client's collect() and
 * inc() per series hashes and validates labels, then formats line by line; one string pass over
 * the reading costs a small fraction of that (`npm run bench:metrics` measures both).
 * The label values are Kubernetes names, escaped anyway.
 */

type Protocol = 'TCP' | 'UDP';

interface Family {
  name: string;
  help: string;
  type: 'counter' | 'gauge';
  /** Series of one protocol only (connections are TCP, sessions UDP); both when absent. */
  only?: Protocol;
  /** One sample per entry: an extra label (or '') and how to read it. */
  samples: ReadonlyArray<readonly [extraLabel: string, read: (t: Totals) => number]>;
}

const one = (read: (t: Totals) => number): Family['samples'] => [['', read]];

export const SERVICE_PORT_FAMILIES: readonly Family[] = [
  { name: 'kube_userspace_proxy_connections_accepted_total', help: 'TCP connections accepted', type: 'counter', only: 'TCP', samples: one((t) => t.accepted) },
  { name: 'kube_userspace_proxy_connections_active', help: 'TCP connections open now', type: 'gauge', only: 'TCP', samples: one((t) => t.active) },
  {
    name: 'kube_userspace_proxy_bytes_total',
    help: 'Bytes copied, by direction: to_endpoint (from clients) or to_client; a TCP connection\'s bytes are counted when it closes',
    type: 'counter',
    samples: [['direction="to_endpoint"', (t) => t.bytesToEndpoint], ['direction="to_client"', (t) => t.bytesToClient]],
  },
  { name: 'kube_userspace_proxy_dial_attempts_total', help: 'Endpoint dials attempted, each retry counting', type: 'counter', only: 'TCP', samples: one((t) => t.dialAttempts) },
  {
    name: 'kube_userspace_proxy_dial_failures_total',
    help: 'Endpoint dials that failed, by reason: refused, timeout, unreachable, other',
    type: 'counter',
    only: 'TCP',
    samples: DIAL_FAILURE_REASONS.map((r) => [`reason="${r}"`, (t: Totals) => t.dialFailures[r]] as const),
  },
  { name: 'kube_userspace_proxy_dial_exhausted_total', help: 'TCP connections reset because no endpoint could be dialed', type: 'counter', only: 'TCP', samples: one((t) => t.dialExhausted) },
  { name: 'kube_userspace_proxy_no_endpoints_total', help: 'TCP connections reset, or UDP datagrams dropped, because the service port had no endpoints', type: 'counter', samples: one((t) => t.noEndpointRejects) },
  { name: 'kube_userspace_proxy_udp_sessions_active', help: 'UDP sessions (client address to endpoint) open now', type: 'gauge', only: 'UDP', samples: one((t) => t.udpSessionsActive) },
  { name: 'kube_userspace_proxy_udp_sessions_total', help: 'UDP sessions opened', type: 'counter', only: 'UDP', samples: one((t) => t.udpSessionsCreated) },
  { name: 'kube_userspace_proxy_udp_sessions_reclaimed_total', help: 'UDP sessions closed early because the per-port bound (--max-udp-sessions) was reached', type: 'counter', only: 'UDP', samples: one((t) => t.udpSessionsReclaimed) },
  { name: 'kube_userspace_proxy_udp_datagrams_total', help: 'UDP datagrams received from clients', type: 'counter', only: 'UDP', samples: one((t) => t.udpDatagrams) },
  {
    name: 'kube_userspace_proxy_udp_datagrams_dropped_total',
    help: 'UDP datagrams from clients not sent on: the session\'s queue was full while its socket connected, the session ended first, or the client\'s port was 0 (for want of endpoints: no_endpoints_total)',
    type: 'counter',
    only: 'UDP',
    samples: one((t) => t.udpDatagramsDropped),
  },
  { name: 'kube_userspace_proxy_source_rejects_total', help: 'TCP connections reset and UDP datagrams dropped because their source is outside the load balancer\'s spec.loadBalancerSourceRanges (bind portal; the iptables portal does not redirect them)', type: 'counter', samples: one((t) => t.sourceRejects) },
  { name: 'kube_userspace_proxy_outlier_ejections_total', help: 'Endpoints set aside by passive health after consecutive failed dials (--outlier-*)', type: 'counter', samples: one((t) => t.outlierEjections) },
  {
    name: 'kube_userspace_proxy_held',
    help: 'TCP connections held, or UDP datagrams queued, for want of endpoints now (annotation kube-userspace-proxy.io/hold-when-empty): demand waiting for the workload to scale up',
    type: 'gauge',
    samples: one((t) => t.held),
  },
  { name: 'kube_userspace_proxy_held_total', help: 'TCP connections held, and UDP datagrams queued, for want of endpoints', type: 'counter', samples: one((t) => t.heldTotal) },
  { name: 'kube_userspace_proxy_hold_expired_total', help: 'Held TCP connections reset, and queued UDP datagrams dropped, because no endpoint came before the hold ran out', type: 'counter', samples: one((t) => t.holdExpired) },
  {
    name: 'kube_userspace_proxy_udp_receive_buffer_drops_total',
    help: 'UDP datagrams the kernel dropped because a listener\'s receive buffer was full (the drops column of /proc/net/udp, read at scrape time)',
    type: 'counter',
    only: 'UDP',
    samples: one((t) => t.udpReceiveBufferDrops),
  },
];

function escapeLabelValue(v: string): string {
  return /[\\"\n]/.test(v) ? v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"') : v;
}

/** The text of every per-service-port family for one reading; ends with a newline. */
export function renderServicePortMetrics(series: readonly Series[]): string {
  const labels = series.map((s) => `service_port="${escapeLabelValue(s.labels.servicePort)}",protocol="${escapeLabelValue(s.labels.protocol)}",scope="${escapeLabelValue(s.labels.scope)}"`);
  const out: string[] = [];
  for (const f of SERVICE_PORT_FAMILIES) {
    out.push(`# HELP ${f.name} ${f.help}`, `# TYPE ${f.name} ${f.type}`);
    series.forEach((s, i) => {
      if (f.only !== undefined && s.labels.protocol !== f.only) return;
      for (const [extra, read] of f.samples) out.push(`${f.name}{${labels[i] as string}${extra === '' ? '' : `,${extra}`}} ${read(s.totals)}`);
    });
  }
  out.push('');
  return out.join('\n');
}

const DIAL_DURATION_NAME = 'kube_userspace_proxy_dial_duration_seconds';

/**
 * Dial latency over every service port of the node, as a Prometheus histogram (per service port
 * it would be 15 series each). The counts are already bucketed on the data path, and prom-client
 * takes observations, not bucket counts: rendered here like the families above.
 */
export function renderDialLatencyHistogram(t: Totals | undefined): string {
  const name = DIAL_DURATION_NAME;
  const out = [`# HELP ${name} Time to connect to an endpoint, successful dials only`, `# TYPE ${name} histogram`];
  let cumulative = 0;
  DIAL_LATENCY_BUCKETS.forEach((le, i) => {
    cumulative += t?.dialLatencyCounts[i] ?? 0;
    out.push(`${name}_bucket{le="${le}"} ${cumulative}`);
  });
  out.push(`${name}_bucket{le="+Inf"} ${t?.dialLatencyCount ?? 0}`, `${name}_sum ${t?.dialLatencySum ?? 0}`, `${name}_count ${t?.dialLatencyCount ?? 0}`, '');
  return out.join('\n');
}
