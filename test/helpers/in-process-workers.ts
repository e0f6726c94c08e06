import type { PortRange } from '../../src/core/port-allocator.js';
import { roundRobinFactory } from '../../src/core/balancer/round-robin.js';
import { systemClock } from '../../src/core/clock.js';
import { PortAllocator } from '../../src/core/port-allocator.js';
import { UdpReceiveBuffers } from '../../src/io/net/udp-receive-buffers.js';
import { silentLogger, type Logger } from '../../src/log.js';
import { LocalUnitSet } from '../../src/proxier/unit-set.js';
import { proxySocketFactory } from '../../src/proxy-sockets.js';
import type { FromWorker, ToWorker, WorkerHandle, WorkerLauncher } from '../../src/seams/workers.js';
import { WorkerServer } from '../../src/workers/worker-server.js';

/**
 * Worker "processes" inside the test's own process: each a real LocalUnitSet on real loopback
 * sockets (SO_REUSEPORT, as in a worker) and a real WorkerServer, behind a channel that copies
 * every message (structuredClone, as the IPC channel's serialization does) and delivers it on a
 * later tick. kill() ends one abruptly: its sockets close, its exit is reported.
 */
export interface InProcessWorker {
  index: number;
  pid: number;
  units: LocalUnitSet;
  dead: boolean;
  /** Ends it abruptly, as SIGKILL would: sockets closed, connections cut, exit reported. */
  crash(): void;
}

export class InProcessLauncher implements WorkerLauncher {
  readonly launched: InProcessWorker[] = [];
  private nextPid = 900_000;

  constructor(private readonly opts: {
    seed: number;
    proxyPortRange?: PortRange;
    logger?: Logger;
    maxUdpSessions?: number;
    /** Each message a worker receives, as it receives it. */
    onReceive?: (index: number, m: ToWorker) => void;
    /** Each time a worker brings the kernel's counters up to date (worker-main.ts reads /proc/net/udp then). */
    onRefreshCounters?: (index: number) => void;
  }) {}

  /** The worker now in `index`'s slot. */
  current(index: number): InProcessWorker {
    const w = [...this.launched].reverse().find((x) => x.index === index && !x.dead);
    if (w === undefined) throw new Error(`no live worker ${index}`);
    return w;
  }

  launch(index: number): WorkerHandle {
    const logger = this.opts.logger ?? silentLogger();
    const toWorker: Array<(m: ToWorker) => void> = [];
    const toController: Array<(m: FromWorker) => void> = [];
    const exits: Array<(code: number | null, signal: string | null) => void> = [];
    const serverRef: { current?: WorkerServer } = {};
    const units = new LocalUnitSet({
      logger,
      balancerFactory: roundRobinFactory,
      socketFactory: proxySocketFactory({ udpIdleTimeoutMs: 1000, maxUdpSessions: this.opts.maxUdpSessions ?? 100, reusePort: true, tcpKeepAliveMs: 15_000, tcpIdleTimeoutMs: 0, holdMaxPerServicePort: 100, holdMaxPerNode: 1000 }, logger, new UdpReceiveBuffers({ logger, sharedAddresses: true })),
      portAllocator: new PortAllocator(this.opts.proxyPortRange, Math.random),
      clock: systemClock,
      random: Math.random,
      bindAddress: '127.0.0.1',
      sweepIntervalMs: 50,
      shared: { seed: this.opts.seed, worker: index, onStickyChange: () => serverRef.current?.stickyChanged() },
    });
    const worker: InProcessWorker = { index, pid: ++this.nextPid, units, dead: false, crash: () => die(null, 'SIGKILL') };
    this.launched.push(worker);
    const die = (code: number | null, signal: string | null): void => {
      if (worker.dead) return;
      worker.dead = true;
      void units.shutdown(0).then(() => {
        for (const l of exits) l(code, signal);
      });
    };
    const server = new WorkerServer({
      channel: {
        send: (m, done) => {
          if (worker.dead) return;
          const copy = structuredClone(m);
          setImmediate(() => {
            if (!worker.dead) for (const l of toController) l(copy);
            done?.();
          });
        },
        onMessage: (l) => toWorker.push(l),
      },
      units,
      logger,
      refreshCounters: async () => this.opts.onRefreshCounters?.(index),
      exit: (code) => die(code, null),
      stickyFlushMs: 1,
    });
    serverRef.current = server;
    setImmediate(() => server.ready());
    return {
      pid: worker.pid,
      send: (m) => {
        if (worker.dead) return;
        const copy = structuredClone(m);
        setImmediate(() => {
          if (worker.dead) return;
          this.opts.onReceive?.(index, copy);
          for (const l of toWorker) l(copy);
        });
      },
      onMessage: (l) => toController.push(l),
      onExit: (l) => exits.push(l),
      kill: (signal) => die(null, signal),
    };
  }
}
