import type { DialFailureReason } from '../../core/stats.js';
import { errnoCode } from '../../core/errors.js';

/** The stats bucket of a failed dial, by errno (never by message text). */
export function dialFailureReason(err: unknown): DialFailureReason {
  switch (errnoCode(err)) {
    case 'ECONNREFUSED':
      return 'refused';
    case 'ETIMEDOUT':
      return 'timeout';
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
    case 'EHOSTDOWN':
    case 'ENETDOWN':
      return 'unreachable';
    default:
      return 'other';
  }
}

/** The process (EMFILE) or the system (ENFILE) ran out of file descriptors. */
export function isOutOfDescriptors(err: unknown): boolean {
  const code = errnoCode(err);
  return code === 'EMFILE' || code === 'ENFILE';
}

/**
 * A failed dial that tells about the endpoint, for passive health: refused, timed out, reset, no
 * route to it. The proxy's own troubles (out of descriptors or local ports) say nothing about it.
 */
export function isEndpointFault(err: unknown): boolean {
  switch (errnoCode(err)) {
    case 'ECONNREFUSED':
    case 'ETIMEDOUT':
    case 'ECONNRESET':
    case 'EHOSTUNREACH':
    case 'EHOSTDOWN':
    case 'ENETUNREACH':
      return true;
    default:
      return false;
  }
}
