import { hostname } from 'node:os';
import { roundRobinFactory } from './core/balancer/round-robin.js';
import { systemClock } from './core/clock.js';
import { PortAllocator } from './core/port-allocator.js';
import type { ProxyConfig } from './config.js';
import { createPortal } from './io/portal/create-portal.js';
import { HttpServer, sendJson } from './io/http/http-server.js';
import { createSource } from './io/kube/create-source.js';
import { ServiceHealthServer, healthCheckHosts } from './io/http/service-health.js';
import { systemNodeAddresses } from './io/portal/node-addresses.js';
import { DirectDialer } from './io/net/direct-dialer.js';
import type { ProxySocket } from './io/net/proxy-socket.js';
import { TcpProxySocket } from './io/net/tcp-proxy.js';
import { UdpProxySocket } from './io/net/udp-proxy.js';
import type { Portal } from './io/portal/portal.js';
import type { Logger } from './log.js';
import { Proxier, hostPort, type ProxySocketFactory } from './proxier.js';
import { VERSION } from './cli.js';
import { ProxierHealth, followProxier, startHealthServer } from './io/http/healthz.js';
import { attachMetrics } from './io/http/metrics.js';
import { observeSink } from './observed-sink.js';
import { warnOnLowOpenFileLimit } from './fd-limit.js';

/** A running proxy: what main and the demo hold on to. */
export interface RunningProxy {
  proxier: Proxier;
  portal: Portal;
  /** Where the admin server (/services, /metrics) listens. */
  adminAddress: string;
  /** Where /healthz and /livez are served. */
  healthzAddress: string;
  health: ProxierHealth;
  /** Stop accepting, let connections finish for the grace period, close everything. */
  stop(graceMs?: number): Promise<{ cut: number }>;
}

function socketFactory(config: ProxyConfig, logger: Logger): ProxySocketFactory {
  const dialer = new DirectDialer({ keepAliveMs: config.tcpKeepAliveMs });
  return (unit, balancer, stats): ProxySocket => {
    // The sockets bind their own {component, service} child logger, and only when they first log.
    if (unit.protocol === 'UDP') {
      return new UdpProxySocket({ name: unit.id, balancer, logger, stats, idleTimeoutMs: config.udpIdleTimeoutMs, maxSessions: config.maxUdpSessions });
    }
    return new TcpProxySocket({ name: unit.id, balancer, dialer, logger, stats, keepAliveMs: config.tcpKeepAliveMs, idleTimeoutMs: config.tcpIdleTimeoutMs });
  };
}

/** Builds and starts every part from a validated config: the composition root's working half. */
export async function startProxy(config: ProxyConfig, logger: Logger): Promise<RunningProxy> {
  const portal = createPortal(config, logger);
  // As kube-proxy's GetHostname: trimmed and lower-cased, to match the Node's name.
  const nodeName = (config.hostnameOverride ?? hostname()).trim().toLowerCase();
  const proxier = new Proxier({
    portal,
    logger,
    balancerFactory: roundRobinFactory,
    socketFactory: socketFactory(config, logger),
    portAllocator: new PortAllocator(config.proxyPortRange, Math.random),
    clock: systemClock,
    random: Math.random,
    node: { name: nodeName },
    minSyncPeriodMs: config.minSyncPeriodMs,
    syncPeriodMs: config.syncPeriodMs,
    sweepIntervalMs: Math.max(10, Math.min(1000, Math.floor(config.udpIdleTimeoutMs / 4))),
    bindAddress: config.bindAddress,
  });
  const health = new ProxierHealth(2 * config.syncPeriodMs);
  // Before anything is started: a bad flag or no cluster to be found is one line and exit 2.
  const source = await createSource(config, { logger, nodeName, onNode: (node) => health.setNode(node) });
  await portal.start();
  const admin = new HttpServer(logger.child({ component: 'admin' }));
  admin.route('/services', (_req, res) => sendJson(res, 200, { version: VERSION, portal: portal.mode, node: proxier.node.name, services: proxier.status() }));
  const metrics = attachMetrics(admin, proxier);
  // Health and metrics see every change on its way into the proxier, as kube-proxy's trackers do.
  const sink = observeSink(metrics.wrapSink(proxier.sink), metrics, followProxier(health, proxier));
  const serviceHealth = new ServiceHealthServer({ hosts: healthCheckHosts(config.portal, config.nodePortAddresses, systemNodeAddresses), logger, proxyHealthy: () => health.isHealthy() });
  proxier.onSync.push(() => void serviceHealth.sync(proxier.serviceHealth()));
  warnOnLowOpenFileLimit(proxier, (msg, need) => logger.warn(need, msg));
  const adminBound = await admin.listen(config.metricsBindAddress.host, config.metricsBindAddress.port);
  const healthz = await startHealthServer({ host: config.healthzBindAddress.host, port: config.healthzBindAddress.port, health, logger, probes: metrics });
  await source.start(sink);
  await source.synced;
  await proxier.setSynced();
  // kube-proxy's configSyncPeriod: a resync from memory, not from the API server.
  const resync = setInterval(() => {
    proxier.cache.markAllDirty();
    proxier.requestSync();
  }, config.configSyncPeriodMs);
  resync.unref();
  const adminAddress = hostPort({ host: adminBound.address, port: adminBound.port });
  const healthzAddress = hostPort({ host: healthz.address.address, port: healthz.address.port });
  logger.info({ portal: portal.mode, node: nodeName, source: config.stateFile ?? 'kubernetes API', admin: adminAddress, healthz: healthzAddress }, 'kube-userspace-proxy started');
  return {
    proxier,
    portal,
    adminAddress,
    healthzAddress,
    health,
    async stop(graceMs = config.shutdownGracePeriodMs) {
      clearInterval(resync);
      await source.stop();
      // Health keeps answering through the grace period, so a liveness probe does not kill a
      // proxy that is draining; portal rules stay in place for the next start to take over.
      const result = await proxier.shutdown(graceMs);
      await Promise.all([admin.close(), healthz.server.close(), serviceHealth.close()]);
      return result;
    },
  };
}
