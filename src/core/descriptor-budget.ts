/**
 * How many listening sockets the proxy may hold, from its open-file limit: what is left once the
 * descriptors for connections and the proxy's own work are set aside. Past that a service port is
 * not served (one clear error for it) rather than taking the last descriptors, after which every
 * connection of every Service, every portal sync (os.networkInterfaces needs a socket) and every
 * state-file read fails. Pure; the limit is read at start-up, before anything is open.
 */

/** Descriptors a process holds besides the proxy's sockets: stdio, the event loop, HTTP servers, logs, watches, child processes' pipes. */
export const BASE_DESCRIPTORS = 64;

/** Concurrent proxied connections (TCP) and sessions (UDP) over the whole node to budget for by default. */
export const DEFAULT_EXPECTED_CONNECTIONS = 4096;

/** Never set aside fewer than this, however low the limit: the proxy's own work needs them. */
export const MIN_RESERVED = 256;

export interface DescriptorBudget {
  /** The open-file limit in force (`Infinity` when unlimited). */
  limit: number;
  /** Kept for connections (two descriptors each) and the proxy's own work. */
  reserved: number;
  /** Listening sockets the proxy may hold. */
  maxListeners: number;
}

/**
 * Sets aside what `expectedConnections` need, but never more than half the limit (so a low limit
 * still serves some Services) nor less than MIN_RESERVED.
 */
export function descriptorBudget(limit: number, expectedConnections = DEFAULT_EXPECTED_CONNECTIONS): DescriptorBudget {
  if (limit === Infinity) return { limit, reserved: 0, maxListeners: Infinity };
  const wanted = BASE_DESCRIPTORS + 2 * expectedConnections;
  const reserved = Math.min(limit, Math.max(MIN_RESERVED, Math.min(wanted, Math.floor(limit / 2))));
  return { limit, reserved, maxListeners: Math.max(0, limit - reserved) };
}
