import { roundRobinFactory } from '../../src/core/balancer/round-robin.js';
import { systemClock } from '../../src/core/clock.js';
import { PortAllocator } from '../../src/core/port-allocator.js';
import { UdpReceiveBuffers } from '../../src/io/net/udp-receive-buffers.js';
import { silentLogger } from '../../src/log.js';
import { LocalUnitSet, type LocalUnitSetOptions } from '../../src/proxier/unit-set.js';
import { proxySocketFactory } from '../../src/proxy-sockets.js';

/**
 * A unit set on real sockets, as one process runs it (bound on 127.0.0.1, the system clock,
 * round-robin balancers); tests override what they are about. Shut it down when done.
 */
export function localUnitSet(over: Partial<LocalUnitSetOptions> = {}): LocalUnitSet {
  const logger = over.logger ?? silentLogger();
  return new LocalUnitSet({
    logger,
    balancerFactory: roundRobinFactory,
    socketFactory: proxySocketFactory({ udpIdleTimeoutMs: 1000, maxUdpSessions: 10, reusePort: false, tcpKeepAliveMs: 15_000, tcpIdleTimeoutMs: 0, holdMaxPerServicePort: 10, holdMaxPerNode: 10 }, logger, new UdpReceiveBuffers({ logger })),
    portAllocator: new PortAllocator(undefined, Math.random),
    clock: systemClock,
    random: Math.random,
    bindAddress: '127.0.0.1',
    sweepIntervalMs: 1000,
    ...over,
  });
}
