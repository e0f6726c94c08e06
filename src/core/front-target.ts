import { ipFamily } from './address.js';
import { normalizeName, parseClusterName } from './cluster-names.js';
import { SOCKS_REPLY, canonicalIP, httpReply, socksReply, type FrontRequest } from './front-handshake.js';

/**
 * What a request to the SOCKS/CONNECT front reaches: the address where this proxy serves the
 * Service port it names, or a refusal. Pure: the resolver (the directory of running Services,
 * seams/service-resolver.ts) is passed in.
 *
 * Refusals, and the codes they answer with:
 *   outside      a name outside the cluster domain (`example.org`, `localhost`): this front
 *                reaches Services only, by rule. SOCKS5 0x02 "connection not allowed by
 *                ruleset", HTTP 403.
 *   unknown      a name in the cluster domain, a `svc.ns` name or an IP address that is no
 *                running Service with that TCP port. SOCKS5 0x04 "host unreachable", HTTP 404.
 *                A two-label name is read as `svc.ns` (it has the shape of `example.org` too), so
 *                an unknown one is "unknown" rather than "outside".
 *   unavailable  the dial to where the proxy serves it failed, or its unit no longer takes
 *                connections (the Service went away between the lookup and the dial, or the
 *                proxy is shutting down). SOCKS5 0x05 "connection refused", HTTP 502.
 */

/**
 * The ServiceResolver's lookup (seams/service-resolver.ts), as a function; `servicePort` names the
 * unit that serves it, for a front that hands its clients to the unit directly.
 */
export type ResolveServicePort = (host: string, port: number, protocol: 'TCP' | 'UDP') => { host: string; port: number; servicePort?: string } | undefined;

export type FrontRefusal = 'outside' | 'unknown' | 'unavailable';

export type FrontTarget = { kind: 'dial'; host: string; port: number; servicePort?: string } | { kind: 'refuse'; why: FrontRefusal };

export function frontTarget(request: FrontRequest, resolve: ResolveServicePort, domain: string): FrontTarget {
  const isAddress = ipFamily(request.host) !== undefined;
  const host = isAddress ? canonicalIP(request.host) : normalizeName(request.host);
  const at = resolve(host, request.port, 'TCP');
  if (at !== undefined) return at.servicePort === undefined ? { kind: 'dial', host: at.host, port: at.port } : { kind: 'dial', host: at.host, port: at.port, servicePort: at.servicePort };
  if (!isAddress) {
    // Only `svc.ns` itself is read as a Service's name here: `_port._proto.x.y` is outside.
    const n = parseClusterName(host, domain);
    if (n.kind === 'outside' || (n.zone === 'none' && n.kind !== 'service')) return { kind: 'refuse', why: 'outside' };
  }
  return { kind: 'refuse', why: 'unknown' };
}

const SOCKS_CODES: Record<FrontRefusal, number> = {
  outside: SOCKS_REPLY.notAllowed,
  unknown: SOCKS_REPLY.hostUnreachable,
  unavailable: SOCKS_REPLY.connectionRefused,
};

/** The reply that refuses `request` for `why`. */
export function refusalReply(request: FrontRequest, why: FrontRefusal, domain: string): Buffer {
  if (request.protocol === 'socks5') return socksReply(SOCKS_CODES[why]);
  const target = `${request.host}:${request.port}`;
  switch (why) {
    case 'outside':
      return httpReply(403, `${target}: only the cluster's Services are reached through this proxy (names under ${domain}, svc.ns, or ClusterIPs)`);
    case 'unknown':
      return httpReply(404, `${target}: no running Service has this name or address with this TCP port`);
    case 'unavailable':
      return httpReply(502, `${target}: the proxy could not connect to the Service`);
  }
}

/** The reply that tells the client its tunnel is open; `bound` is the address the front connected from. */
export function connectedReply(request: FrontRequest, bound: { host: string; port: number }): Buffer {
  return request.protocol === 'socks5' ? socksReply(SOCKS_REPLY.succeeded, bound) : httpReply(200);
}
