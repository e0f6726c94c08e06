import { flushCompileCache } from 'node:module';
import { startProxy } from './app.js';
import { createPortal } from './create-portal.js';
import { parseCommandLine } from './cli.js';
import { buildConfig } from './config.js';
import { ProxyError, UsageError } from './core/errors.js';
import { cleanupLocalNames } from './local-names.js';
import { completeTakeOver, serveHandover, takeOverIfRunning } from './handover.js';
import { answers } from './io/handover/handover-server.js';
import { createLogger } from './log.js';
import { resolveOptions, writeConfigFile } from './kube-proxy-config.js';
import type { EarlyStateRead } from './io/kube/state-file-read.js';

/** On SIGTERM, how long a successor mid-hand-over may take to serve before this process stops anyway. */
const SUCCESSOR_WAIT_MS = 60_000;
/** How long a successor that abandons a hand-over lets what it accepted finish before it exits. */
const ABANDON_DRAIN_MS = 5000;
/** What stops the proxy: SIGTERM (the kubelet), SIGINT (Ctrl-C), SIGHUP (its terminal closed). */
const STOP_SIGNALS: readonly NodeJS.Signals[] = ['SIGTERM', 'SIGINT', 'SIGHUP'];

/** What main.ts began before loading this module. */
export interface CommandStart {
  /** The `--state` file's read, begun while the modules loaded. */
  earlyStateRead?: EarlyStateRead;
}

/**
 * The command behind the `kube-userspace-proxy` binary (main.ts loads it): parses flags, builds
 * the parts, wires signals. The only place that sets process.exitCode. User errors print one line
 * without a stack and exit 2; bugs keep their stack.
 */
