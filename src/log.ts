import { pino, type Logger, type LevelWithSilent, type DestinationStream } from 'pino';

export type { Logger };

export const LOG_LEVELS: readonly LevelWithSilent[] = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

/**
 * The root logger. Components take child loggers bound to `{component}` and, per service port,
 * `{service}`; errors go under `err` (pino's standard serializer).
 */
export function createLogger(level: LevelWithSilent = 'info', destination?: DestinationStream): Logger {
  const opts = { level, base: { pid: process.pid }, timestamp: pino.stdTimeFunctions.isoTime };
  return destination ? pino(opts, destination) : pino(opts);
}

/** A logger that writes nothing: for tests and for parts built without one. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
