import { pino, type LevelWithSilent } from 'pino';
import { RoundRobinBalancer } from './core/balancer/round-robin.js';
import { systemClock } from './core/clock.js';
import { PortAllocator } from './core/port-allocator.js';
import { UdpReceiveBuffers } from './io/net/udp-receive-buffers.js';
import { parentChannel } from './io/workers/parent-channel.js';
import { createLogger } from './log.js';
import { descriptorBudget } from './core/descriptor-budget.js';
import { readOpenFileLimit } from './fd-limit.js';
import { LocalUnitSet } from './proxier/unit-set.js';
import { proxySocketFactory } from './proxy-sockets.js';
import type { WorkerInit } from './seams/workers.js';
import { WorkerServer } from './workers/worker-server.js';

/**
 * A worker process (`--workers N`): the composition root of the data path alone. It runs the
 * units the controller sends on sockets of its own, bound with SO_REUSEPORT beside its siblings',
 * and answers over the IPC channel. Signals are the controller's business: SIGTERM, SIGINT and
 * SIGHUP (which a terminal's Ctrl-C and its closing send the whole process group) are ignored
 * here; the controller drains the workers. When the channel closes (the controller is gone) the
 * worker exits at once.
 */
function listenerBudget(): number {
  const limit = readOpenFileLimit();
  return descriptorBudget(limit === undefined ? Infinity : Math.min(limit.soft, limit.hard)).maxListeners;
}

const init = JSON.parse(process.argv[2] ?? '{}') as WorkerInit;
// One write per line: the workers and the controller share stdout, and a line written whole is
// never interleaved with another process's.
const logger = createLogger(init.logLevel as LevelWithSilent, pino.destination({ fd: 1, sync: true })).child({ worker: init.index });

process.on('SIGTERM', () => undefined);
process.on('SIGINT', () => undefined);
process.on('SIGHUP', () => undefined);

const channel = parentChannel(() => {
  logger.warn('the controller is gone: exiting');
  process.exit(1);
});
const receiveBuffers = new UdpReceiveBuffers({ logger, sharedAddresses: true });
// The units tell the server of sticky news; the server is made after them.
const serverRef: { current?: WorkerServer } = {};
const units = new LocalUnitSet({
  logger,
  balancerFactory: (deps) => new RoundRobinBalancer({ ...deps, outlier: init.outlier }),
  socketFactory: proxySocketFactory({ udpIdleTimeoutMs: init.udpIdleTimeoutMs, maxUdpSessions: init.maxUdpSessions, reusePort: true, tcpKeepAliveMs: init.tcpKeepAliveMs, tcpIdleTimeoutMs: init.tcpIdleTimeoutMs, holdMaxPerServicePort: init.holdMaxPerServicePort, holdMaxPerNode: init.holdMaxPerNode }, logger, receiveBuffers, (unit) => channel.send({ t: 'needPods', servicePort: unit.servicePort })),
  portAllocator: new PortAllocator(init.proxyPortRange, Math.random),
  clock: systemClock,
  random: Math.random,
  bindAddress: init.bindAddress,
  sweepIntervalMs: init.sweepIntervalMs,
  // Each worker has its own open-file limit, read before it opens anything.
  maxListeners: listenerBudget(),
  shared: { seed: init.seed, worker: init.index, onStickyChange: () => serverRef.current?.stickyChanged() },
});
const server = new WorkerServer({
  channel,
  units,
  logger,
  refreshCounters: () => receiveBuffers.refresh(),
  exit: (code) => process.exit(code),
});
serverRef.current = server;
server.ready();
