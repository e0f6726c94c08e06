#!/usr/bin/env node
import cluster from 'node:cluster';

/**
 * Runs the proxy CLI in N worker processes that share its listening sockets (node:cluster): the
 * benchmark's stand-in for a `--workers N` mode of the proxy, to measure what several cores would
 * reach. Usage: node cluster-launcher.js N PROXY_MAIN [proxy flags...]
 *
 * SCHED_NONE: each worker accepts on the shared listening socket itself and the kernel spreads
 * the connections; the default round-robin would have this process accept every connection and
 * pass it to a worker over IPC, a cost per connection that is exactly what is being measured.
 * UDP sockets are shared the same way: each datagram goes to whichever worker reads it first, so
 * a client's datagrams may open a session in more than one worker (replies still leave from the
 * service address, through the shared socket).
 */

const [countArg, main, ...args] = process.argv.slice(2);
const count = Number(countArg);
if (!Number.isInteger(count) || count < 1 || !main) {
  console.error('usage: cluster-launcher.js N PROXY_MAIN [proxy flags...]');
  process.exit(2);
}

cluster.schedulingPolicy = cluster.SCHED_NONE;
cluster.setupPrimary({ exec: main, args });
for (let i = 0; i < count; i++) cluster.fork();

let stopping = false;
function stop(signal: NodeJS.Signals): void {
  stopping = true;
  for (const w of Object.values(cluster.workers ?? {})) w?.process.kill(signal);
}
process.on('SIGTERM', () => stop('SIGTERM'));
process.on('SIGINT', () => stop('SIGINT'));
cluster.on('exit', (worker, code, signal) => {
  if (!stopping) {
    // One worker gone means the set is not what was measured: stop them all, loudly.
    console.error(`cluster-launcher: worker ${worker.process.pid} exited (${signal ?? code}); stopping the others`);
    process.exitCode = 1;
    stop('SIGTERM');
  }
  if (Object.keys(cluster.workers ?? {}).length === 0) process.exit();
});
