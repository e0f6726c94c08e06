import { hostname } from 'node:os';
import { hostPort } from './core/address.js';
import { RoundRobinBalancer } from './core/balancer/round-robin.js';
import { systemClock } from './core/clock.js';
import { ProxyError, errnoCode } from './core/errors.js';
import { PortAllocator } from './core/port-allocator.js';
import { ProxierHealth } from './core/proxier-health.js';
import type { ProxyConfig } from './config.js';
import { createPortal } from './create-portal.js';
import { createDialer } from './create-dialer.js';
import { createSource, loadCluster } from './create-source.js';
import { descriptorBudget } from './core/descriptor-budget.js';
import { readOpenFileLimit, warnOnLowOpenFileLimit } from './fd-limit.js';
import { followProxier, startHealthServer } from './io/http/healthz.js';
import { HttpServer, sendJson } from './io/http/http-server.js';
import { attachMetrics } from './io/http/metrics.js';
import { ServiceHealthServer, healthCheckHosts } from './io/http/service-health.js';
import { EventRecorder } from './io/kube/event-recorder.js';
import { UdpReceiveBuffers } from './io/net/udp-receive-buffers.js';
import { systemNodeAddresses } from './io/portal/node-addresses.js';
import { startLocalNames, type LocalNames } from './local-names.js';
import type { Logger } from './log.js';
import { Proxier } from './proxier/proxier.js';
import { LocalUnitSet } from './proxier/unit-set.js';
import { proxySocketFactory } from './proxy-sockets.js';
import type { Portal } from './seams/portal.js';
import type { UnitSet } from './seams/unit-set.js';
import { createWorkerPool, resolveWorkers, sweepIntervalMs } from './start-workers.js';
import type { HttpKubeApi } from './io/kube/api-client.js';
import type { EarlyStateRead } from './io/kube/state-file-read.js';
import { VERSION } from './version.js';

/** A running proxy: what main and the demo hold on to. */
export interface RunningProxy {
  proxier: Proxier;
  /** The sockets: what listens and what is proxied now. */
  units: UnitSet;
  portal: Portal;
  /** Where the admin server (/services, /metrics) listens. */
  adminAddress: string;
  /** Where /healthz and /livez are served. */
  healthzAddress: string;
  health: ProxierHealth;
  /** Service names: the directory, the DNS responder and the hosts-file block, when asked for. */
  names: LocalNames;
  /** Connections open now, node-wide: with workers, asked of each (their reports lag up to a second). */
  activeConnectionsNow(): Promise<number>;
  /**
   * Stop accepting, let connections finish for the grace period (or until `endGrace` is aborted),
   * cut what remains, close everything.
   */
  stop(graceMs?: number, endGrace?: AbortSignal, opts?: StopOptions): Promise<{ cut: number }>;
  /**
   * A successor serves the same addresses (--handover-socket): stop accepting everywhere at once
   * (proxy, health, admin and DNS listeners), let connections finish for the grace period. The
   * portal and the hosts-file block are the successor's now: left as they are.
   */
  retire(graceMs?: number): Promise<{ cut: number }>;
}

export interface StopOptions {
  /**
   * Asked once the drain is over: whether another proxy serves the node now (one started during
   * the drain, --handover-socket). Its hosts-file block is then left in place.
   */
  otherServes?: () => Promise<boolean>;
}

/** Where a hold episode (demand for a Service without endpoints) is made visible. */
interface Demand {
  /** Set once the API source is built, with --emit-events. */
  events?: EventRecorder;
}

/** Runs what was started so far in reverse order, past failures: a failed start leaves nothing behind. */
class Started {
  private readonly closers: Array<() => Promise<unknown>> = [];

  add(close: () => Promise<unknown>): void {
    this.closers.push(close);
  }

  async closeAll(): Promise<void> {
    for (const close of this.closers.splice(0).reverse()) await close().catch(() => undefined);
  }
}

/** A server that cannot listen is one line naming its flag and address, not a stack. */
async function listenOrExplain<T>(flag: string, address: { host: string; port: number }, listen: () => Promise<T>): Promise<T> {
  try {
    return await listen();
  } catch (err) {
    const code = errnoCode(err);
    const why = code === 'EADDRINUSE' ? 'the address is in use by another process' : code === 'EADDRNOTAVAIL' ? 'the address is not local to this node' : code === 'EACCES' ? 'permission denied' : err instanceof Error ? err.message : String(err);
    throw new ProxyError('STARTUP', `${flag} ${hostPort(address)}: cannot listen: ${why}`, { cause: err });
  }
}

