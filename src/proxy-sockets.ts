import { systemClock } from './core/clock.js';
import { RateLimiter } from './core/rate-limiter.js';
import type { ProxyUnit } from './core/units.js';
import { DirectDialer } from './io/net/direct-dialer.js';
import { HoldBudget } from './io/net/hold-budget.js';
import { TcpProxySocket } from './io/net/tcp-proxy.js';
import { UdpProxySocket } from './io/net/udp-proxy.js';
import type { UdpReceiveBuffers } from './io/net/udp-receive-buffers.js';
import type { Logger } from './log.js';
import type { ProxySocketFactory } from './proxier/unit-set.js';
import type { ProxySocket } from './seams/proxy-socket.js';
import type { CreatedDialer } from './create-dialer.js';

export interface ProxySocketSettings {
  udpIdleTimeoutMs: number;
  /** UDP sessions per service port in this process. */
  maxUdpSessions: number;
  /** Set in worker processes, which share every listening address with their siblings. */
  reusePort?: boolean;
  /** `--tcp-keepalive` on both legs, `--tcp-idle-timeout`. */
  tcpKeepAliveMs: number;
  tcpIdleTimeoutMs: number;
  /** Bounds on connections held by hold-when-empty, in this process. */
  holdMaxPerServicePort: number;
  holdMaxPerNode: number;
}

/**
 * The TCP and UDP proxy sockets of a unit set: the controller's own (`--workers 1`) or a worker's.
 * `onHoldEpisode` is told when a port starts holding connections for want of endpoints (demand:
 * the controller turns it into a NeedPods Event with --emit-events).
 */
export function proxySocketFactory(settings: ProxySocketSettings, logger: Logger, receiveBuffers: UdpReceiveBuffers, onHoldEpisode?: (unit: ProxyUnit) => void, created?: Pick<CreatedDialer, 'dialer' | 'dialTimeoutsMs'>): ProxySocketFactory {
  // The direct dialer unless one was made for the controller's own unit set (--dialer port-forward).
  const dialer = created?.dialer ?? new DirectDialer({ keepAliveMs: settings.tcpKeepAliveMs });
  const dialTimeouts = created?.dialTimeoutsMs ? { dialTimeoutsMs: created.dialTimeoutsMs } : {};
  const reusePort = settings.reusePort ?? false;
  const holdBudget = new HoldBudget(settings.holdMaxPerServicePort, settings.holdMaxPerNode);
  // Many Services scaled to zero can start episodes every hold period: said at most every 10 s.
  const holdLines = new RateLimiter(10_000, systemClock.now);
  return (unit, balancer, stats): ProxySocket => {
    const hold = {
      ...(unit.holdWhenEmptyMs === undefined ? {} : { holdWhenEmptyMs: unit.holdWhenEmptyMs }),
      onHoldEpisode: () => {
        const suppressed = holdLines.take();
        if (suppressed !== undefined) logger.info({ component: 'hold', service: unit.id, suppressed }, `${unit.id}: no endpoints; holding connections until one appears`);
        onHoldEpisode?.(unit);
      },
    };
    // The sockets bind their own {component, service} child logger, and only when they first log.
    if (unit.protocol === 'UDP') {
      return new UdpProxySocket({ name: unit.id, balancer, logger, stats, idleTimeoutMs: settings.udpIdleTimeoutMs, maxSessions: settings.maxUdpSessions, receiveBuffers, reusePort, ...hold });
    }
    const proxyProtocol = unit.proxyProtocol !== undefined;
    return new TcpProxySocket({ name: unit.id, balancer, dialer, logger, stats, reusePort, keepAliveMs: settings.tcpKeepAliveMs, idleTimeoutMs: settings.tcpIdleTimeoutMs, holdBudget, proxyProtocol, portals: unit.portals, ...dialTimeouts, ...hold });
  };
}
