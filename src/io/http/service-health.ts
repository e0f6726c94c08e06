import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { http } from './node-http.js';
import type { AddressInfo } from 'node:net';
import { nodePortAddresses } from '../../core/rules/node-address.js';
import { hostPort } from '../../core/address.js';
import { errnoCode } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';
import type { NodeAddressSource } from '../portal/node-addresses.js';
import type { PortalMode } from '../../seams/portal.js';

/**
 * kube-proxy's healthCheckNodePort servers (pkg/proxy/healthcheck/service_health.go): for every
 * Service of type LoadBalancer with externalTrafficPolicy Local, an HTTP server on its
 * healthCheckNodePort tells the cloud load balancer whether this node has local endpoints:
 * 200 when it has some and the proxy is healthy, else 503, on any path, with kube-proxy's body
 * and its X-Load-Balancing-Endpoint-Weight header.
 *
 * `sync` reconciles the listeners with the proxier's view after each sync: one server per
 * Service, on each of `hosts`; a changed port closes and reopens it; a port that cannot be bound
 * is reported once and tried again on the next sync. Endpoint counts change without rebinding.
 */

/** What the proxier reports per Service (Proxier.serviceHealth()). */
export interface ServiceHealthEntry {
  /** `namespace/name`. */
  service: string;
  healthCheckNodePort: number;
  /** Ready endpoints of the Service on this node. */
  localEndpoints: number;
}

export interface ServiceHealthServerOptions {
  /**
   * Where to listen: the node-port addresses the portal uses (`0.0.0.0`/`::` for all, as
   * kube-proxy does when --nodeport-addresses is unset; `127.0.0.1` with the loopback portal).
   */
  hosts: readonly string[];
  logger: Logger;
  /** kube-proxy's own health (healthz.ts ProxierHealth.isHealthy); unhealthy turns every answer to 503. */
  proxyHealthy?: () => boolean;
  /** SO_REUSEPORT (--handover-socket): the next process binds the same ports beside this one. */
  reusePort?: boolean;
}

interface Instance {
  service: string;
  port: number;
  localEndpoints: number;
  servers: Server[];
}

export class ServiceHealthServer {
  private readonly log: Logger;
  private readonly hosts: readonly string[];
  private readonly proxyHealthy: () => boolean;
  private readonly reusePort: boolean;
  private readonly instances = new Map<string, Instance>();
  /** Bind failures already reported, per `service|port`: one line each until it binds. */
  private readonly reported = new Map<string, string>();
  private chain: Promise<void> = Promise.resolve();
  private closed = false;

  constructor(opts: ServiceHealthServerOptions) {
    this.log = opts.logger.child({ component: 'service-health' });
    this.hosts = opts.hosts.length > 0 ? opts.hosts : ['0.0.0.0'];
    this.proxyHealthy = opts.proxyHealthy ?? (() => true);
    this.reusePort = opts.reusePort ?? false;
  }

  /** Reconcile with the Services that want a health check port. Calls run one after another. */
  sync(entries: readonly ServiceHealthEntry[]): Promise<void> {
    const next = this.chain.then(() => this.reconcile(entries));
    this.chain = next.catch((err: unknown) => this.log.error({ err }, 'reconciling health check ports failed'));
    return next;
  }

  /** What is being served now: Service, port and the addresses actually bound. */
  serving(): Array<{ service: string; port: number; localEndpoints: number; addresses: string[] }> {
    return [...this.instances.values()].map((i) => ({
      service: i.service,
      port: i.port,
      localEndpoints: i.localEndpoints,
      addresses: i.servers.map((s) => {
        const a = s.address() as AddressInfo;
        return hostPort({ host: a.address, port: a.port });
      }),
    }));
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.chain;
    await Promise.all([...this.instances.values()].map((i) => closeAll(i.servers)));
    this.instances.clear();
  }

  private async reconcile(entries: readonly ServiceHealthEntry[]): Promise<void> {
    if (this.closed) return;
    const wanted = new Map<string, ServiceHealthEntry>();
    for (const e of entries) if (e.healthCheckNodePort > 0) wanted.set(e.service, e);
    for (const [service, inst] of this.instances) {
      const w = wanted.get(service);
      if (w === undefined || w.healthCheckNodePort !== inst.port) {
        this.instances.delete(service);
        await closeAll(inst.servers);
        this.log.info({ service, port: inst.port }, 'closed health check port');
      }
    }
    for (const [service, e] of wanted) {
      const inst = this.instances.get(service);
      if (inst) {
        inst.localEndpoints = e.localEndpoints;
        continue;
      }
      await this.open(e);
    }
    for (const key of [...this.reported.keys()]) {
      const [service] = key.split('|');
      if (!wanted.has(service ?? '')) this.reported.delete(key);
    }
  }

