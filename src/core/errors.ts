/**
 * Typed errors with a stable `code` and a `cause` (modelled on undici's lib/core/errors.js).
 * Branch on `code`, never on message text.
 */
export type ProxyErrorCode =
  | 'USAGE' // a bad flag or config value: print one line, exit 2
  | 'PARSE' // a state or config file did not parse
  | 'STARTUP' // a part could not start (an address in use): print one line, exit 1
  | 'TOO_LARGE' // a state file larger than the proxy reads
  | 'PORT_RANGE_EXHAUSTED'
  | 'PORTAL' // a portal could not be programmed
  | 'API' // the Kubernetes API answered with an error
  | 'PORT_FORWARD' // a port-forward tunnel or stream to a pod failed
  | 'HANDOVER' // --handover-socket: the running proxy refused the hand-over (it serves on): print one line, exit 1
  | 'INTERNAL'; // a bug: an invariant did not hold

export class ProxyError extends Error {
  readonly code: ProxyErrorCode;

  constructor(code: ProxyErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ProxyError';
    this.code = code;
  }
}

/** A mistake of the user's (flag, config, manifest): reported as one line without a stack. */
export class UsageError extends ProxyError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('USAGE', message, options);
    this.name = 'UsageError';
  }
}

export function isErrnoException(err: unknown): err is NodeJS.ErrnoException {
  return err instanceof Error && typeof (err as NodeJS.ErrnoException).code === 'string';
}

/** The errno code of a Node system error, or undefined. */
export function errnoCode(err: unknown): string | undefined {
  return isErrnoException(err) ? err.code : undefined;
}
