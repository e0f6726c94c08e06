import { isIP, parseCidrFlag, parseHostPort, type HostPort } from './core/address.js';
import { parseClusterDomain } from './core/cluster-names.js';
import { formatDuration, parseDuration } from './core/duration.js';
import { parsePortRange, type PortRange } from './core/port-allocator.js';
import { UsageError } from './core/errors.js';
import { DEFAULT_OUTLIER_POLICY, type OutlierPolicy } from './core/balancer/outlier.js';
import { LOG_LEVELS } from './log.js';
import { PORTAL_MODES, type PortalMode } from './seams/portal.js';
import type { LevelWithSilent } from 'pino';

/** How endpoints are reached: a TCP connect to the endpoint, or a stream through the API server's pods/portforward. */
export const DIALERS = ['direct', 'port-forward'] as const;
/** `--after-handover`: what a process does once it handed over and its connections are done. */
export const AFTER_HANDOVER = ['exit', 'wait'] as const;
export type DialerKind = (typeof DIALERS)[number];

/** The validated configuration every part is built from. */
export interface ProxyConfig {
  /** `--state FILE`: Services and EndpointSlices from a file instead of the API. */
  stateFile?: string;
  portal: PortalMode;
  /** `--bind-address`: where proxy ports listen (iptables portal). */
  bindAddress: string;
  proxyPortRange?: PortRange;
  udpIdleTimeoutMs: number;
  /** `--tcp-keepalive`: keepalive probes on both legs after this long idle (whole seconds); 0 = off. */
  tcpKeepAliveMs: number;
  /** `--tcp-idle-timeout`: a connection without a byte either way this long is closed; 0 = never. */
  tcpIdleTimeoutMs: number;
  metricsBindAddress: HostPort;
  healthzBindAddress: HostPort;
  logLevel: LevelWithSilent;
  hostnameOverride?: string;
  kubeconfig?: string;
  master?: string;
  /** `--dialer`: how endpoints are reached. */
  dialer: DialerKind;
  /** `--namespace` (repeatable): the namespaces watched; empty: all. */
  namespaces: string[];
  syncPeriodMs: number;
  minSyncPeriodMs: number;
  /**
   * `--config-sync-period`: kube-proxy's informer resync: every Service is re-translated from the
   * cache in memory. It never re-lists from the API server (watches resume, and a 410 re-lists).
   */
  configSyncPeriodMs: number;
  /** `--nodeport-addresses`: CIDRs whose local addresses serve node ports; empty = all. */
  nodePortAddresses: string[];
  /** `--service-cluster-ip-range`: the range made local by the bind portal. */
  serviceClusterIPRanges: string[];
  shutdownGracePeriodMs: number;
  /** Bound on UDP sessions per service port over the node (each worker holds its share). */
  maxUdpSessions: number;
  /** `--dns-bind-address`: where the DNS responder for Service names listens (off when unset). */
  dnsBindAddress?: HostPort;
  /** `--socks-bind-address`: where the SOCKS5 and HTTP CONNECT front to the Services listens (off when unset). */
  socksBindAddress?: HostPort;
  /** `--cluster-domain`: the domain Service names end in (lower-case, no trailing dot). */
  clusterDomain: string;
  /** `--hosts-file`: the hosts-format file that keeps a block of Service names. */
  hostsFile?: string;
  /**
   * `--handover-socket`: the unix socket through which a starting proxy takes over from the
   * running one without closing a port (docs/handover.md). Every listener then binds with
   * SO_REUSEPORT, `--workers 1` included.
   */
  handoverSocket?: string;
  /**
   * `--after-handover`: `exit` once handed over and drained, or `wait` (idle, no socket) for
   * SIGTERM: in a DaemonSet, a container that exits is restarted by the kubelet, and that restart
   * would take over from the successor (docs/handover.md).
   */
  afterHandover: (typeof AFTER_HANDOVER)[number];
  /**
   * `--workers`: processes that serve connections; `auto` is one per core
   * (os.availableParallelism(), resolved at start). 1 serves from the controller's own process.
   */
  workers: number | 'auto';
  /** `--outlier-*`: passive health (outlier ejection on consecutive connect failures). */
  outlier: OutlierPolicy;
  /** `--hold-max-per-service-port`, `--hold-max-per-node`: bounds on connections held by hold-when-empty. */
  holdMaxPerServicePort: number;
  holdMaxPerNode: number;
  /** `--emit-events`: a Kubernetes Event (NeedPods) on a Service per hold episode; API source only. */
  emitEvents: boolean;
  cleanup: boolean;
}

