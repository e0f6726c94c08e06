import { DirectDialer } from './io/net/direct-dialer.js';
import { TcpProxySocket } from './io/net/tcp-proxy.js';
import { UdpProxySocket } from './io/net/udp-proxy.js';
import type { UdpReceiveBuffers } from './io/net/udp-receive-buffers.js';
import type { Logger } from './log.js';
import type { ProxySocketFactory } from './proxier/unit-set.js';
import type { ProxySocket } from './seams/proxy-socket.js';

export interface ProxySocketSettings {
  udpIdleTimeoutMs: number;
  /** UDP sessions per service port in this process. */
  maxUdpSessions: number;
  /** Set in worker processes, which share every listening address with their siblings. */
  reusePort?: boolean;
  /** `--tcp-keepalive` on both legs, `--tcp-idle-timeout`. */
  tcpKeepAliveMs: number;
  tcpIdleTimeoutMs: number;
}

/** The TCP and UDP proxy sockets of a unit set: the controller's own (`--workers 1`) or a worker's. */
export function proxySocketFactory(settings: ProxySocketSettings, logger: Logger, receiveBuffers: UdpReceiveBuffers): ProxySocketFactory {
  const dialer = new DirectDialer({ keepAliveMs: settings.tcpKeepAliveMs });
  const reusePort = settings.reusePort ?? false;
  return (unit, balancer, stats): ProxySocket => {
    // The sockets bind their own {component, service} child logger, and only when they first log.
    if (unit.protocol === 'UDP') {
      return new UdpProxySocket({ name: unit.id, balancer, logger, stats, idleTimeoutMs: settings.udpIdleTimeoutMs, maxSessions: settings.maxUdpSessions, receiveBuffers, reusePort });
    }
    return new TcpProxySocket({ name: unit.id, balancer, dialer, logger, stats, reusePort, keepAliveMs: settings.tcpKeepAliveMs, idleTimeoutMs: settings.tcpIdleTimeoutMs });
  };
}
