import { isIPv6 } from 'node:net';
import type { BoundAddress } from './proxy-socket.js';

/** The key a listener is filed under: host and port as bound. */
export function listenKey(addr: BoundAddress): string {
  return isIPv6(addr.host) ? `[${addr.host}]:${addr.port}` : `${addr.host}:${addr.port}`;
}
