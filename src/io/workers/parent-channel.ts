import type { FromWorker, ToWorker, WorkerChannel } from '../../seams/workers.js';

/**
 * A worker's channel to its controller: the IPC channel fork() opened. `onGone` runs when it
 * closes (the controller exited, or was killed with SIGKILL): the worker must not serve on alone.
 */
export function parentChannel(onGone: () => void): WorkerChannel {
  const send = process.send?.bind(process);
  if (send === undefined) throw new Error('a worker must be started by the controller (no IPC channel)');
  process.once('disconnect', onGone);
  return {
    send: (message: FromWorker, done?: () => void) => {
      if (!process.connected) return;
      send(message, undefined, {}, done === undefined ? undefined : () => done());
    },
    onMessage: (listener) => process.on('message', (m) => listener(m as ToWorker)),
  };
}
