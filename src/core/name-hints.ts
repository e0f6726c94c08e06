import { hostPort } from './address.js';
import { HOSTS_BEGIN } from './hosts-block.js';

/**
 * What a user needs to use the Service names, printed once at start: the commands, and what each
 * needs. Each says whether it needs root; the systemd-resolved one says its cost, since resolved
 * has no way to send one domain to a server on the loopback interface alone: it refuses per-link
 * settings on `lo` ("Link lo is loopback device"), and its global servers also get every name no
 * routing domain claims (systemd-resolved.service(8), "Protocols and Routing").
 */

export interface NameHintInput {
  /** Where the DNS responder listens, as bound. */
  dns?: { host: string; port: number };
  domain: string;
  hostsFile?: string;
  /** A Service's fully qualified name, for a command that works as printed. */
  example?: string;
  /** Where the SOCKS5/HTTP CONNECT front listens, as bound. */
  socks?: { host: string; port: number };
  /** A Service with a TCP port (`svc.ns` and the port), for a curl line that works as printed. */
  exampleTcp?: { name: string; port: number };
}

export function nameHints(input: NameHintInput): string[] {
  const lines: string[] = [];
  const { dns, domain } = input;
  if (dns !== undefined) {
    // A wildcard address is reached on loopback.
    const host = dns.host === '0.0.0.0' || dns.host === '::' ? '127.0.0.1' : dns.host;
    const name = input.example ?? `SERVICE.NAMESPACE.svc.${domain}`;
    const server = hostPort({ host, port: dns.port });
    lines.push(
      `Service names under ${domain} are answered at ${server} (UDP and TCP). To use them:`,
      `  any user:       dig @${host} -p ${dns.port} ${name}`,
      `  macOS, as root: mkdir -p /etc/resolver && printf 'nameserver ${host}\\nport ${dns.port}\\n' > /etc/resolver/${domain}`,
      `  Linux with systemd-resolved 246 or later, as root:`,
      `                  mkdir -p /etc/systemd/resolved.conf.d && printf '[Resolve]\\nDNS=${server}\\nDomains=~${domain}\\n' > /etc/systemd/resolved.conf.d/kube-userspace-proxy.conf && systemctl restart systemd-resolved`,
      `                  (resolved then also asks it for names outside ${domain}; it refuses them and the other servers answer)`,
    );
    if (input.hostsFile === undefined) lines.push(`  Linux or macOS, as root, with no resolver to configure: add --hosts-file /etc/hosts`);
  }
  if (input.hostsFile !== undefined) {
    lines.push(`Service names are kept in ${input.hostsFile}, between "${HOSTS_BEGIN}" and its END line, while this runs; the block goes when it stops.`);
  }
  if (input.socks !== undefined) {
    const host = input.socks.host === '0.0.0.0' || input.socks.host === '::' ? '127.0.0.1' : input.socks.host;
    const proxy = hostPort({ host, port: input.socks.port });
    const target = input.exampleTcp ?? { name: 'SERVICE.NAMESPACE', port: 'PORT' };
    lines.push(
      `Services are reached by name (svc.ns, svc.ns.svc, svc.ns.svc.${domain}) or ClusterIP through the SOCKS5 and HTTP CONNECT proxy at ${proxy}:`,
      `  curl:          curl --socks5-hostname ${proxy} http://${target.name}:${target.port}/`,
      `  most tools:    ALL_PROXY=socks5h://${proxy}   (socks5h: the proxy resolves the names)`,
      `  HTTPS clients: HTTPS_PROXY=http://${proxy}   (HTTP CONNECT)`,
    );
  }
  return lines;
}