/**
 * Builds and starts every part from a validated config: the composition root's working half.
 * A failure at any step closes what had started and rejects with one line (ProxyError STARTUP).
 */
export interface StartOptions {
  /** Taking over from this running process (--handover-socket): /readyz says 503 until told it serves. */
  takingOverFrom?: number;
  /** The `--state` file's read, begun as the process started (main.ts). */
  earlyStateRead?: EarlyStateRead;
}

export async function startProxy(config: ProxyConfig, logger: Logger, opts: StartOptions = {}): Promise<RunningProxy> {
  const started = new Started();
  try {
    return await start(config, logger, started, opts);
  } catch (err) {
    await started.closeAll();
    throw err;
  }
}

async function start(config: ProxyConfig, logger: Logger, started: Started, opts: StartOptions): Promise<RunningProxy> {
  const portal = await createPortal(config, logger);
  // As kube-proxy's GetHostname: trimmed and lower-cased, to match the Node's name.
  const nodeName = (config.hostnameOverride ?? hostname()).trim().toLowerCase();
  // Sizes every UDP listener's receive buffer; metrics read its drop counts at scrape time.
  const receiveBuffers = new UdpReceiveBuffers({ logger });
  // Read before anything is open: out of descriptors, even /proc/self/limits cannot be read.
  const limit = readOpenFileLimit();
  const budget = descriptorBudget(limit === undefined ? Infinity : Math.min(limit.soft, limit.hard));
  if (budget.maxListeners !== Infinity) logger.debug({ ...budget }, 'open files: listening sockets bounded so that connections keep theirs');
  // Before anything is started: no cluster to be found is one line and exit 2. The source and the
  // port-forward dialer share it (one kubeconfig, one set of credentials).
  const cluster = config.stateFile ? undefined : await loadCluster(config, { logger });
  const dialer = await createDialer(config, logger, cluster);
  started.add(async () => dialer.close());
  const demand: Demand = {};
  // --workers N >= 2: the sockets live in worker processes, launched once the source is found.
  const workers = resolveWorkers(config.workers);
  const reusePort = config.handoverSocket !== undefined;
  const needPods = (servicePort: string): void => demand.events?.needPods(servicePort);
  const pool = workers > 1 ? await createWorkerPool(config, workers, logger, needPods) : undefined;
  const local = pool ? undefined : new LocalUnitSet({
    logger,
    balancerFactory: (deps) => new RoundRobinBalancer({ ...deps, outlier: config.outlier }),
    // --handover-socket: a successor binds every address beside ours (SO_REUSEPORT) before we close.
    socketFactory: proxySocketFactory({ ...config, reusePort }, logger, receiveBuffers, (unit) => needPods(unit.servicePort), dialer),
    portAllocator: new PortAllocator(config.proxyPortRange, Math.random),
    clock: systemClock,
    random: Math.random,
    bindAddress: config.bindAddress,
    sweepIntervalMs: sweepIntervalMs(config),
    maxListeners: budget.maxListeners,
  });
  const units: UnitSet = pool ?? (local as LocalUnitSet);
  const proxier = new Proxier({
    portal,
    units,
    logger,
    clock: systemClock,
    random: Math.random,
    node: { name: nodeName },
    minSyncPeriodMs: config.minSyncPeriodMs,
    syncPeriodMs: config.syncPeriodMs,
    ...(dialer.reach ? { reach: dialer.reach } : {}),
  });
  started.add(() => proxier.shutdown(0));
  const health = new ProxierHealth(2 * config.syncPeriodMs, { clock: systemClock, wallNow: Date.now });
  if (opts.takingOverFrom !== undefined) health.setTakingOver(opts.takingOverFrom);
  // Before anything is started: a bad flag or no cluster to be found is one line and exit 2.
  const onApi = (api: HttpKubeApi): void => {
    if (!config.emitEvents) return;
    const events = new EventRecorder({ api, logger, node: nodeName, serviceUid: (ns, name) => proxier.cache.service(`${ns}/${name}`)?.metadata?.uid });
    demand.events = events;
    started.add(async () => events.stop());
  };
  const source = await createSource(config, { logger, nodeName, onNode: (node) => health.setNode(node), onApi, ...(cluster ? { cluster } : {}), ...(opts.earlyStateRead ? { earlyStateRead: opts.earlyStateRead } : {}) });
  await portal.start();
  if (pool) {
    await pool.launch();
    started.add(() => pool.shutdown(0));
  }
  // Health and metrics follow the loop's events, as kube-proxy's trackers do.
  followProxier(health, proxier);
  const admin = new HttpServer(logger.child({ component: 'admin' }));
  admin.route('/services', async (_req, res) => {
    await units.refresh();
    sendJson(res, 200, { version: VERSION, portal: portal.mode, node: proxier.node.name, services: proxier.status() });
  });
  const workerFigures = pool ? await import('./io/http/worker-metrics.js') : undefined;
  const metrics = pool && workerFigures
    ? attachMetrics(admin, { events: proxier, read: () => pool.readStats() }, { renderMore: () => workerFigures.renderWorkerMetrics(pool) })
    : attachMetrics(admin, { events: proxier, stats: () => units.stats() }, { kernelCounters: receiveBuffers });
  if (pool && workerFigures) workerFigures.attachWorkerFigures(admin, pool);
  const serviceHealth = new ServiceHealthServer({ hosts: healthCheckHosts(config.portal, config.nodePortAddresses, systemNodeAddresses), logger, proxyHealthy: () => health.isHealthy(), reusePort });
  started.add(() => serviceHealth.close());
  proxier.onSync((e) => void serviceHealth.sync(e.serviceHealth));
  warnOnLowOpenFileLimit(proxier, (msg, need) => logger.warn(need, msg));
  const adminBound = await listenOrExplain('--metrics-bind-address', config.metricsBindAddress, () => admin.listen(config.metricsBindAddress.host, config.metricsBindAddress.port, reusePort));
  started.add(() => admin.close());
  const healthz = await listenOrExplain('--healthz-bind-address', config.healthzBindAddress, () => startHealthServer({ host: config.healthzBindAddress.host, port: config.healthzBindAddress.port, health, logger, probes: metrics, reusePort }));
  started.add(() => healthz.server.close());
  const names = await startLocalNames(config, { events: proxier, units, portal, logger, ...(local ? { handOffs: local } : {}) }, listenOrExplain);
  started.add(() => names.stop());
  await source.start(proxier.sink);
  started.add(() => source.stop());
  await source.synced;
  await proxier.setSynced();
  // kube-proxy's configSyncPeriod: a resync from memory, not from the API server.
  const resync = setInterval(() => proxier.resync(), config.configSyncPeriodMs);
  resync.unref();
  const adminAddress = hostPort({ host: adminBound.address, port: adminBound.port });
  const healthzAddress = hostPort({ host: healthz.address.address, port: healthz.address.port });
  logger.info({ portal: portal.mode, node: nodeName, source: config.stateFile ?? 'kubernetes API', admin: adminAddress, healthz: healthzAddress, dns: names.dnsAddress, socks: names.socksAddress, workers }, 'kube-userspace-proxy started');
  return {
    proxier,
    units,
    portal,
    adminAddress,
    healthzAddress,
    health,
    names,
    async activeConnectionsNow() {
      if (pool) await pool.refreshFigures();
      return proxier.activeConnections();
    },
    async stop(graceMs = config.shutdownGracePeriodMs, endGrace?: AbortSignal, stopOpts?: StopOptions) {
      clearInterval(resync);
      await source.stop();
      // Health keeps answering through the grace period, so a liveness probe does not kill a
      // proxy that is draining; portal rules stay in place for the next start to take over.
      const result = await proxier.shutdown(graceMs, endGrace ? { endGrace } : undefined);
      demand.events?.stop();
      dialer.close();
      // The hosts-file block goes last: names keep resolving while connections drain. A proxy
      // started meanwhile (a normal start beside this draining one) has written the same block:
      // it stays for that one.
      const keepHostsBlock = await (stopOpts?.otherServes?.() ?? Promise.resolve(false)).catch(() => false);
      await Promise.all([admin.close(), healthz.server.close(), serviceHealth.close(), names.stop({ keepHostsBlock })]);
      return result;
    },
    async retire(graceMs = config.shutdownGracePeriodMs) {
      clearInterval(resync);
      await source.stop();
      const closed = Promise.all([admin.close(), healthz.server.close(), serviceHealth.close(), names.stop({ keepHostsBlock: true })]);
      // UDP sessions live on through sockets of their own, and queued datagrams are still served.
      const result = await proxier.shutdown(graceMs, { handOver: true });
      demand.events?.stop();
      dialer.close();
      await closed;
      return result;
    },
  };
}
