import { Command, CommanderError, Option } from 'commander';
import { AFTER_HANDOVER, DEFAULTS, DIALERS, type RawOptions } from './config.js';
import { PORTAL_MODES } from './seams/portal.js';
import { VERSION } from './version.js';

export type CliOutcome =
  | { kind: 'run'; options: RawOptions }
  /** Help, version, or a usage error: print `output` (to stderr when code != 0) and exit. */
  | { kind: 'exit'; code: number; output: string };

/**
 * The commander program. Defaults live in config.ts, not here, so that the options handed on are
 * exactly the flags given: a config file's values yield to them. kube-proxy ignores most flags when
 * --config is given (kubernetes#98302, #107156: its own maintainers expected otherwise); here a
 * flag given always wins, on purpose. Flag names follow kube-proxy's where it has one. No side effects:
 * output is captured and handed back, the caller prints and exits.
 */
export function buildProgram(capture: { out: string; err: string }): Command {
  const program = new Command('kube-userspace-proxy')
    .description('A Kubernetes Service proxy in user space: kube-proxy\'s userspace mode for today\'s Kubernetes.')
    .version(VERSION, '--version', 'print the version and exit')
    .helpOption('-h, --help', 'show this help')
    .allowExcessArguments(false)
    .exitOverride()
    .configureOutput({
      writeOut: (s) => { capture.out += s; },
      writeErr: (s) => { capture.err += s; },
      outputError: (s, write) => write(s),
    });
  program
    .option('--config <file>', 'a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) file; flags given override its values (kube-proxy would ignore them)')
    .option('--write-config-to <file>', 'write the effective configuration (file, flags and defaults) to this file and exit')
    .option('--state <file>', 'serve the Services and EndpointSlices in this file (YAML, JSON or a v1 List), watched for edits')
    .option('--portal <mode>', `how traffic reaches the proxy: ${PORTAL_MODES.join(', ')} (default: ${DEFAULTS.portal})`)
    .option('--kubeconfig <file>', 'path to a kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)')
    .option('--master <url>', 'the Kubernetes API server address (overrides the kubeconfig)')
    .option('--dialer <kind>', `how endpoints are reached: ${DIALERS.join(', ')} (through the API server's pods/portforward, for a laptop that cannot reach pod IPs; TCP only) (default: ${DEFAULTS.dialer})`)
    .option('--namespace <name>', 'watch only this namespace (repeatable; default: all), for RBAC scoped to namespaces', (value: string, previous: string[] | undefined) => [...(previous ?? []), value])
    .option('--hostname-override <name>', 'the name of this node (default: the hostname)')
    .option('--bind-address <ip>', `the address proxy ports listen on (default: ${DEFAULTS.bindAddress})`)
    .option('--proxy-port-range <range>', 'the range of host ports for proxy ports (a-b, a+n or p; default: the kernel picks)')
    .option('--udp-timeout <duration>', `how long an idle UDP session lives (default: ${DEFAULTS.udpTimeout})`)
    .option('--tcp-keepalive <duration>', `TCP keepalive probes on both legs of a connection after this long without traffic, in whole seconds; 0 turns them off (default: ${DEFAULTS.tcpKeepalive})`)
    .option('--tcp-idle-timeout <duration>', `close a TCP connection after this long without a byte either way; 0 never does (default: ${DEFAULTS.tcpIdleTimeout})`)
    .option('--max-udp-sessions <n>', `UDP sessions per service port on this node, shared equally among the workers (each holds at most n/workers, rounded up); past it the oldest idle one is reclaimed (default: ${DEFAULTS.maxUdpSessions})`)
    .option('--workers <n>', 'processes that serve connections: a number, or auto for one per core (os.availableParallelism()); 1 serves from this process alone (default: auto with --portal iptables or bind, 1 with loopback)')
    .option('--metrics-bind-address <host:port>', `where the metrics and status server listens (default: ${DEFAULTS.metricsBindAddress})`)
    .option('--healthz-bind-address <host:port>', `where the health server listens (default: ${DEFAULTS.healthzBindAddress})`)
    .option('--iptables-sync-period <duration>', `the longest time between full resyncs (default: ${DEFAULTS.iptablesSyncPeriod})`)
    .option('--iptables-min-sync-period <duration>', `the shortest time between syncs; bursts of changes merge (default: ${DEFAULTS.iptablesMinSyncPeriod})`)
    .addOption(new Option('--sync-period <duration>', 'alias of --iptables-sync-period').hideHelp())
    .addOption(new Option('--min-sync-period <duration>', 'alias of --iptables-min-sync-period').hideHelp())
    .option('--config-sync-period <duration>', `how often every Service is re-translated from memory (kube-proxy's resync; never a re-list) (default: ${DEFAULTS.configSyncPeriod})`)
    .option('--nodeport-addresses <cidrs>', 'comma-separated CIDRs whose local addresses serve node ports (default: all)')
    .option('--service-cluster-ip-range <cidrs>', 'the Service ClusterIP range(s): accepted as kube-proxy\'s flag and validated, not used (the bind portal makes each Service\'s own addresses local)')
    .option('--shutdown-grace-period <duration>', `how long established connections may finish after SIGTERM (default: ${DEFAULTS.shutdownGracePeriod})`)
    .option('--dns-bind-address <host:port>', 'answer DNS for Service names (svc.ns.svc.<cluster domain>, svc.ns) on this address, UDP and TCP (default: off)')
    .option('--socks-bind-address <host:port>', 'a SOCKS5 and HTTP CONNECT proxy on this address that reaches Services by name or ClusterIP (curl --socks5-hostname, ALL_PROXY=socks5h://, HTTPS_PROXY=http://) (default: off)')
    .option('--cluster-domain <domain>', `the domain Service names end in (default: ${DEFAULTS.clusterDomain})`)
    .option('--hosts-file <file>', 'keep a block of Service names in this hosts-format file (e.g. /etc/hosts, as root); removed on exit and by --cleanup')
    .option('--after-handover <what>', `once handed over and drained: ${AFTER_HANDOVER.join(' or ')} (wait: idle until SIGTERM, as a DaemonSet's container must, or the kubelet restarts it) (default: ${DEFAULTS.afterHandover})`)
    .option('--handover-socket <file>', 'a unix socket through which a starting proxy takes over from the running one without closing a port; established connections drain on the old process for --shutdown-grace-period (see docs/handover.md)')
    .option('--outlier-consecutive-failures <n>', `passive health: set an endpoint aside after this many failed dials in a row (refused, timed out, reset before any byte); 0 turns it off (default: ${DEFAULTS.outlierConsecutiveFailures})`)
    .option('--outlier-base-ejection-time <duration>', `passive health: how long an endpoint is first set aside; doubled on each repeat (default: ${DEFAULTS.outlierBaseEjectionTime})`)
    .option('--outlier-max-ejection-time <duration>', `passive health: the longest an endpoint is set aside (default: ${DEFAULTS.outlierMaxEjectionTime})`)
    .option('--outlier-max-ejection-percent <n>', `passive health: at most this share of a port's endpoints set aside at once, and always one (default: ${DEFAULTS.outlierMaxEjectionPercent})`)
    .option('--hold-max-per-service-port <n>', `connections held for want of endpoints (annotation kube-userspace-proxy.io/hold-when-empty) per service port; past it they are reset (default: ${DEFAULTS.holdMaxPerServicePort})`)
    .option('--hold-max-per-node <n>', `connections held for want of endpoints over the whole node (default: ${DEFAULTS.holdMaxPerNode})`)
    .option('--emit-events', 'post a Kubernetes Event (reason NeedPods) on a Service each time a connection is held for want of its endpoints (needs RBAC create on events)')
    .option('--log-level <level>', `trace, debug, info, warn, error, fatal or silent (default: ${DEFAULTS.logLevel})`)
    .option('--cleanup', 'remove everything the portal modes installed, then exit (with no --portal, as root: both node-level modes\' leftovers)');
  return program;
}

