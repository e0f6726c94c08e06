/**
 * Where a client on this machine reaches a Service port, by name or by ClusterIP: what the DNS
 * responder answers, and what the SOCKS/CONNECT front dials (with --workers) or whose unit it hands
 * its client to (locate's servicePort, otherwise). The directory of running Services
 * implements it (kept in step with the sync loop's events).
 */
export interface ServiceResolver {
  /**
   * `host` is a name in the cluster domain (`svc.ns.svc.<domain>`, `svc.ns.svc`, `svc.ns`) or one of
   * a Service's ClusterIPs; `port` the Service's port. Answers where the proxy serves that service
   * port here (its loopback address under the loopback portal, the ClusterIP otherwise), or
   * undefined when no running Service matches.
   */
  resolve(host: string, port: number, protocol: 'TCP' | 'UDP'): { host: string; port: number } | undefined;

  /** As resolve, with the service port's key (`ns/name:portName`, the id of its unit) too. */
  locate(host: string, port: number, protocol: 'TCP' | 'UDP'): ServiceLocation | undefined;
}

export interface ServiceLocation {
  host: string;
  port: number;
  /** `ns/name:portName`: the running unit that serves it (core/units.ts). */
  servicePort: string;
}
