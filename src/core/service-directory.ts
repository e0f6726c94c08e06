import { ipFamily } from './address.js';
import { normalizeName, parseClusterName, serviceNames } from './cluster-names.js';
import type { PortalAddress } from './model.js';

/**
 * The directory of running Services: for each, where a client on this machine connects (its
 * loopback address under the loopback portal, its ClusterIPs under the others) and its ports.
 * What the DNS responder answers, the hosts file lists and the SOCKS front resolves
 * (seams/service-resolver.ts: this class has its shape).
 *
 * It is rebuilt from the running units, lazily: the sync loop's event only marks it stale, and the
 * next read rebuilds it, so a burst of syncs costs one rebuild and a proxy nobody asks costs none.
 * Only units that carry ClusterIP portals count (scope `all` or `cluster`); headless and
 * ExternalName Services have none and are not listed.
 */

/** The part of a running unit the directory reads (a ProxyUnit has it). */
export interface DirectoryUnit {
  /** `ns/name`. */
  service: string;
  /** `ns/name:portName`. */
  servicePort: string;
  protocol: string;
  portals: readonly PortalAddress[];
}

/**
 * Where clients on this machine connect for a Service, given its ClusterIPs: the portal's answer.
 * IPv4 addresses first.
 */
export type ClientAddresses = (service: string, clusterIPs: readonly string[]) => readonly string[];

export interface DirectoryPort {
  /** `spec.ports[].name`; empty for a Service's single unnamed port. */
  name: string;
  port: number;
  protocol: string;
}

export interface DirectoryEntry {
  namespace: string;
  name: string;
  clusterIPs: string[];
  /** Where a client here connects: IPv4 first. */
  addresses: readonly string[];
  ports: DirectoryPort[];
}

export interface ServiceDirectoryOptions {
  domain: string;
  /** The running units, read at each rebuild. */
  units: () => Iterable<DirectoryUnit>;
  clientAddresses: ClientAddresses;
}

export class ServiceDirectory {
  readonly domain: string;
  private readonly opts: ServiceDirectoryOptions;
  /** `ns/name` -> entry. */
  private byService = new Map<string, DirectoryEntry>();
  /** ClusterIPs and client addresses -> entry; built at the first lookup by address after a rebuild. */
  private byAddress: Map<string, DirectoryEntry> | undefined;
  /** Built at the first lookup by namespace after a rebuild. */
  private namespaces: Set<string> | undefined;
  private stale = true;
  private generation = 0;

  constructor(opts: ServiceDirectoryOptions) {
    this.opts = opts;
    this.domain = opts.domain;
  }

  /** The units may have changed (a sync opened, closed or recreated some): rebuild at the next read. */
  invalidate(): void {
    this.stale = true;
  }

  /** Counts the rebuilds: the SOA serial. */
  get version(): number {
    this.refresh();
    return this.generation;
  }

  /** A running Service by namespace and name. */
  get(namespace: string, name: string): DirectoryEntry | undefined {
    this.refresh();
    return this.byService.get(`${namespace}/${name}`);
  }

  hasNamespace(namespace: string): boolean {
    this.refresh();
    this.namespaces ??= new Set([...this.byService.values()].map((e) => e.namespace));
    return this.namespaces.has(namespace);
  }

  /** Every running Service, by namespace then name. */
  entries(): DirectoryEntry[] {
    this.refresh();
    return [...this.byService.values()].sort((a, b) => compare(a.namespace, b.namespace) || compare(a.name, b.name));
  }

  /**
   * ServiceResolver: `host` is a Service's name in any of its three forms, one of its ClusterIPs
   * or its client address; answers where to connect for that port, or undefined.
   */
  resolve(host: string, port: number, protocol: 'TCP' | 'UDP'): { host: string; port: number } | undefined {
    const at = this.locate(host, port, protocol);
    return at === undefined ? undefined : { host: at.host, port: at.port };
  }

