import type { OutlierPolicy } from '../core/balancer/outlier.js';
import type { PortRange } from '../core/port-allocator.js';
import type { WorkerReport } from '../core/worker-stats.js';
import type { UnitStickyUpdates } from './affinity-share.js';
import type { UnitBatch, UnitBatchResult, UnitStatus } from './unit-set.js';

/**
 * Worker processes (`--workers N`): one controller owns the source, the sync loop, the portal,
 * health and metrics; N workers own the data path, each listening on every service port with
 * SO_REUSEPORT. What crosses between them is plain data over the IPC channel.
 */

/** What a worker is started with (its one command-line argument, as JSON). */
export interface WorkerInit {
  /** 0..workers-1; a replacement takes the index of the worker it replaces. */
  index: number;
  workers: number;
  /** The node's seed for shared balancing decisions (core/balancer/shared-order.ts). */
  seed: number;
  logLevel: string;
  bindAddress: string;
  proxyPortRange?: PortRange;
  udpIdleTimeoutMs: number;
  /** This worker's share of `--max-udp-sessions`. */
  maxUdpSessions: number;
  sweepIntervalMs: number;
  /** `--tcp-keepalive` and `--tcp-idle-timeout`. */
  tcpKeepAliveMs: number;
  tcpIdleTimeoutMs: number;
  /** `--outlier-*`: passive health, per worker. */
  outlier: OutlierPolicy;
  /** This worker's share of the hold bounds. */
  holdMaxPerServicePort: number;
  holdMaxPerNode: number;
}

/** Controller to worker. Requests carry an `id` their reply repeats. */
export type ToWorker =
  /** Apply a batch (the first one a new worker gets is every running unit). */
  | { t: 'apply'; id: number; batch: UnitBatch }
  /** Start the coarse sweep (the sync loop has done its first sync). */
  | { t: 'start' }
  /**
   * `ack`: the round of the last report the controller received (0: none from this process).
   * `kernel`: read the kernel's counters first (UDP receive-buffer drops: /proc/net/udp), for a scrape.
   */
  | { t: 'report'; id: number; ack: number; kernel: boolean }
  | { t: 'status'; id: number }
  /** Sticky entries a sibling made or used. */
  | { t: 'sticky'; updates: UnitStickyUpdates[] }
  /** Every live sticky entry, for a new sibling. */
  | { t: 'stickyDump'; id: number }
  /** Stop accepting, drain for up to `graceMs`, cut the rest, report, exit. `handOver`: UnitSet.shutdown's. */
  | { t: 'shutdown'; id: number; graceMs: number; ack: number; handOver?: boolean }
  /** The shutdown's grace period ends now (the controller got a second signal): cut what remains. */
  | { t: 'endGrace' };

/** Worker to controller. */
export type FromWorker =
  | { t: 'ready' }
  | { t: 'applied'; id: number; result: UnitBatchResult; listeners: number; listenersFailed: number }
  | { t: 'report'; id: number; report: WorkerReport }
  | { t: 'status'; id: number; status: UnitStatus[] }
  | { t: 'sticky'; updates: UnitStickyUpdates[] }
  | { t: 'stickyDump'; id: number; updates: UnitStickyUpdates[] }
  /** A hold episode began on this service port (`ns/name:port`): the controller may post a NeedPods Event. */
  | { t: 'needPods'; servicePort: string }
  | { t: 'shutdown'; id: number; cut: number; report: WorkerReport }
  /** A request failed in the worker (a bug): the message says why. */
  | { t: 'failed'; id: number; message: string };

/** The controller's handle on one worker process. */
export interface WorkerHandle {
  readonly pid: number | undefined;
  /** Queued in order; dropped once the process is gone (its exit is reported). */
  send(message: ToWorker): void;
  onMessage(listener: (message: FromWorker) => void): void;
  /** Once, when the process has exited (or could not start: code and signal null). */
  onExit(listener: (code: number | null, signal: string | null) => void): void;
  kill(signal: NodeJS.Signals): void;
}

export interface WorkerLauncher {
  launch(index: number): WorkerHandle;
}

/** A worker's side of the channel. */
export interface WorkerChannel {
  /** `done`: once the message has been handed to the channel. */
  send(message: FromWorker, done?: () => void): void;
  onMessage(listener: (message: ToWorker) => void): void;
}

/** One worker slot as /workers and the per-worker metrics show it. */
export interface WorkerFigures {
  worker: number;
  pid: number | null;
  /** starting: forked; catching-up: applying the running units; ready: serving and synced; down: exited, a replacement due. */
  state: 'starting' | 'catching-up' | 'ready' | 'down';
  /** Times this slot's process was replaced. */
  restarts: number;
  /** Seconds the current process has run (0 when down). */
  uptimeSeconds: number;
  /** Counters over this slot's processes so far, as of their last reports. */
  connectionsAccepted: number;
  bytesToEndpoint: number;
  bytesToClient: number;
  udpDatagrams: number;
  udpSessionsCreated: number;
  /** Connections and sessions open in the current process, as last reported. */
  active: number;
}
