/**
 * Counters for one proxied service port. Plain numeric fields, bumped in place on the data path:
 * no label sets, no strings, no allocation per connection. Metrics read them at scrape time.
 */

/** Upper bounds (seconds) of the dial-latency histogram buckets; the last bucket is +Inf. */
export const DIAL_LATENCY_BUCKETS: readonly number[] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];

/** An empty dial-latency histogram, copied for each service port (see dialLatencyCounts). */
const NO_DIAL_LATENCIES: readonly number[] = Array.from({ length: DIAL_LATENCY_BUCKETS.length + 1 }, () => 0);

export type DialFailureReason = 'refused' | 'timeout' | 'unreachable' | 'other';

export class ServicePortStats {
  /** TCP connections accepted. */
  accepted = 0;
  /** TCP connections open now (client side accepted, not yet both released). */
  active = 0;
  /** Bytes copied client -> endpoint (TCP and UDP; UDP counts a datagram when it is handed to the endpoint's socket). */
  bytesToEndpoint = 0;
  /** Bytes copied endpoint -> client (TCP and UDP). */
  bytesToClient = 0;
  dialAttempts = 0;
  dialFailures: Record<DialFailureReason, number> = { refused: 0, timeout: 0, unreachable: 0, other: 0 };
  /** Connections reset (or UDP datagrams dropped) because the service port had no endpoints. */
  noEndpointRejects = 0;
  /** Connections reset because every dial failed. */
  dialExhausted = 0;
  udpSessionsActive = 0;
  udpSessionsCreated = 0;
  /** UDP sessions reclaimed because the per-port bound was reached. */
  udpSessionsReclaimed = 0;
  /** Datagrams received from clients. */
  udpDatagrams = 0;
  /**
   * Datagrams from clients that were not sent on for want of a session: their session's queue was
   * full while its socket connected, the session ended before it connected, or the datagram came
   * from port 0, where no reply can go. (Those dropped for want of endpoints are in noEndpointRejects.)
   */
  udpDatagramsDropped = 0;
  /**
   * Datagrams the kernel dropped because a listener's receive buffer was full: never seen by the
   * proxy, so read from the kernel at scrape time (udp-receive-buffers.ts), not bumped per datagram.
   */
  udpReceiveBufferDrops = 0;
  /** Endpoints set aside by passive health (outlier ejections). */
  outlierEjections = 0;
  /** TCP connections reset, and UDP datagrams dropped, from outside a load balancer's source ranges. */
  sourceRejects = 0;
  /** TCP connections held, or UDP datagrams queued, for want of endpoints now (hold-when-empty). */
  held = 0;
  /** TCP connections and UDP datagrams ever held for want of endpoints. */
  heldTotal = 0;
  /** Held TCP connections reset, and queued datagrams dropped, when the hold ran out. */
  holdExpired = 0;
  /**
   * Dial latency histogram: counts per bucket of DIAL_LATENCY_BUCKETS, plus +Inf at the end. A
   * plain array: a Float64Array has a backing store of its own to allocate and later free, several
   * times the cost of this copy (10,000 of each: 7-14 ms against 1-7), one per service port.
   */
  readonly dialLatencyCounts: number[] = NO_DIAL_LATENCIES.slice();
  dialLatencySum = 0;
  dialLatencyCount = 0;

  observeDialLatency(seconds: number): void {
    let i = 0;
    while (i < DIAL_LATENCY_BUCKETS.length && seconds > (DIAL_LATENCY_BUCKETS[i] as number)) i++;
    this.dialLatencyCounts[i] = (this.dialLatencyCounts[i] as number) + 1;
    this.dialLatencySum += seconds;
    this.dialLatencyCount++;
  }
}
