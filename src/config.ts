import { isIP, parseCidrFlag, parseHostPort, type HostPort } from './core/address.js';
import { parseDuration } from './core/duration.js';
import { parsePortRange, type PortRange } from './core/port-allocator.js';
import { UsageError } from './core/errors.js';
import { LOG_LEVELS } from './log.js';
import { PORTAL_MODES, type PortalMode } from './seams/portal.js';
import type { LevelWithSilent } from 'pino';

/** How endpoints are reached: a TCP connect to the endpoint, or a stream through the API server's pods/portforward. */
export const DIALERS = ['direct', 'port-forward'] as const;
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
  /** Bound on UDP sessions per service port. */
  maxUdpSessions: number;
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
  configSyncPeriod?: string;
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
  dialer: 'direct' as DialerKind,
};

function flag(name: string, fn: () => unknown): void {
  try {
    fn();
  } catch (err) {
    if (err instanceof UsageError) throw new UsageError(`--${name}: ${err.message.replace(/^[^:]*: /, '')}`);
    throw err;
  }
}

function duration(name: string, value: string, min = 0): number {
  let ms = 0;
  flag(name, () => {
    ms = parseDuration(value, name);
  });
  if (ms < min) throw new UsageError(`--${name}: ${value} is too short (at least ${min}ms)`);
  return ms;
}

/** TCP_KEEPIDLE counts whole seconds: 0 turns keepalive off, anything else is rounded up to a second. */
function keepAlive(value: string): number {
  const ms = duration('tcp-keepalive', value);
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

/** A namespace is a DNS-1123 label: lower-case letters, digits and '-', at most 63, alphanumeric at both ends. */
function namespaceList(names: readonly string[]): string[] {
  for (const n of names) {
    if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(n)) {
      throw new UsageError(`--namespace: "${n}" is not a namespace name (lower-case letters, digits and '-', at most 63 characters)`);
    }
  }
  return [...new Set(names)];
}

/** Options (flags, later merged with a config file) -> validated ProxyConfig. Pure. */
export function buildConfig(raw: RawOptions): ProxyConfig {
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
    dialer: oneOf('dialer', raw.dialer ?? DEFAULTS.dialer, DIALERS),
    namespaces: namespaceList(raw.namespaces ?? []),
    cleanup: raw.cleanup ?? false,
  };
  if (proxyPortRange) config.proxyPortRange = proxyPortRange;
  if (raw.state) config.stateFile = raw.state;
  if (raw.hostnameOverride) config.hostnameOverride = raw.hostnameOverride;
  if (raw.kubeconfig) config.kubeconfig = raw.kubeconfig;
  if (raw.master) config.master = raw.master;
  if (config.stateFile && config.dialer === 'port-forward') {
    throw new UsageError('--dialer port-forward reaches pods through the API server: it needs a cluster (--kubeconfig), not --state');
  }
  if (config.stateFile && config.namespaces.length > 0) {
    throw new UsageError('--namespace chooses what is watched in a cluster; --state serves its file whole: drop one of them');
  }
  if (config.minSyncPeriodMs > config.syncPeriodMs) {
    throw new UsageError(`--iptables-min-sync-period (${raw.iptablesMinSyncPeriod ?? `default ${DEFAULTS.iptablesMinSyncPeriod}`}) must not exceed --iptables-sync-period (${raw.iptablesSyncPeriod ?? `default ${DEFAULTS.iptablesSyncPeriod}`})`);
  }
  return config;
}