/** The raw option values as the CLI hands them over (strings as typed). */
export interface RawOptions {
  state?: string;
  portal?: string;
  bindAddress?: string;
  proxyPortRange?: string;
  udpTimeout?: string;
  tcpKeepalive?: string;
  tcpIdleTimeout?: string;
  metricsBindAddress?: string;
  healthzBindAddress?: string;
  logLevel?: string;
  hostnameOverride?: string;
  kubeconfig?: string;
  master?: string;
  dialer?: string;
  /** `--namespace`, once per namespace. */
  namespaces?: string[];
  iptablesSyncPeriod?: string;
  iptablesMinSyncPeriod?: string;
  nodeportAddresses?: string;
  serviceClusterIpRange?: string;
  shutdownGracePeriod?: string;
  maxUdpSessions?: string;
  workers?: string;
  configSyncPeriod?: string;
  dnsBindAddress?: string;
  socksBindAddress?: string;
  clusterDomain?: string;
  hostsFile?: string;
  handoverSocket?: string;
  afterHandover?: string;
  outlierConsecutiveFailures?: string;
  outlierBaseEjectionTime?: string;
  outlierMaxEjectionTime?: string;
  outlierMaxEjectionPercent?: string;
  holdMaxPerServicePort?: string;
  holdMaxPerNode?: string;
  emitEvents?: boolean;
  cleanup?: boolean;
  /** `--config FILE`: a KubeProxyConfiguration whose values the flags override (kube-proxy-config.ts). */
  config?: string;
  /** `--write-config-to FILE`: write the effective configuration and exit. */
  writeConfigTo?: string;
}

export const DEFAULTS = {
  portal: 'loopback' as PortalMode,
  bindAddress: '0.0.0.0',
  udpTimeout: '250ms',
  tcpKeepalive: '15s',
  tcpIdleTimeout: '0s',
  metricsBindAddress: '127.0.0.1:10249',
  healthzBindAddress: '0.0.0.0:10256',
  logLevel: 'info',
  iptablesSyncPeriod: '30s',
  iptablesMinSyncPeriod: '1s',
  shutdownGracePeriod: '10s',
  maxUdpSessions: '4096',
  configSyncPeriod: '15m',
  clusterDomain: 'cluster.local',
  outlierConsecutiveFailures: String(DEFAULT_OUTLIER_POLICY.consecutiveFailures),
  outlierBaseEjectionTime: '30s',
  outlierMaxEjectionTime: '5m',
  outlierMaxEjectionPercent: String(DEFAULT_OUTLIER_POLICY.maxEjectionPercent),
  holdMaxPerServicePort: '100',
  holdMaxPerNode: '1000',
  dialer: 'direct' as DialerKind,
  afterHandover: 'exit' as (typeof AFTER_HANDOVER)[number],
};

/**
 * `--workers` when not given: every core where the proxy serves the node's traffic (`iptables`,
 * `bind`), as kube-proxy does (Go's runtime runs on every core); one process for `loopback`, the
 * mode of a laptop and the demo, where one process is simpler to follow and is plenty.
 */
export function defaultWorkers(portal: PortalMode): 'auto' | 1 {
  return portal === 'loopback' ? 1 : 'auto';
}

/** `auto`, or a whole number from 1 to MAX_WORKERS. */
export const MAX_WORKERS = 256;

export function parseWorkers(value: string, what: string): number | 'auto' {
  if (value === 'auto') return 'auto';
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isInteger(n) || n < 1 || n > MAX_WORKERS) {
    throw new UsageError(`${what}: "${value}" is neither auto nor a whole number from 1 to ${MAX_WORKERS}`);
  }
  return n;
}