async function main(argv: string[], begun: CommandStart): Promise<number> {
  const outcome = parseCommandLine(argv);
  if (outcome.kind === 'exit') {
    (outcome.code === 0 ? process.stdout : process.stderr).write(outcome.output);
    return outcome.code;
  }
  const { options, warnings, origins } = await resolveOptions(outcome.options);
  const config = buildConfig(options, origins);
  const logger = createLogger(config.logLevel);
  for (const w of warnings) logger.warn(w);
  if (outcome.options.writeConfigTo !== undefined) {
    await writeConfigFile(outcome.options.writeConfigTo, config);
    return 0;
  }
  if (config.cleanup) {
    // As kube-proxy's, --cleanup with no mode named removes what any mode installed: the loopback
    // portal (the default) leaves nothing, so as root (the only user who could have installed
    // iptables chains or the bind interface) the node-level removal runs, which covers both modes.
    // `--portal loopback` named keeps it to the hosts-file block.
    const anyMode = options.portal === undefined && process.getuid?.() === 0;
    const portalConfig = anyMode ? { ...config, portal: 'iptables' as const } : config;
    // Both run, whichever fails: cleanup keeps going past a failure.
    const results = await Promise.allSettled([createPortal(portalConfig, logger).then((portal) => portal.cleanup()), cleanupLocalNames(config, logger)]);
    for (const r of results) if (r.status === 'rejected') throw r.reason;
    logger.info({ portal: config.portal, ...(portalConfig !== config ? { alsoRemoved: 'iptables chains and the bind interface' } : {}) }, 'cleanup done');
    return 0;
  }
  // The first SIGTERM, SIGINT or SIGHUP (the terminal closed) stops the proxy. A later one ends the
  // shutdown's grace period at once (what is still open is cut) and the shutdown goes on: Node's
  // default action would kill the process and leave the hosts-file block behind. Ours for good.
  const endGrace = new AbortController();
  let stopping: NodeJS.Signals | undefined;
  let handingOver = false;
  const signalled = new Promise<NodeJS.Signals>((resolve) => {
    const onSignal = (signal: NodeJS.Signals): void => {
      if (stopping === undefined) {
        stopping = signal;
        resolve(signal);
        return;
      }
      // Handed over, signals end the wait for the drain (below), never the drain itself.
      if (handingOver || endGrace.signal.aborted) return;
      logger.warn({ signal }, 'signalled again: the grace period ends now; connections still open are cut');
      endGrace.abort();
    };
    for (const s of STOP_SIGNALS) process.on(s, onSignal);
  });
  // --handover-socket: a running proxy hands over to this one (or refuses: one line, exit 1).
  const takeOver = await takeOverIfRunning(config, logger);
  // Start-up may wait a long time for an API server that does not answer: a signal then stops
  // the process at once (nothing has been accepted yet, so nothing is cut).
  const first = await Promise.race([startProxy(config, logger, { ...begun, ...(takeOver ? { takingOverFrom: takeOver.from.pid } : {}) }), signalled]).catch((err: unknown) => {
    // The old process never closed anything: it serves on.
    takeOver?.session.abandon();
    throw err;
  });
  if (typeof first === 'string') {
    takeOver?.session.abandon();
    logger.info({ signal: first }, 'stopped before the first sync');
    logger.flush();
    process.exit(0);
  }
  const proxy = first;
  if (takeOver !== undefined) {
    try {
      await completeTakeOver(takeOver, proxy, logger);
      proxy.health.setTakingOver(undefined);
    } catch (err) {
      // Not ready (a unit it serves does not listen here): the old process serves on, and is left
      // its portal and hosts-file block. What this one accepted meanwhile (seconds old) gets a few
      // seconds, not the grace period: until this process exits the kubelet cannot restart it,
      // and the old pod may be deleted meanwhile (its answers made the new pod ready). A signal
      // ends the wait.
      const drainMs = Math.min(ABANDON_DRAIN_MS, config.shutdownGracePeriodMs);
      logger.error({ err, drainMs }, 'hand-over abandoned: draining what this process accepted, then exiting');
      await Promise.race([proxy.retire(drainMs), signalled]);
      throw err;
    }
  }
  // Node writes the compile cache (main.ts) on exit; a proxy stopped by SIGKILL would never write it.
  flushCompileCache();
  // Serving already: a path another process holds (one that started at the same moment) costs only
  // the next hand-over, said once.
  const handover = await serveHandover(config, proxy, logger).catch((err: unknown) => {
    logger.error({ err }, 'cannot answer hand-overs: serving on; the next start of the proxy cannot take over from this process');
    return undefined;
  });
  // For a person at a terminal, apart from the JSON log on stdout: how to use the Service names.
  for (const line of proxy.names.hints()) process.stderr.write(`${line}\n`);
  const next = await Promise.race([signalled, handover?.handedOver ?? new Promise<never>(() => undefined)]);
  let successor = typeof next === 'string' ? undefined : next;
  if (typeof next === 'string' && handover !== undefined) {
    // A successor mid-hand-over (its pod turned ready on our health answers, say) finishes first:
    // stopping now would leave a moment with no listener.
    if (handover.server.busy) {
      logger.info({ signal: next }, 'a new process is taking over: finishing the hand-over before stopping');
      // A signal meanwhile has no grace period to end: the hand-over decides what follows.
      handingOver = true;
      await Promise.race([handover.server.settled(), new Promise((resolve) => setTimeout(resolve, SUCCESSOR_WAIT_MS).unref())]);
      successor = await Promise.race([handover.handedOver, Promise.resolve(undefined)]);
      handingOver = successor !== undefined;
    }
    if (successor === undefined) await handover.server.close();
  }
  if (successor !== undefined) {
    handingOver = true;
    // Drain whatever signals come: the successor serves, and established connections finish here.
    // With --after-handover wait, a signal after the drain ends the wait.
    let stopAsked: (() => void) | undefined;
    const stopped = new Promise<void>((resolve) => (stopAsked = resolve));
    for (const s of STOP_SIGNALS) process.on(s, () => stopAsked?.());
    logger.info({ to: successor.pid, version: successor.version, active: await proxy.activeConnectionsNow(), graceMs: config.shutdownGracePeriodMs }, 'handed over: no new connections here; established ones may finish');
    const { cut } = await proxy.retire();
    // A signal that came during the hand-over (the pod deleted meanwhile) was the stop already.
    if (typeof next === 'string') stopAsked?.();
    if (config.afterHandover === 'wait') {
      // Idle, holding no socket: a container that exits here would be restarted by the kubelet
      // before its pod is deleted, and would take over from the successor.
      logger.info({ cut }, 'handed over and drained: idle until stopped (--after-handover wait)');
      // Signal handlers do not keep Node's event loop alive; with no socket left, a timer must.
      const idle = setInterval(() => undefined, 2 ** 30);
      await stopped;
      clearInterval(idle);
    }
    logger.info({ cut }, 'stopped');
    logger.flush();
    return 0;
  }
  const signal = next as NodeJS.Signals;
  logger.info({ signal, active: await proxy.activeConnectionsNow(), graceMs: config.shutdownGracePeriodMs }, 'shutting down: no new connections; established ones may finish');
  // Another proxy that answers on the hand-over socket once the drain is over started meanwhile.
  const path = config.handoverSocket;
  const { cut } = await proxy.stop(undefined, endGrace.signal, path === undefined ? undefined : { otherServes: () => answers(path) });
  logger.info({ cut }, 'stopped');
  logger.flush();
  return 0;
}

export async function runCommand(argv: string[], begun: CommandStart = {}): Promise<void> {
  try {
    process.exitCode = await main(argv, begun);
  } catch (err: unknown) {
    if (err instanceof UsageError || (err instanceof ProxyError && err.code === 'PARSE')) {
      process.stderr.write(`kube-userspace-proxy: ${err.message}\n`);
      process.exitCode = 2;
      return;
    }
    if (err instanceof ProxyError && (err.code === 'PORTAL' || err.code === 'STARTUP' || err.code === 'HANDOVER')) {
      // e.g. --cleanup that could not remove everything (the message lists every failure), or a
      // server whose address is taken (startProxy closed whatever had started).
      process.stderr.write(`kube-userspace-proxy: ${err.message}\n`);
      process.exitCode = 1;
      return;
    }
    process.stderr.write(`kube-userspace-proxy: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  }
}
