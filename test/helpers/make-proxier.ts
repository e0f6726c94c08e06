import type { BalancerFactory } from '../../src/core/balancer/load-balancer.js';
import { RoundRobinBalancer, roundRobinFactory } from '../../src/core/balancer/round-robin.js';
import { systemClock } from '../../src/core/clock.js';
import { LoopbackPortal } from '../../src/io/portal/loopback-portal.js';
import type { Clock, RandomSource } from '../../src/core/clock.js';
import type { NodeInfo } from '../../src/core/model.js';
import { PortAllocator } from '../../src/core/port-allocator.js';
import type { Logger } from '../../src/log.js';
import { silentLogger } from '../../src/log.js';
import { Proxier, type ProxierOptions } from '../../src/proxier/proxier.js';
import { LocalUnitSet, type ProxySocketFactory } from '../../src/proxier/unit-set.js';
import type { Portal } from '../../src/seams/portal.js';

/** The parts a proxy in one process is built from, as the composition root builds them. */
export interface ProxierParts {
  portal: Portal;
  logger: Logger;
  balancerFactory: BalancerFactory;
  socketFactory: ProxySocketFactory;
  portAllocator: PortAllocator;
  clock: Clock;
  random: RandomSource;
  node: NodeInfo;
  minSyncPeriodMs: number;
  syncPeriodMs: number;
  sweepIntervalMs: number;
  bindAddress: string;
}

/**
 * Parts for a loop over fake sockets that decide nothing by chance or by the clock: a fixed random
 * source and proxy-port pick, time standing at 0, syncs at once, node `node-a`.
 */
export function fixedParts(portal: Portal, socketFactory: ProxySocketFactory): ProxierParts {
  return {
    portal,
    logger: silentLogger(),
    balancerFactory: roundRobinFactory,
    socketFactory,
    portAllocator: new PortAllocator(undefined, () => 0.5),
    clock: { now: () => 0 },
    random: () => 0.5,
    node: { name: 'node-a' },
    minSyncPeriodMs: 0,
    syncPeriodMs: 30_000,
    sweepIntervalMs: 1000,
    bindAddress: '0.0.0.0',
  };
}

/** A sync loop over a unit set of this process's sockets, wired as src/app.ts wires them. */
export function makeProxier(p: ProxierParts, loop: Pick<ProxierOptions, 'syncRetryMs'> = {}): { proxier: Proxier; units: LocalUnitSet } {
  const units = new LocalUnitSet({
    logger: p.logger,
    balancerFactory: p.balancerFactory,
    socketFactory: p.socketFactory,
    portAllocator: p.portAllocator,
    clock: p.clock,
    random: p.random,
    bindAddress: p.bindAddress,
    sweepIntervalMs: p.sweepIntervalMs,
  });
  const proxier = new Proxier({ portal: p.portal, units, logger: p.logger, clock: p.clock, random: p.random, node: p.node, minSyncPeriodMs: p.minSyncPeriodMs, syncPeriodMs: p.syncPeriodMs, ...loop });
  return { proxier, units };
}

/** A sync loop over this process's sockets on the loopback portal, syncing at once. */
export function loopbackProxier(logger: Logger, socketFactory: ProxySocketFactory, portal: Portal = new LoopbackPortal()): ReturnType<typeof makeProxier> {
  return makeProxier({
    portal,
    logger,
    balancerFactory: (deps) => new RoundRobinBalancer(deps),
    socketFactory,
    portAllocator: new PortAllocator(undefined, Math.random),
    clock: systemClock,
    random: Math.random,
    node: { name: 'n' },
    minSyncPeriodMs: 0,
    syncPeriodMs: 60_000,
    sweepIntervalMs: 50,
    bindAddress: '127.0.0.1',
  });
}