function flag(name: string, fn: () => unknown): void {
  try {
    fn();
  } catch (err) {
    if (err instanceof UsageError) throw new UsageError(`--${name}: ${err.message.replace(/^[^:]*: /, '')}`);
    throw err;
  }
}

/**
 * The longest duration a flag or field of ours takes. Every one ends up in a timer, and Node's
 * timers hold at most 2^31-1 ms (24.8 days): past that one fires at once, so a grace period of
 * 1000h would cut every connection at shutdown and a sync period of 720h would resync without
 * pause. Go (kube-proxy) takes up to 2,562,047h; refused here in one line instead. 24 days leaves
 * room for the margins some deadlines add to a grace period.
 */
export const LONGEST_DURATION_MS = 24 * 24 * 3_600_000;

function duration(name: string, value: string, min = 0): number {
  let ms = 0;
  flag(name, () => {
    ms = parseDuration(value, name);
  });
  if (ms < min) throw new UsageError(`--${name}: ${value} is too short (at least ${min}ms)`);
  if (ms > LONGEST_DURATION_MS) throw new UsageError(`--${name}: ${value} is longer than the proxy can time (at most ${formatDuration(LONGEST_DURATION_MS)}, 24 days: Node.js's timers)`);
  return ms;
}

/** Linux's largest TCP_KEEPIDLE, in seconds: a longer idle time is refused by the kernel, and Node ignores the refusal. */
const MAX_KEEPIDLE_S = 32_767;

/** TCP_KEEPIDLE counts whole seconds: 0 turns keepalive off, anything else is rounded up to a second. */
function keepAlive(value: string): number {
  const ms = duration('tcp-keepalive', value);
  if (ms > MAX_KEEPIDLE_S * 1000) throw new UsageError(`--tcp-keepalive: ${value} is longer than Linux's TCP_KEEPIDLE allows (at most ${formatDuration(MAX_KEEPIDLE_S * 1000)})`);
  return ms === 0 ? 0 : Math.ceil(ms / 1000) * 1000;
}

function oneOf<T extends string>(name: string, value: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(value)) {
    throw new UsageError(`--${name}: "${value}" is not one of ${allowed.join(', ')}`);
  }
  return value as T;
}

function cidrList(name: string, value: string | undefined): string[] {
  if (!value) return [];
  const list = value.split(',').map((s) => s.trim()).filter(Boolean);
  for (const c of list) flag(name, () => parseCidrFlag(c, name));
  return list;
}

function wholeNumber(name: string, value: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isInteger(n) || n < min || n > max) {
    throw new UsageError(`--${name}: "${value}" is not a whole number from ${min} to ${max === Number.MAX_SAFE_INTEGER ? 'up' : max}`);
  }
  return n;
}

function outlierPolicy(raw: RawOptions): OutlierPolicy {
  const policy: OutlierPolicy = {
    consecutiveFailures: wholeNumber('outlier-consecutive-failures', raw.outlierConsecutiveFailures ?? DEFAULTS.outlierConsecutiveFailures, 0),
    baseEjectionMs: duration('outlier-base-ejection-time', raw.outlierBaseEjectionTime ?? DEFAULTS.outlierBaseEjectionTime, 1),
    maxEjectionMs: duration('outlier-max-ejection-time', raw.outlierMaxEjectionTime ?? DEFAULTS.outlierMaxEjectionTime, 1),
    maxEjectionPercent: wholeNumber('outlier-max-ejection-percent', raw.outlierMaxEjectionPercent ?? DEFAULTS.outlierMaxEjectionPercent, 0, 100),
  };
  if (policy.maxEjectionMs < policy.baseEjectionMs) {
    throw new UsageError(`--outlier-max-ejection-time (${raw.outlierMaxEjectionTime ?? `default ${DEFAULTS.outlierMaxEjectionTime}`}) must not be shorter than --outlier-base-ejection-time (${raw.outlierBaseEjectionTime ?? `default ${DEFAULTS.outlierBaseEjectionTime}`})`);
  }
  return policy;
}

