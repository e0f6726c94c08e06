import { startProxy } from './app.js';
import { createPortal } from './create-portal.js';
import { parseCommandLine } from './cli.js';
import { buildConfig } from './config.js';
import { ProxyError, UsageError } from './core/errors.js';
import { cleanupLocalNames } from './local-names.js';
import { createLogger } from './log.js';
import { resolveOptions, writeConfigFile } from './kube-proxy-config.js';

/**
 * The command behind the `kube-userspace-proxy` binary (main.ts loads it): parses flags, builds
 * the parts, wires signals. The only place that sets process.exitCode. User errors print one line
 * without a stack and exit 2; bugs keep their stack.
 */
async function main(argv: string[]): Promise<number> {
  const outcome = parseCommandLine(argv);
  if (outcome.kind === 'exit') {
    (outcome.code === 0 ? process.stdout : process.stderr).write(outcome.output);
    return outcome.code;
  }
  const { options, warnings } = await resolveOptions(outcome.options);
  const config = buildConfig(options);
  const logger = createLogger(config.logLevel);
  for (const w of warnings) logger.warn(w);
  if (outcome.options.writeConfigTo !== undefined) {
    await writeConfigFile(outcome.options.writeConfigTo, config);
    return 0;
  }
  if (config.cleanup) {
    // Both run, whichever fails: cleanup keeps going past a failure.
    const results = await Promise.allSettled([createPortal(config, logger).cleanup(), cleanupLocalNames(config, logger)]);
    for (const r of results) if (r.status === 'rejected') throw r.reason;
    logger.info({ portal: config.portal }, 'cleanup done');
    return 0;
  }
  const signalled = new Promise<NodeJS.Signals>((resolve) => {
    process.once('SIGTERM', resolve);
    process.once('SIGINT', resolve);
  });
  // Start-up may wait a long time for an API server that does not answer: a signal then stops
  // the process at once (nothing has been accepted yet, so nothing is cut).
  const first = await Promise.race([startProxy(config, logger), signalled]);
  if (typeof first === 'string') {
    logger.info({ signal: first }, 'stopped before the first sync');
    logger.flush();
    process.exit(0);
  }
  const proxy = first;
  // For a person at a terminal, apart from the JSON log on stdout: how to use the Service names.
  for (const line of proxy.names.hints()) process.stderr.write(`${line}\n`);
  const signal = await signalled;
  logger.info({ signal, active: proxy.proxier.activeConnections(), graceMs: config.shutdownGracePeriodMs }, 'shutting down: no new connections; established ones may finish');
  const { cut } = await proxy.stop();
  logger.info({ cut }, 'stopped');
  logger.flush();
  return 0;
}

export async function runCommand(argv: string[]): Promise<void> {
  try {
    process.exitCode = await main(argv);
  } catch (err: unknown) {
    if (err instanceof UsageError || (err instanceof ProxyError && err.code === 'PARSE')) {
      process.stderr.write(`kube-userspace-proxy: ${err.message}\n`);
      process.exitCode = 2;
      return;
    }
    if (err instanceof ProxyError && (err.code === 'PORTAL' || err.code === 'STARTUP')) {
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
