import type { FromWorker, ToWorker, WorkerChannel } from '../../seams/workers.js';

/**
 * A worker's channel to its controller: the IPC channel fork() opened. `onGone` runs when it
 * closes (the controller exited, or was killed with SIGKILL), or a send finds it closed: the worker
 * must not serve on alone.
 */
export function parentChannel(onGone: () => void): WorkerChannel {
  const send = process.send?.bind(process);
  if (send === undefined) throw new Error('a worker must be started by the controller (no IPC channel)');
  let gone = false;
  const goneOnce = (): void => {
    if (gone) return;
    gone = true;
    onGone();
  };
  process.once('disconnect', goneOnce);
  // A send that meets the closed channel (EPIPE: the controller died between our check and the
  // write) is emitted here; unhandled, it would crash the worker with a stack instead of the line.
  process.on('error', goneOnce);
  return {
    send: (message: FromWorker, done?: () => void) => {
      if (!process.connected) return;
      send(message, undefined, {}, done === undefined ? undefined : () => done());
    },
    onMessage: (listener) => process.on('message', (m) => listener(m as ToWorker)),
  };
}
