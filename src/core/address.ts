import { UsageError } from '../errors.js';
import { isIP, isIPv4, isIPv6 } from './ip.js';

export interface HostPort {
  host: string;
  port: number;
}

/**
 * Parses a kube-proxy style bind address: `host:port`, `[v6]:port`, or (with a default port) a
 * bare IP. An empty host means all addresses. Throws UsageError naming `what`.
 */
export function parseHostPort(text: string, what: string, defaultPort?: number): HostPort {
  const s = text.trim();
  let host: string;
  let portText: string | undefined;
  const bracket = /^\[([^\]]+)\](?::(\d*))?$/.exec(s);
  if (bracket) {
    host = bracket[1] as string;
    portText = bracket[2];
  } else if (isIP(s)) {
    host = s;
  } else {
    const i = s.lastIndexOf(':');
    if (i < 0) throw new UsageError(`${what}: "${text}" is not host:port`);
    host = s.slice(0, i);
    portText = s.slice(i + 1);
  }
  if (host !== '' && !isIP(host) && host !== 'localhost') {
    throw new UsageError(`${what}: "${host}" in "${text}" is not an IP address`);
  }
  if (portText === undefined || portText === '') {
    if (defaultPort === undefined) throw new UsageError(`${what}: "${text}" has no port (expected host:port)`);
    return { host, port: defaultPort };
  }
  const port = Number(portText);
  if (!/^\d+$/.test(portText) || port > 65535) throw new UsageError(`${what}: port "${portText}" in "${text}" is not a port number (0-65535)`);
  return { host, port };
}

/** Parses a CIDR such as 10.96.0.0/12 or fd00::/108; throws UsageError naming `what`. */
export function parseCIDR(text: string, what: string): { ip: string; prefix: number; family: 4 | 6 } {
  const [ip, bits, ...rest] = text.trim().split('/');
  const family = ip && isIPv4(ip) ? 4 : ip && isIPv6(ip) ? 6 : 0;
  const prefix = Number(bits);
  const max = family === 4 ? 32 : 128;
  if (!ip || family === 0 || rest.length > 0 || bits === undefined || !/^\d+$/.test(bits) || prefix > max) {
    throw new UsageError(`${what}: "${text}" is not a CIDR (expected e.g. 10.96.0.0/12)`);
  }
  return { ip, prefix, family };
}
