import { hostPort } from './core/address.js';
import { nameHints } from './core/name-hints.js';
import { ServiceDirectory, type ClientAddresses } from './core/service-directory.js';
import type { ProxyConfig } from './config.js';
import type { DnsServer } from './io/dns/dns-server.js';
import type { FrontServer } from './io/front/front-server.js';
import { HostsFile, removeHostsBlock } from './io/names/hosts-file.js';
import { LoopbackPortal } from './io/portal/loopback-portal.js';
import type { Logger } from './log.js';
import type { Portal } from './seams/portal.js';
import type { ProxierEvents } from './seams/proxier-events.js';
import type { TcpHandOffs } from './seams/tcp-hand-off.js';
import type { UnitSet } from './seams/unit-set.js';

/**
 * Service names for local development (composition): the directory of running Services, kept in
 * step with the sync loop, and what serves it: the DNS responder (`--dns-bind-address`), the
 * hosts-file block (`--hosts-file`) and the SOCKS5/HTTP CONNECT front (`--socks-bind-address`),
 * which resolves names through it. The directory is built whatever the flags: it costs nothing
 * until read.
 */

/** Records live this long in caches: a Service that appears or goes is seen within it. */
const DNS_TTL_SECONDS = 5;

export interface LocalNames {
  directory: ServiceDirectory;
  /** Where the DNS responder listens, when it does (`host:port`). */
  dnsAddress?: string;
  /** Where the SOCKS5/HTTP CONNECT front listens, when it does (`host:port`). */
  socksAddress?: string;
  /** The lines a user needs to use the names (printed at start). */
  hints(): string[];
  /**
   * Stops answering and takes the hosts-file block out (a failure there is logged); with
   * `keepHostsBlock` (a hand-over: the successor keeps it) the block stays.
   */
  stop(opts?: { keepHostsBlock?: boolean }): Promise<void>;
}

/** Where a client here connects: the loopback portal's address for the Service, else its ClusterIPs. */
function clientAddresses(portal: Portal): ClientAddresses {
  if (portal instanceof LoopbackPortal) {
    return (service) => {
      const a = portal.addressOf(service);
      return a === undefined ? [] : [a];
    };
  }
  return (_service, clusterIPs) => clusterIPs;
}

/**
 * Builds the directory and starts what the flags ask for. Call before the first sync, so that the
 * hosts file follows it. A failure (an address in use, a hosts file that cannot be written) closes
 * what had started and rejects with one line.
 */
export async function startLocalNames(config: ProxyConfig, parts: { events: ProxierEvents; units: UnitSet; portal: Portal; logger: Logger; handOffs?: TcpHandOffs }, listenOrExplain: <T>(flag: string, address: { host: string; port: number }, listen: () => Promise<T>) => Promise<T>): Promise<LocalNames> {
  const { events, units, portal, logger } = parts;
  const directory = new ServiceDirectory({ domain: config.clusterDomain, units: () => units.views().map((v) => v.unit), clientAddresses: clientAddresses(portal) });
  const hostsFile = config.hostsFile === undefined ? undefined : new HostsFile({ path: config.hostsFile, logger });
  await hostsFile?.check();
  let synced = false;
  events.onSync((e) => {
    const s = e.summary;
    // Endpoints alone change no name or address: only units opened, closed or recreated do.
    if (e.first || s.opened + s.closed + s.recreated > 0) directory.invalidate();
    synced = true;
    if (hostsFile !== undefined && (e.first || s.opened + s.closed + s.recreated > 0 || hostsFile.failed)) hostsFile.set(directory.hostsLines());
  });
  let dns: DnsServer | undefined;
  let dnsAddress: string | undefined;
  let bound: { host: string; port: number } | undefined;
  // The responder and the front (and dns-packet) load only when asked for: start-up pays for what it uses.
  if (config.dnsBindAddress !== undefined) {
    const [{ DnsServer }, { answerDnsQuery }] = await Promise.all([import('./io/dns/dns-server.js'), import('./core/dns-answer.js')]);
    const server = new DnsServer({ logger, reusePort: config.handoverSocket !== undefined, handler: (message, transport) => answerDnsQuery(message, { directory, ttlSeconds: DNS_TTL_SECONDS, transport, ready: synced }) });
    const address = config.dnsBindAddress;
    bound = await listenOrExplain('--dns-bind-address', address, () => server.listen(address.host, address.port));
    dns = server;
    dnsAddress = hostPort(bound);
  }
  let front: FrontServer | undefined;
  let frontBound: { host: string; port: number } | undefined;
  if (config.socksBindAddress !== undefined) {
    const { FrontServer } = await import('./io/front/front-server.js');
    // The units in this process (no --workers): the front hands its clients to their TCP proxy
    // sockets, and needs none of their listeners (macOS without root binds no 127.96.x.y).
    const server = new FrontServer({ resolver: directory, domain: config.clusterDomain, logger, reusePort: config.handoverSocket !== undefined, ...(parts.handOffs ? { handOffs: parts.handOffs } : {}) });
    const address = config.socksBindAddress;
    try {
      frontBound = await listenOrExplain('--socks-bind-address', address, () => server.listen(address.host, address.port));
    } catch (err) {
      await dns?.close();
      throw err;
    }
    front = server;
  }
  return {
    directory,
    ...(dnsAddress !== undefined ? { dnsAddress } : {}),
    ...(frontBound !== undefined ? { socksAddress: hostPort(frontBound) } : {}),
    hints: () => {
      // Nothing serves names: no lines, and no directory built for them (10,000 Services cost ~50 ms).
      if (bound === undefined && frontBound === undefined && config.hostsFile === undefined) return [];
      const first = directory.entries()[0];
      const tcp = directory.entries().find((e) => e.ports.some((p) => p.protocol === 'TCP'));
      const port = tcp?.ports.find((p) => p.protocol === 'TCP')?.port;
      return nameHints({
        domain: config.clusterDomain,
        ...(bound !== undefined ? { dns: bound } : {}),
        ...(frontBound !== undefined ? { socks: frontBound } : {}),
        ...(config.hostsFile !== undefined ? { hostsFile: config.hostsFile } : {}),
        ...(first !== undefined ? { example: `${first.name}.${first.namespace}.svc.${config.clusterDomain}` } : {}),
        ...(tcp !== undefined && port !== undefined ? { exampleTcp: { name: `${tcp.name}.${tcp.namespace}`, port } } : {}),
      });
    },
    async stop(opts) {
      await Promise.all([dns?.close(), front?.close(), opts?.keepHostsBlock === true ? undefined : hostsFile?.remove()]);
    },
  };
}

/** `--cleanup`: the hosts-file block of a run that could not take it out (killed, or a crash). */
export async function cleanupLocalNames(config: ProxyConfig, logger: Logger): Promise<void> {
  if (config.hostsFile === undefined) return;
  if (await removeHostsBlock(config.hostsFile)) logger.info({ file: config.hostsFile }, 'removed the Service names block');
}
