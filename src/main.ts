#!/usr/bin/env node
import { enableProxyCompileCache } from './compile-cache.js';
import { heapTuningEnv } from './core/heap-tuning.js';

/**
 * The `kube-userspace-proxy` binary. Before anything else is loaded it re-executes itself, once,
 * with glibc's heap settings for bulk traffic when they are not in the environment yet (see
 * core/heap-tuning.ts): same PID, same arguments, the settings added. Then the command runs.
 */
const tuned = heapTuningEnv(process.platform, process.env);
// Not under a debugger (--inspect-brk would stop twice, and the re-executed process loses it).
const debugging = process.execArgv.some((a) => a.startsWith('--inspect'));
if (tuned !== undefined && !debugging && typeof process.execve === 'function') {
  try {
    process.execve(process.execPath, [process.execPath, ...process.execArgv, ...process.argv.slice(1)], tuned);
  } catch (err) {
    // Only argument checks throw: on Node 24 a failed execve(2) itself aborts the process (it
    // throws from Node 26 on), which for the running node's own binary does not happen.
    process.stderr.write(`kube-userspace-proxy: could not re-execute with the heap settings for bulk traffic (${String(err)}); running without them\n`);
  }
}
enableProxyCompileCache();
const { runCommand } = await import('./command.js');
await runCommand(process.argv.slice(2));
