import { UsageError } from './errors.js';

/**
 * Service names as cluster DNS spells them (the Kubernetes DNS specification, 2.3.1/2.3.2), read
 * from a query name. Three forms name a Service: `svc.ns.svc.<domain>`, `svc.ns.svc` and `svc.ns`
 * (what a Pod's search path makes of the short names); a named port's SRV owner is
 * `_port._proto.` before any of them. Pure: the directory looks the result up.
 */

/** A domain as `--cluster-domain` takes it: lower-case labels, no trailing dot. */
export function parseClusterDomain(text: string, what: string): string {
  const domain = text.trim().toLowerCase().replace(/\.$/, '');
  const label = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
  if (domain === '' || domain.length > 253 || !domain.split('.').every((l) => label.test(l))) {
    throw new UsageError(`${what}: "${text}" is not a DNS domain name (such as cluster.local)`);
  }
  return domain;
}

/** What a query name means, before anything is looked up. */
export type ClusterName =
  /** `svc.ns...` in one of the three forms. */
  | { kind: 'service'; namespace: string; name: string; zone: ClusterZone }
  /** `_port._proto.svc.ns...`: a named port's SRV owner. */
  | { kind: 'port'; namespace: string; name: string; port: string; protocol: string; zone: ClusterZone }
  /** `_proto.svc.ns...`: between a Service and its ports' SRV owners. */
  | { kind: 'protocol'; namespace: string; name: string; zone: ClusterZone }
  /** `ns.svc...`: exists when a running Service is in that namespace. */
  | { kind: 'namespace'; namespace: string; zone: ClusterZone }
  /** The zone's apex (`<domain>` or `svc`) or `svc.<domain>`: always exists. */
  | { kind: 'node'; zone: ClusterZone }
  /** Inside a zone, in no shape a Service has (a Pod's name, a typo): does not exist. */
  | { kind: 'unknown'; zone: ClusterZone }
  /** Outside every zone this proxy answers for. */
  | { kind: 'outside' };

/**
 * The zone a name falls in: the cluster domain, or `svc` for the relative `svc.ns.svc` form
 * (`svc` is no top-level domain, so answering for it hides nothing real). The two-label `svc.ns`
 * form has no zone of its own: `web.default` names a Service when one runs, and is left to other
 * servers (REFUSED) otherwise, since `example.com` has the same shape.
 */
export type ClusterZone = 'domain' | 'svc' | 'none';

/** `name` lower-cased without its trailing dot, as every lookup takes it. */
export function normalizeName(name: string): string {
  return name.toLowerCase().replace(/\.$/, '');
}

export function parseClusterName(queryName: string, domain: string): ClusterName {
  const name = normalizeName(queryName);
  if (name === domain) return { kind: 'node', zone: 'domain' };
  let rest: string[];
  let zone: ClusterZone;
  if (name.endsWith(`.${domain}`)) {
    rest = name.slice(0, -domain.length - 1).split('.');
    zone = 'domain';
    // Below the domain only `svc.` holds Services (`pod.` and the rest are not served here).
    if (rest[rest.length - 1] !== 'svc') return { kind: 'unknown', zone };
    rest.pop();
  } else if (name === 'svc' || name.endsWith('.svc')) {
    rest = name === 'svc' ? [] : name.slice(0, -4).split('.');
    zone = 'svc';
  } else {
    // `svc.ns`, and the SRV owners before it (`_proto.svc.ns`, `_port._proto.svc.ns`): only these
    // shapes may name a Service; the rest (and these, when no such Service runs) are the world's.
    const labels = name.split('.');
    if (labels.length < 2 || labels.length > 4 || labels.some((l) => l === '')) return { kind: 'outside' };
    if (labels.length === 2) return { kind: 'service', name: labels[0]!, namespace: labels[1]!, zone: 'none' };
    const first = underscored(labels[0]!);
    if (first === undefined) return { kind: 'outside' };
    if (labels.length === 3) return { kind: 'protocol', name: labels[1]!, namespace: labels[2]!, zone: 'none' };
    const proto = underscored(labels[1]!);
    if (proto === undefined) return { kind: 'outside' };
    return { kind: 'port', port: first, protocol: proto.toUpperCase(), name: labels[2]!, namespace: labels[3]!, zone: 'none' };
  }
  // rest: the labels left of `svc`, nearest last.
  if (rest.some((l) => l === '')) return { kind: 'unknown', zone };
  switch (rest.length) {
    case 0:
      return { kind: 'node', zone };
    case 1:
      return { kind: 'namespace', namespace: rest[0]!, zone };
    case 2:
      return { kind: 'service', name: rest[0]!, namespace: rest[1]!, zone };
    case 3: {
      const proto = underscored(rest[0]!);
      return proto === undefined ? { kind: 'unknown', zone } : { kind: 'protocol', name: rest[1]!, namespace: rest[2]!, zone };
    }
    case 4: {
      const port = underscored(rest[0]!);
      const proto = underscored(rest[1]!);
      if (port === undefined || proto === undefined) return { kind: 'unknown', zone };
      return { kind: 'port', port, protocol: proto.toUpperCase(), name: rest[2]!, namespace: rest[3]!, zone };
    }
    default:
      return { kind: 'unknown', zone };
  }
}

function underscored(label: string): string | undefined {
  return label.length > 1 && label.startsWith('_') ? label.slice(1) : undefined;
}

/** The names a Service answers to, fully qualified first (the form a hosts file lists too). */
export function serviceNames(namespace: string, name: string, domain: string): [string, string, string] {
  return [`${name}.${namespace}.svc.${domain}`, `${name}.${namespace}.svc`, `${name}.${namespace}`];
}
