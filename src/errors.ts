/**
 * Typed errors with a stable `code` and a `cause` (modelled on undici's lib/core/errors.js).
 * Branch on `code`, never on message text.
 */
export type ProxyErrorCode =
  | 'USAGE' // a bad flag or config value: print one line, exit 2
  | 'INVALID_OBJECT' // a Kubernetes object failed validation
  | 'PARSE' // a state or config file did not parse
  | 'TOO_LARGE' // a state file larger than the proxy reads
  | 'PORT_RANGE_EXHAUSTED'
  | 'PORT_IN_USE'
  | 'PORT_PRIVILEGED'
  | 'PORTAL' // a portal could not be programmed
  | 'DIAL' // no endpoint could be dialed
  | 'NO_ENDPOINTS'
  | 'API' // the Kubernetes API answered with an error
  | 'INTERNAL';

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
