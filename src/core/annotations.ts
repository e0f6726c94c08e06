import type { V1Service } from '@kubernetes/client-node';
import { parseDuration } from './duration.js';
import type { BalancerAlgorithm, ProxyProtocolVersion } from './model.js';

/**
 * The per-Service settings only a userspace proxy can offer, as annotations under one prefix.
 * A bad value is one notice naming the Service and the annotation (the proxier logs it once), and
 * the Service is served as if the annotation were absent: a typo must not cost it its traffic.
 */

export const ANNOTATION_PREFIX = 'kube-userspace-proxy.io/';
export const LOAD_BALANCER_ANNOTATION = `${ANNOTATION_PREFIX}load-balancer`;
export const HOLD_WHEN_EMPTY_ANNOTATION = `${ANNOTATION_PREFIX}hold-when-empty`;
export const PROXY_PROTOCOL_ANNOTATION = `${ANNOTATION_PREFIX}proxy-protocol`;

const ALGORITHMS: readonly BalancerAlgorithm[] = ['round-robin', 'least-connections'];
const KNOWN = new Set([LOAD_BALANCER_ANNOTATION, HOLD_WHEN_EMPTY_ANNOTATION, PROXY_PROTOCOL_ANNOTATION]);
/** The PROXY protocol versions sent: the binary one, which servers parse without scanning text. */
const PROXY_PROTOCOL_VERSIONS: readonly ProxyProtocolVersion[] = ['v2'];

/**
 * The longest a connection may be held waiting for endpoints. Clients and the load balancers in
 * front of them give up on a silent connection within minutes; a scale-up that takes longer than
 * this needs a retry from the client anyway.
 */
export const MAX_HOLD_WHEN_EMPTY_MS = 5 * 60_000;

export interface ServiceAnnotations {
  /** Absent: round-robin. */
  loadBalancer?: BalancerAlgorithm;
  /** Absent: a connection to a port without endpoints is reset at once. */
  holdWhenEmptyMs?: number;
  /** Absent: TCP connections reach the endpoints as the client's bytes alone. */
  proxyProtocol?: ProxyProtocolVersion;
  /** One line per bad value or unknown name, without the Service's name (the caller adds it). */
  notices: string[];
}

export function serviceAnnotations(svc: V1Service): ServiceAnnotations {
  const out: ServiceAnnotations = { notices: [] };
  const annotations: Record<string, unknown> = svc.metadata?.annotations ?? {};
  for (const [name, value] of Object.entries(annotations)) {
    if (!name.startsWith(ANNOTATION_PREFIX)) continue;
    const at = `metadata.annotations["${name}"]`;
    if (!KNOWN.has(name)) {
      out.notices.push(`${at}: unknown annotation; known under ${ANNOTATION_PREFIX}: ${[...KNOWN].map((k) => k.slice(ANNOTATION_PREFIX.length)).join(', ')}`);
      continue;
    }
    if (typeof value !== 'string') {
      out.notices.push(`${at}: must be a string; ignored`);
      continue;
    }
    if (name === LOAD_BALANCER_ANNOTATION) loadBalancer(value, at, out);
    else if (name === HOLD_WHEN_EMPTY_ANNOTATION) holdWhenEmpty(value, at, out);
    else proxyProtocol(value, at, out);
  }
  return out;
}

function loadBalancer(value: string, at: string, out: ServiceAnnotations): void {
  const v = value.trim();
  if (!(ALGORITHMS as readonly string[]).includes(v)) {
    out.notices.push(`${at}: ${JSON.stringify(value)} is not one of ${ALGORITHMS.join(', ')}; served round-robin`);
    return;
  }
  if (v !== 'round-robin') out.loadBalancer = v as BalancerAlgorithm;
}

function holdWhenEmpty(value: string, at: string, out: ServiceAnnotations): void {
  let ms: number;
  try {
    ms = parseDuration(value, at);
  } catch {
    out.notices.push(`${at}: ${JSON.stringify(value)} is not a duration (a Go duration such as 30s or 2m); connections are not held`);
    return;
  }
  if (ms > MAX_HOLD_WHEN_EMPTY_MS) {
    out.notices.push(`${at}: ${JSON.stringify(value)} is longer than the most a connection may be held (5m); connections are not held`);
    return;
  }
  if (ms > 0) out.holdWhenEmptyMs = ms;
}

function proxyProtocol(value: string, at: string, out: ServiceAnnotations): void {
  const v = value.trim();
  if (!(PROXY_PROTOCOL_VERSIONS as readonly string[]).includes(v)) {
    out.notices.push(`${at}: ${JSON.stringify(value)} is not one of ${PROXY_PROTOCOL_VERSIONS.join(', ')}; no PROXY protocol header is sent`);
    return;
  }
  out.proxyProtocol = v as ProxyProtocolVersion;
}