/** A namespace is a DNS-1123 label: lower-case letters, digits and '-', at most 63, alphanumeric at both ends. */
function namespaceList(names: readonly string[]): string[] {
  for (const n of names) {
    if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(n)) {
      throw new UsageError(`--namespace: "${n}" is not a namespace name (lower-case letters, digits and '-', at most 63 characters)`);
    }
  }
  return [...new Set(names)];
}

/** Where options came from other than flags (the config file's fields): `file: field.path` by option. */
export type OptionOrigins = Partial<Record<keyof RawOptions, string>>;

/**
 * Options (flags, merged with a config file) -> validated ProxyConfig. Pure. A message about a
 * value the config file set names the file and the field, not a flag that was never given: the
 * checks below speak of flags (`--udp-timeout`), and each flag a file set is renamed in the one
 * line (its option's name is the flag's, camel-cased, as commander makes it).
 */
export function buildConfig(raw: RawOptions, origins: OptionOrigins = {}): ProxyConfig {
  try {
    return buildFromOptions(raw);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    const message = err.message.replace(/--([a-z][a-z0-9-]*)/g, (flagText, name: string) => origins[camelCase(name) as keyof RawOptions] ?? flagText);
    if (message === err.message) throw err;
    throw new UsageError(message, { cause: err });
  }
}