/** The flags whose string value is handed on unchanged, under the same name. */
const STRING_OPTIONS = [
  'config', 'writeConfigTo', 'state', 'portal', 'kubeconfig', 'master', 'hostnameOverride', 'bindAddress',
  'proxyPortRange', 'udpTimeout', 'maxUdpSessions', 'tcpKeepalive', 'tcpIdleTimeout', 'workers', 'metricsBindAddress', 'healthzBindAddress',
  'iptablesSyncPeriod', 'iptablesMinSyncPeriod', 'nodeportAddresses', 'serviceClusterIpRange',
  'shutdownGracePeriod', 'configSyncPeriod', 'logLevel', 'dnsBindAddress', 'socksBindAddress', 'clusterDomain', 'hostsFile', 'handoverSocket', 'afterHandover', 'dialer',
  'outlierConsecutiveFailures', 'outlierBaseEjectionTime', 'outlierMaxEjectionTime', 'outlierMaxEjectionPercent',
  'holdMaxPerServicePort', 'holdMaxPerNode',
] as const satisfies ReadonlyArray<keyof RawOptions>;

export function parseCommandLine(argv: readonly string[]): CliOutcome {
  const capture = { out: '', err: '' };
  const program = buildProgram(capture);
  try {
    program.parse([...argv], { from: 'user' });
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.exitCode === 0) return { kind: 'exit', code: 0, output: capture.out };
      const line = (capture.err || err.message).trim().split('\n')[0] ?? err.message;
      return { kind: 'exit', code: 2, output: `${line}\n` };
    }
    throw err;
  }
  const o = program.opts<Record<string, string | string[] | boolean | undefined>>();
  const options: RawOptions = {};
  const s = (k: string): string | undefined => (typeof o[k] === 'string' ? (o[k]) : undefined);
  // Commander names each value after its flag in camelCase, as RawOptions does; only the two
  // kube-proxy aliases map onto another name.
  for (const key of STRING_OPTIONS) {
    const v = s(key);
    if (v !== undefined) options[key] = v;
  }
  const syncPeriod = s('syncPeriod');
  const minSyncPeriod = s('minSyncPeriod');
  if (syncPeriod !== undefined) options.iptablesSyncPeriod = syncPeriod;
  if (minSyncPeriod !== undefined) options.iptablesMinSyncPeriod = minSyncPeriod;
  if (o.cleanup === true) options.cleanup = true;
  if (o.emitEvents === true) options.emitEvents = true;
  if (Array.isArray(o.namespace)) options.namespaces = o.namespace;
  return { kind: 'run', options };
}
