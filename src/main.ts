#!/usr/bin/env node
import { enableProxyCompileCache } from './compile-cache.js';
import { definedEnv, heapTuningEnv, heapTuningFlags, underDebugger } from './core/heap-tuning.js';
import { beginEarlyStateRead } from './io/kube/state-file-read.js';
import { stateArgument } from './state-argument.js';

/**
 * The `kube-userspace-proxy` binary. Before anything else is loaded it re-executes itself, once,
 * with glibc's heap settings for bulk traffic and V8's young-generation size when they are not
 * in the environment and on the command line yet (see core/heap-tuning.ts): same PID, same
 * arguments, the settings added. Then the command runs.
 */
const tunedEnv = heapTuningEnv(process.platform, process.env);
const tunedFlags = heapTuningFlags(process.execArgv, process.env.NODE_OPTIONS);
// Not under a debugger (--inspect-brk would stop twice, and the re-executed process loses it).
const debugging = underDebugger(process.execArgv, process.env.NODE_OPTIONS);
if ((tunedEnv !== undefined || tunedFlags.length > 0) && !debugging && typeof process.execve === 'function') {
  try {
    process.execve(process.execPath, [process.execPath, ...process.execArgv, ...tunedFlags, ...process.argv.slice(1)], tunedEnv ?? definedEnv(process.env));
  } catch (err) {
    // Only argument checks throw: on Node 24 a failed execve(2) itself aborts the process (it
    // throws from Node 26 on), which for the running node's own binary does not happen.
    process.stderr.write(`kube-userspace-proxy: could not re-execute with the heap settings (glibc's for bulk traffic, V8's young generation) (${String(err)}); running without them\n`);
  }
}

enableProxyCompileCache();
// The state file is read while the modules below load (io/kube/state-file-read.ts).
const statePath = stateArgument(process.argv.slice(2));
const earlyStateRead = statePath === undefined ? undefined : beginEarlyStateRead(statePath);
const { runCommand } = await import('./command.js');
await runCommand(process.argv.slice(2), earlyStateRead === undefined ? {} : { earlyStateRead });