function camelCase(flagName: string): string {
  return flagName.replace(/-([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

function buildFromOptions(raw: RawOptions): ProxyConfig {
  const portal = oneOf('portal', raw.portal ?? DEFAULTS.portal, PORTAL_MODES);
  const bindAddress = raw.bindAddress ?? DEFAULTS.bindAddress;
  if (!isIP(bindAddress)) throw new UsageError(`--bind-address: "${bindAddress}" is not an IP address`);
  let proxyPortRange: PortRange | undefined;
  flag('proxy-port-range', () => {
    proxyPortRange = parsePortRange(raw.proxyPortRange ?? '');
  });
  let metricsBindAddress: HostPort = { host: '', port: 0 };
  let healthzBindAddress: HostPort = { host: '', port: 0 };
  flag('metrics-bind-address', () => {
    metricsBindAddress = parseHostPort(raw.metricsBindAddress ?? DEFAULTS.metricsBindAddress, 'metrics-bind-address', 10249);
  });
  flag('healthz-bind-address', () => {
    healthzBindAddress = parseHostPort(raw.healthzBindAddress ?? DEFAULTS.healthzBindAddress, 'healthz-bind-address', 10256);
  });
  const maxUdpSessions = Number(raw.maxUdpSessions ?? DEFAULTS.maxUdpSessions);
  if (!Number.isInteger(maxUdpSessions) || maxUdpSessions < 1) {
    throw new UsageError(`--max-udp-sessions: "${raw.maxUdpSessions}" is not a positive whole number`);
  }
  const config: ProxyConfig = {
    portal,
    bindAddress,
    udpIdleTimeoutMs: duration('udp-timeout', raw.udpTimeout ?? DEFAULTS.udpTimeout, 1),
    tcpKeepAliveMs: keepAlive(raw.tcpKeepalive ?? DEFAULTS.tcpKeepalive),
    tcpIdleTimeoutMs: duration('tcp-idle-timeout', raw.tcpIdleTimeout ?? DEFAULTS.tcpIdleTimeout),
    metricsBindAddress,
    healthzBindAddress,
    logLevel: oneOf('log-level', raw.logLevel ?? DEFAULTS.logLevel, LOG_LEVELS),
    syncPeriodMs: duration('iptables-sync-period', raw.iptablesSyncPeriod ?? DEFAULTS.iptablesSyncPeriod, 1),
    minSyncPeriodMs: duration('iptables-min-sync-period', raw.iptablesMinSyncPeriod ?? DEFAULTS.iptablesMinSyncPeriod),
    configSyncPeriodMs: duration('config-sync-period', raw.configSyncPeriod ?? DEFAULTS.configSyncPeriod, 1),
    nodePortAddresses: cidrList('nodeport-addresses', raw.nodeportAddresses),
    serviceClusterIPRanges: cidrList('service-cluster-ip-range', raw.serviceClusterIpRange),
    shutdownGracePeriodMs: duration('shutdown-grace-period', raw.shutdownGracePeriod ?? DEFAULTS.shutdownGracePeriod),
    maxUdpSessions,
    clusterDomain: parseClusterDomain(raw.clusterDomain ?? DEFAULTS.clusterDomain, '--cluster-domain'),
    workers: raw.workers === undefined ? defaultWorkers(portal) : parseWorkers(raw.workers, '--workers'),
    outlier: outlierPolicy(raw),
    holdMaxPerServicePort: wholeNumber('hold-max-per-service-port', raw.holdMaxPerServicePort ?? DEFAULTS.holdMaxPerServicePort, 0),
    holdMaxPerNode: wholeNumber('hold-max-per-node', raw.holdMaxPerNode ?? DEFAULTS.holdMaxPerNode, 0),
    emitEvents: raw.emitEvents ?? false,
    dialer: oneOf('dialer', raw.dialer ?? DEFAULTS.dialer, DIALERS),
    afterHandover: oneOf('after-handover', raw.afterHandover ?? DEFAULTS.afterHandover, AFTER_HANDOVER),
    namespaces: namespaceList(raw.namespaces ?? []),
    cleanup: raw.cleanup ?? false,
  };
  if (raw.dnsBindAddress) {
    const text = raw.dnsBindAddress;
    flag('dns-bind-address', () => {
      config.dnsBindAddress = parseHostPort(text, 'dns-bind-address', 53);
    });
  }
  if (raw.socksBindAddress) {
    const text = raw.socksBindAddress;
    flag('socks-bind-address', () => {
      config.socksBindAddress = parseHostPort(text, 'socks-bind-address', 1080);
    });
  }
  if (raw.hostsFile !== undefined) {
    if (raw.hostsFile.trim() === '') throw new UsageError('--hosts-file: empty file name');
    config.hostsFile = raw.hostsFile;
  }
  if (raw.handoverSocket !== undefined && raw.handoverSocket !== '') {
    if (raw.handoverSocket.trim() === '') throw new UsageError('--handover-socket: empty file name');
    config.handoverSocket = raw.handoverSocket;
  }
  if (proxyPortRange) config.proxyPortRange = proxyPortRange;
  if (raw.state) config.stateFile = raw.state;
  if (raw.hostnameOverride) config.hostnameOverride = raw.hostnameOverride;
  if (raw.kubeconfig) config.kubeconfig = raw.kubeconfig;
  if (raw.master) config.master = raw.master;
  if (config.emitEvents && config.stateFile) {
    throw new UsageError('--emit-events posts Events to the Kubernetes API, and --state serves a file: drop one of them');
  }
  if (config.stateFile && config.dialer === 'port-forward') {
    throw new UsageError('--dialer port-forward reaches pods through the API server: it needs a cluster (--kubeconfig), not --state');
  }
  // The port-forward dialer holds the cluster's credentials and its tunnels in this process.
  if (config.dialer === 'port-forward' && config.workers !== 1) {
    if (raw.workers !== undefined) throw new UsageError('--dialer port-forward serves from the proxy\'s own process: use --workers 1');
    config.workers = 1;
  }
  if (config.stateFile && config.namespaces.length > 0) {
    throw new UsageError('--namespace chooses what is watched in a cluster; --state serves its file whole: drop one of them');
  }
  if (config.minSyncPeriodMs > config.syncPeriodMs) {
    throw new UsageError(`--iptables-min-sync-period (${raw.iptablesMinSyncPeriod ?? `default ${DEFAULTS.iptablesMinSyncPeriod}`}) must not exceed --iptables-sync-period (${raw.iptablesSyncPeriod ?? `default ${DEFAULTS.iptablesSyncPeriod}`})`);
  }
  return config;
}
