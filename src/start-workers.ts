import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import { systemClock } from './core/clock.js';
import type { ProxyConfig } from './config.js';
import type { Logger } from './log.js';
import type { WorkerInit } from './seams/workers.js';
import type { WorkerPool } from './workers/worker-pool.js';

/** `--workers`: `auto` is one per core this process may run on. */
export function resolveWorkers(workers: ProxyConfig['workers']): number {
  return workers === 'auto' ? availableParallelism() : workers;
}

/** How often the one coarse sweep runs: a quarter of the UDP idle timeout, within 10 ms to 1 s. */
export function sweepIntervalMs(config: Pick<ProxyConfig, 'udpIdleTimeoutMs'>): number {
  return Math.max(10, Math.min(1000, Math.floor(config.udpIdleTimeoutMs / 4)));
}

/** What worker `index` of `workers` is started with. */
export function workerInit(config: ProxyConfig, workers: number, seed: number, index: number): WorkerInit {
  return {
    index,
    workers,
    seed,
    logLevel: config.logLevel,
    bindAddress: config.bindAddress,
    ...(config.proxyPortRange === undefined ? {} : { proxyPortRange: config.proxyPortRange }),
    udpIdleTimeoutMs: config.udpIdleTimeoutMs,
    // --max-udp-sessions is the node's: each worker holds its share.
    maxUdpSessions: Math.ceil(config.maxUdpSessions / workers),
    sweepIntervalMs: sweepIntervalMs(config),
    tcpKeepAliveMs: config.tcpKeepAliveMs,
    tcpIdleTimeoutMs: config.tcpIdleTimeoutMs,
    outlier: config.outlier,
    // The node's bounds, shared among the workers.
    holdMaxPerServicePort: Math.ceil(config.holdMaxPerServicePort / workers),
    holdMaxPerNode: Math.ceil(config.holdMaxPerNode / workers),
  };
}

/**
 * The worker pool of `--workers N` (N >= 2), not yet launched. Its modules load only then: a
 * one-process start-up does not pay for them.
 */
export async function createWorkerPool(config: ProxyConfig, workers: number, logger: Logger, onNeedPods?: (servicePort: string) => void): Promise<WorkerPool> {
  const [{ ForkLauncher }, { WorkerPool }] = await Promise.all([import('./io/workers/fork-launcher.js'), import('./workers/worker-pool.js')]);
  // The same in every worker of this run, different at every start and on every node.
  const seed = Math.floor(Math.random() * 0x1_0000_0000);
  const launcher = new ForkLauncher({
    entry: fileURLToPath(new URL('./worker-main.js', import.meta.url)),
    init: (index) => workerInit(config, workers, seed, index),
  });
  return new WorkerPool({ size: workers, launcher, logger, clock: systemClock, random: Math.random, ...(onNeedPods ? { onNeedPods } : {}) });
}
