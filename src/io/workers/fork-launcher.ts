import { fork } from 'node:child_process';
import type { FromWorker, ToWorker, WorkerHandle, WorkerInit, WorkerLauncher } from '../../seams/workers.js';

export interface ForkLauncherOptions {
  /** The worker's entry point (dist/bundle/worker-main.js, or dist/src/worker-main.js unbundled). */
  entry: string;
  /** What worker `index` is started with. */
  init(index: number): WorkerInit;
  /** Node's flags for the workers; default: the controller's own (a profiler, say, profiles them too). */
  execArgv?: string[];
}

/**
 * Worker processes as child_process.fork() children with an IPC channel (structured-clone
 * serialization). Not node:cluster: each worker binds its own sockets with SO_REUSEPORT, and the
 * controller passes no handles. The workers write their logs to the controller's stdout and
 * stderr; each exits as soon as its channel to the controller closes, so a controller killed
 * with SIGKILL leaves no worker behind.
 */
export class ForkLauncher implements WorkerLauncher {
  constructor(private readonly opts: ForkLauncherOptions) {}

  launch(index: number): WorkerHandle {
    const child = fork(this.opts.entry, [JSON.stringify(this.opts.init(index))], {
      serialization: 'advanced',
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      execArgv: this.opts.execArgv ?? process.execArgv,
    });
    const exitListeners: Array<(code: number | null, signal: string | null) => void> = [];
    let exited = false;
    const exit = (code: number | null, signal: string | null): void => {
      if (exited) return;
      exited = true;
      for (const l of exitListeners) l(code, signal);
    };
    child.once('exit', exit);
    // A process that could not be started emits 'error' and may never emit 'exit'. Once started,
    // errors are a send to a channel that just closed: its 'exit' follows.
    child.on('error', () => {
      if (child.pid === undefined) exit(null, null);
    });
    return {
      pid: child.pid,
      send: (message: ToWorker) => {
        if (child.connected) child.send(message);
      },
      onMessage: (listener) => child.on('message', (m) => listener(m as FromWorker)),
      onExit: (listener) => {
        exitListeners.push(listener);
      },
      kill: (signal) => {
        if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      },
    };
  }
}