  /** As resolve, with the service port's key (`ns/name:portName`: its unit's id) too. */
  locate(host: string, port: number, protocol: 'TCP' | 'UDP'): { host: string; port: number; servicePort: string } | undefined {
    this.refresh();
    const family = ipFamily(host);
    let entry: DirectoryEntry | undefined;
    if (family !== undefined) entry = this.addressIndex().get(host);
    else {
      const n = parseClusterName(normalizeName(host), this.domain);
      if (n.kind === 'service') entry = this.byService.get(`${n.namespace}/${n.name}`);
    }
    const p = entry?.ports.find((p) => p.port === port && p.protocol === protocol);
    if (entry === undefined || p === undefined) return undefined;
    // An address the client named is kept when it is one of the Service's client addresses
    // (ClusterIPs under the node-level portals); otherwise the first, IPv4 by preference.
    const at = family !== undefined && entry.addresses.includes(host) ? host : entry.addresses.find((a) => ipFamily(a) === family) ?? entry.addresses[0];
    // The unit's servicePort, as refresh() split it into namespace, name and port name.
    return at === undefined ? undefined : { host: at, port, servicePort: `${entry.namespace}/${entry.name}:${p.name}` };
  }

  /** The lines of a hosts file: `address fqdn svc.ns.svc svc.ns`, one per client address. */
  hostsLines(): string[] {
    const lines: string[] = [];
    for (const e of this.entries()) {
      const names = serviceNames(e.namespace, e.name, this.domain).join(' ');
      for (const a of e.addresses) lines.push(`${a} ${names}`);
    }
    return lines;
  }

  private addressIndex(): Map<string, DirectoryEntry> {
    if (this.byAddress === undefined) {
      this.byAddress = new Map();
      for (const e of this.byService.values()) {
        for (const a of e.clusterIPs) this.byAddress.set(a, e);
        for (const a of e.addresses) this.byAddress.set(a, e);
      }
    }
    return this.byAddress;
  }

  private refresh(): void {
    if (!this.stale) return;
    this.stale = false;
    // Every port of a Service has the same ClusterIPs: its first unit's are the Service's. Only the
    // index by name is built here; the others wait for a lookup that needs them.
    const byService = new Map<string, DirectoryEntry>();
    for (const u of this.opts.units()) {
      let port = -1;
      let clusterIPs: string[] | undefined;
      for (const p of u.portals) {
        if (p.kind !== 'clusterIP') continue;
        port = p.port;
        (clusterIPs ??= []).push(p.ip);
      }
      if (clusterIPs === undefined) continue;
      let entry = byService.get(u.service);
      if (entry === undefined) {
        const slash = u.service.indexOf('/');
        const namespace = u.service.slice(0, slash);
        const name = u.service.slice(slash + 1);
        const addresses = ipv4First(this.opts.clientAddresses(u.service, clusterIPs));
        entry = { namespace, name, clusterIPs, addresses, ports: [] };
        byService.set(u.service, entry);
      }
      entry.ports.push({ name: u.servicePort.slice(u.service.length + 1), port, protocol: u.protocol });
    }
    for (const e of byService.values()) if (e.ports.length > 1) e.ports.sort(byPort);
    // Rebuilt only after a sync that opened, closed or recreated units: a change worth a new serial.
    this.generation++;
    this.byService = byService;
    this.byAddress = undefined;
    this.namespaces = undefined;
  }
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function byPort(a: DirectoryPort, b: DirectoryPort): number {
  return a.port - b.port || compare(a.protocol, b.protocol) || compare(a.name, b.name);
}

function ipv4First(addresses: readonly string[]): readonly string[] {
  if (addresses.length < 2 || !addresses.some((a) => a.includes(':'))) return addresses;
  return [...addresses.filter((a) => !a.includes(':')), ...addresses.filter((a) => a.includes(':'))];
}
