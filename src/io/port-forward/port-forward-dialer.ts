import type { PodRef } from '../../core/model.js';
import type { ReachPolicy } from '../../core/reach.js';
import type { Dialer, DialRequest, Upstream } from '../../seams/dialer.js';
import type { Logger } from '../../seams/logger.js';
import { PodTunnel, type TunnelTimings } from './pod-tunnel.js';
import { PortForwardError } from './port-forward-error.js';
import type { TunnelOpener } from './tunnel-opener.js';

/**
 * Dial attempts through a tunnel: the first may have to open it (TLS, credentials, maybe an exec
 * plugin, the API server's and the kubelet's upgrades), so it gets longer than a TCP connect.
 */
export const PORT_FORWARD_DIAL_TIMEOUTS_MS: readonly number[] = [10_000, 5_000, 5_000, 5_000];

export const DEFAULT_TUNNEL_TIMINGS: TunnelTimings = {
  // client-go's tunnelling dialer pings every 10 s (PingPeriod).
  pingIntervalMs: 10_000,
  pingTimeoutMs: 30_000,
  idleCloseMs: 120_000,
};

export interface PortForwardDialerOptions {
  opener: TunnelOpener;
  logger: Logger;
  now?: () => number;
  timings?: Partial<TunnelTimings>;
  /** How often the one sweep runs (keepalive, idle close); default 1 s. */
  sweepIntervalMs?: number;
  /** Bytes kept per stream for a re-dial before the pod speaks (pod-stream.ts). */
  keepLimit?: number;
}

/**
 * Reaches an endpoint's pod (its EndpointSlice `targetRef`) at the endpoint's port through the API
 * server's pods/portforward: one tunnel per pod (pod-tunnel.ts), one stream pair per connection.
 * A dial resolves as soon as the streams are asked for; a pod that turns out to refuse fails the
 * stream early, with its bytes, and the connection tries the next endpoint (seams/dialer.ts).
 *
 * RBAC: `get` and `create` on pods/portforward in the watched namespaces (the WebSocket upgrade is
 * a GET, the SPDY one a POST). A 403 is said once per namespace.
 */
export class PortForwardDialer implements Dialer {
  readonly reach: ReachPolicy = {
    protocol: (p) => (p === 'UDP' ? 'UDP is not carried by port-forward (TCP only)' : undefined),
    endpoint: (ep) => (ep.targetPod === undefined ? 'no pod behind it (the EndpointSlice endpoint has no targetRef, as a selector-less Service\'s): port-forward reaches pods only' : undefined),
  };
  private readonly tunnels = new Map<string, PodTunnel>();
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly timings: TunnelTimings;
  private readonly forbiddenSaid = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  /** close() was called: no dial from now on. */
  private closed = false;

  constructor(private readonly opts: PortForwardDialerOptions) {
    this.log = opts.logger.child({ component: 'port-forward' });
    this.now = opts.now ?? (() => performance.now());
    this.timings = { ...DEFAULT_TUNNEL_TIMINGS, ...opts.timings };
  }

  dial(req: DialRequest): Promise<Upstream> {
    const pod = req.endpoint.targetPod;
    if (pod === undefined) return Promise.reject(new PortForwardError('no-pod', `endpoint ${req.endpoint.addr} names no pod: port-forward cannot reach it`));
    if (this.closed) return Promise.reject(new PortForwardError('tunnel-closed', `pod ${pod.namespace}/${pod.name}: the dialer is closed (the proxy is stopping)`));
    this.start();
    return this.tunnel(pod).stream(req.endpoint.port, req.onread, req.timeoutMs);
  }

  /** Tunnels open or opening now (tests, /services). */
  tunnelCount(): number {
    return this.tunnels.size;
  }

  /** The transport of the tunnel to `pod`, when one is open. */
  transportOf(pod: PodRef): 'websocket' | 'spdy' | undefined {
    return this.tunnels.get(podKey(pod))?.transport;
  }

  /** The one coarse sweep over every tunnel: keepalive PINGs, idle closes, forgetting what is gone. */
  sweep(nowMs = this.now()): void {
    for (const [key, tunnel] of this.tunnels) {
      if (tunnel.sweep(nowMs, this.timings)) this.tunnels.delete(key);
    }
    if (this.tunnels.size === 0) this.stopTimer();
  }

  /** Close every tunnel (their streams fail; one still opening is closed once it opens) and stop the sweep. */
  close(): void {
    this.closed = true;
    this.stopTimer();
    for (const t of this.tunnels.values()) t.close();
    this.tunnels.clear();
  }

  private start(): void {
    if (this.timer !== undefined) return;
    this.timer = setInterval(() => this.sweep(), this.opts.sweepIntervalMs ?? 1000);
    this.timer.unref();
  }

  private stopTimer(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }

  private tunnel(pod: PodRef): PodTunnel {
    const key = podKey(pod);
    let tunnel = this.tunnels.get(key);
    if (tunnel === undefined) {
      tunnel = new PodTunnel(pod, {
        opener: this.opts.opener,
        now: this.now,
        logger: this.log,
        ...(this.opts.keepLimit !== undefined ? { keepLimit: this.opts.keepLimit } : {}),
        onOpenFailed: (p, err) => this.openFailed(p, err),
      });
      this.tunnels.set(key, tunnel);
    }
    return tunnel;
  }

  /** A 403 is the user's to fix: one line per namespace naming what is missing. The rest at debug. */
  private openFailed(pod: PodRef, err: PortForwardError): void {
    if (err.failure === 'status' && err.status === 403) {
      if (this.forbiddenSaid.has(pod.namespace)) return;
      this.forbiddenSaid.add(pod.namespace);
      this.log.warn({ namespace: pod.namespace, err: err.message }, `forbidden: cannot create pods/portforward in namespace ${pod.namespace}: grant get and create on pods/portforward there (deploy/developer/port-forward-role.yaml)`);
      return;
    }
    this.log.debug({ pod: podKey(pod), reason: err.failure, err: err.message }, 'port-forward tunnel could not open');
  }
}

function podKey(pod: PodRef): string {
  return `${pod.namespace}/${pod.name}`;
}
