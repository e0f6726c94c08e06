import type { AddressInfo } from 'node:net';
import type { ServerResponse } from 'node:http';
import { ProxierHealth, type HealthReport } from '../../core/proxier-health.js';
import type { Logger } from '../../seams/logger.js';
import type { ProxierEvents } from '../../seams/proxier-events.js';
import { HttpServer } from './http-server.js';

/**
 * Feeds `health` from the sync loop's events: a complete sync without portal errors is an update
 * (a failed portal sync is kube-proxy's failed iptables-restore, and a fast-lane run that left
 * Services to the runner applied only part: the update stays pending), and a change
 * that altered something queues one once the first sync has run (kube-proxy queues nothing before
 * it is initialized: a slow first list does not fail liveness). Returns the unsubscribe function.
 */
export function followProxier(health: ProxierHealth, events: ProxierEvents): () => void {
  const offSync = events.onSync((e) => {
    if (e.complete && e.summary.portalErrors === 0) health.updated();
  });
  const offChange = events.onChange((e) => {
    if (e.changed > 0 && e.initialized) health.queuedUpdate();
  });
  return () => {
    offSync();
    offChange();
  };
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

/** Adds `/healthz`, `/readyz` (hand-over aware: ProxierHealth.readyz) and `/livez` to a server. */
export function healthRoutes(server: HttpServer, health: ProxierHealth, probes?: ProbeObserver): HttpServer {
  return server
    .route('/healthz', (_req, res) => {
      const report = health.healthz();
      probes?.probed('healthz', report.status);
      send(res, report);
    })
    // Ours, not kube-proxy's: not counted in kube-proxy's probe metrics.
    .route('/readyz', (_req, res) => send(res, health.readyz()))
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
  /** SO_REUSEPORT (--handover-socket): the next process binds the same address beside this one. */
  reusePort?: boolean;
}

/** Starts the health server on `--healthz-bind-address`. */
export async function startHealthServer(opts: HealthServerOptions): Promise<{ server: HttpServer; address: AddressInfo }> {
  const server = healthRoutes(new HttpServer(opts.logger.child({ component: 'healthz' })), opts.health, opts.probes);
  const address = await server.listen(opts.host, opts.port, opts.reusePort ?? false);
  return { server, address };
}
