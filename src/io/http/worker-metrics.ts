import type { WorkerFigures } from '../../seams/workers.js';
import type { HttpServer } from './http-server.js';
import { sendJson } from './http-server.js';

/** What the per-worker figures are read from (workers/worker-pool.ts). */
export interface WorkerFiguresSource {
  figures(): WorkerFigures[];
  /** Workers replaced since the start. */
  restarts(): number;
  /** Workers killed for not answering in time (each also a restart). */
  unresponsive(): number;
  /** Worker processes serving now. */
  serving(): number;
  /** Brings the figures up to date (asks every worker for its counters). */
  refreshFigures(): Promise<void>;
}

/**
 * The node's workers (`--workers N`): `/workers` as JSON, one entry per worker slot (pid, state,
 * restarts, its counters). A slot's counters add up every process it has had, so they only grow
 * across a replacement; the service-port series of /metrics stay node-wide sums.
 */
export function attachWorkerFigures(admin: HttpServer, source: WorkerFiguresSource): void {
  admin.route('/workers', async (_req, res) => {
    await source.refreshFigures();
    sendJson(res, 200, { workers: source.figures(), restarts: source.restarts(), unresponsive: source.unresponsive() });
  });
}

interface Family {
  name: string;
  help: string;
  type: 'counter' | 'gauge';
  read: (f: WorkerFigures) => number;
}

const PER_WORKER: readonly Family[] = [
  { name: 'kube_userspace_proxy_worker_connections_accepted_total', help: 'TCP connections accepted, per worker slot (its processes so far)', type: 'counter', read: (f) => f.connectionsAccepted },
  { name: 'kube_userspace_proxy_worker_udp_datagrams_total', help: 'UDP datagrams received from clients, per worker slot (its processes so far)', type: 'counter', read: (f) => f.udpDatagrams },
  { name: 'kube_userspace_proxy_worker_active', help: 'TCP connections and UDP sessions open now, per worker', type: 'gauge', read: (f) => f.active },
];

/**
 * The workers' families in Prometheus text format, read at scrape time after the pool's reading
 * (metrics.ts renders them after its own): how many serve, how many were replaced, and a few
 * figures labelled `worker`. Ends with a newline.
 */
export function renderWorkerMetrics(source: Pick<WorkerFiguresSource, 'figures' | 'restarts' | 'unresponsive' | 'serving'>): string {
  const figures = source.figures();
  const out = [
    '# HELP kube_userspace_proxy_workers Worker processes serving now (--workers)',
    '# TYPE kube_userspace_proxy_workers gauge',
    `kube_userspace_proxy_workers ${source.serving()}`,
    '# HELP kube_userspace_proxy_worker_restarts_total Worker processes that exited and were replaced',
    '# TYPE kube_userspace_proxy_worker_restarts_total counter',
    `kube_userspace_proxy_worker_restarts_total ${source.restarts()}`,
    '# HELP kube_userspace_proxy_worker_unresponsive_total Worker processes killed for not answering the controller in time (stopped or stuck); each is also a restart',
    '# TYPE kube_userspace_proxy_worker_unresponsive_total counter',
    `kube_userspace_proxy_worker_unresponsive_total ${source.unresponsive()}`,
  ];
  for (const f of PER_WORKER) {
    out.push(`# HELP ${f.name} ${f.help}`, `# TYPE ${f.name} ${f.type}`);
    for (const w of figures) out.push(`${f.name}{worker="${w.worker}"} ${f.read(w)}`);
  }
  out.push('');
  return out.join('\n');
}