  /** All hosts or none, as kube-proxy: a half-served port would hide the failure. */
  private async open(e: ServiceHealthEntry): Promise<void> {
    const inst: Instance = { service: e.service, port: e.healthCheckNodePort, localEndpoints: e.localEndpoints, servers: [] };
    const key = `${e.service}|${e.healthCheckNodePort}`;
    try {
      for (const host of this.hosts) inst.servers.push(await this.listen(inst, host));
    } catch (err) {
      await closeAll(inst.servers);
      const what = `${errnoCode(err) ?? (err as Error).message}`;
      if (this.reported.get(key) !== what) {
        this.reported.set(key, what);
        this.log.error({ service: e.service, port: e.healthCheckNodePort, err: what }, `${e.service}: cannot serve its health check node port ${e.healthCheckNodePort}: ${describeListenError(what)}; retrying at the next sync`);
      }
      return;
    }
    this.reported.delete(key);
    this.instances.set(e.service, inst);
    this.log.info({ service: e.service, port: inst.port, hosts: this.hosts }, 'serving health check node port');
  }

  private listen(inst: Instance, host: string): Promise<Server> {
    const server = http.createServer((req, res) => this.answer(inst, req, res));
    server.keepAliveTimeout = 5000;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port: inst.port, reusePort: this.reusePort }, () => {
        server.off('error', reject);
        server.on('error', (err) => this.log.error({ err, service: inst.service }, 'health check server error'));
        resolve(server);
      });
    });
  }

  private answer(inst: Instance, _req: IncomingMessage, res: ServerResponse): void {
    const count = inst.localEndpoints;
    const healthy = this.proxyHealthy();
    const body = serviceHealthBody(inst.service, count, healthy);
    res.writeHead(count !== 0 && healthy ? 200 : 503, {
      'Content-Type': 'application/json',
      'X-Content-Type-Options': 'nosniff',
      'X-Load-Balancing-Endpoint-Weight': String(count),
      'Content-Length': Buffer.byteLength(body),
    });
    res.end(body);
  }
}

/**
 * Where health check node ports listen, as kube-proxy decides: with the loopback portal,
 * 127.0.0.1 (where its node ports are); with --nodeport-addresses, the node's addresses inside
 * those CIDRs (all of them when none match, as kube-proxy falls back); else every address
 * (`::` takes IPv4 too; `0.0.0.0` where the kernel has no IPv6).
 */
export function healthCheckHosts(portal: PortalMode, nodePortCIDRs: readonly string[], node: NodeAddressSource): string[] {
  if (portal === 'loopback') return ['127.0.0.1'];
  const all = node.ipv6Enabled() ? ['::'] : ['0.0.0.0'];
  if (nodePortCIDRs.length === 0) return all;
  const ips = nodePortAddresses(node.addresses(), nodePortCIDRs).map((a) => a.ip);
  return ips.length > 0 ? ips : all;
}

/** kube-proxy's body, byte for byte (a dedented Go template: tab-indented, no trailing newline). */
export function serviceHealthBody(service: string, localEndpoints: number, serviceProxyHealthy: boolean): string {
  const slash = service.indexOf('/');
  const namespace = service.slice(0, slash);
  const name = service.slice(slash + 1);
  return [
    '{',
    '\t"service": {',
    `\t\t"namespace": ${JSON.stringify(namespace)},`,
    `\t\t"name": ${JSON.stringify(name)}`,
    '\t},',
    `\t"localEndpoints": ${localEndpoints},`,
    `\t"serviceProxyHealthy": ${serviceProxyHealthy}`,
    '}',
  ].join('\n');
}

function describeListenError(code: string): string {
  switch (code) {
    case 'EADDRINUSE':
      return 'the port is in use by another process';
    case 'EACCES':
      return 'permission denied';
    case 'EADDRNOTAVAIL':
      return 'the address is not local to this node';
    default:
      return code;
  }
}

async function closeAll(servers: readonly Server[]): Promise<void> {
  await Promise.all(
    servers.map(
      (s) =>
        new Promise<void>((resolve) => {
          s.close(() => resolve());
          s.closeAllConnections();
        }),
    ),
  );
}
