import { readFile, writeFile } from 'node:fs/promises';
import { CORE_SCHEMA, dump, load, YAMLException } from 'js-yaml';
import { hostPort, isIP, parseCidrFlag, parseHostPort } from './core/address.js';
import { parseClusterDomain } from './core/cluster-names.js';
import { formatDuration, parseDuration } from './core/duration.js';
import { formatPortRange, parsePortRange } from './core/port-allocator.js';
import { AFTER_HANDOVER, DIALERS, parseWorkers, type OptionOrigins, type ProxyConfig, type RawOptions } from './config.js';
import { ProxyError, UsageError, errnoCode } from './core/errors.js';
import { PORTAL_MODES } from './seams/portal.js';
import { LOG_LEVELS } from './log.js';

/**
 * `--config FILE`: kube-proxy's own configuration file, a `KubeProxyConfiguration`
 * (`kubeproxy.config.k8s.io/v1alpha1`, staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go),
 * read into the same raw option values the flags produce, so that one validation (config.ts)
 * serves both and flags given on the command line override the file. That differs from kube-proxy
 * on purpose: it ignores most flags once --config is given, which its users keep reporting as a bug
 * (kubernetes#98302, #107156).
 *
 * Every field of kube-proxy's schema is known, so a file written for kube-proxy (kubeadm's
 * ConfigMap, `kube-proxy --write-config-to`) loads: the fields that have a meaning here are
 * applied, the others (conntrack, ipvs, nftables, masquerading...) are type-checked and ignored,
 * with one warning listing those set to something other than zero or kube-proxy's default.
 * Our own settings live under `kubeUserspaceProxy`, a field kube-proxy does not have.
 * A field that is in neither, or of the wrong type, is an error naming the field.
 *
 * Zero values mean "unset" for kube-proxy's fields, as kube-proxy's defaulting reads them
 * (`syncPeriod: 0s` is 30s, `minSyncPeriod: 0s` is 1s, `healthzBindAddress: ""` is
 * 0.0.0.0:10256). Under `kubeUserspaceProxy` an explicit zero is a value.
 */

export const KUBE_PROXY_CONFIG_API_VERSION = 'kubeproxy.config.k8s.io/v1alpha1';
export const KUBE_PROXY_CONFIG_KIND = 'KubeProxyConfiguration';
/** Our own fields: portal mode, state file and the rest kube-proxy has no field for. */
export const EXTENSION_FIELD = 'kubeUserspaceProxy';

export interface ConfigFileResult {
  /** The values the file sets, shaped as the flags hand them over; unset fields are absent. */
  options: RawOptions;
  /** At most one line: the ignored kube-proxy fields that carry a value. */
  warnings: string[];
  /** Where each option the file set came from, by option: `file: field.path`, for messages about its value. */
  origins: OptionOrigins;
}

type Leaf = 'string' | 'boolean' | 'integer' | 'number' | 'duration' | 'stringList' | 'boolMap' | 'opaque';
/** Runs after the type check, so the value has the field's type. */
type Apply = (value: unknown, at: string, out: RawOptions) => void;

interface Field {
  type: Leaf | Schema;
  /** Present on fields that apply here: validates the value and sets the raw option. */
  apply?: Apply;
  /** For ignored fields: kube-proxy's default, which does not earn a warning. */
  kubeProxyDefault?: unknown;
}

type Schema = { [name: string]: Field };

const ignored = (type: Leaf | Schema, kubeProxyDefault?: unknown): Field => (kubeProxyDefault === undefined ? { type } : { type, kubeProxyDefault });

/** A kube-proxy duration whose zero means "use the default". */
function durationOption(key: keyof RawOptions): Field {
  return { type: 'duration', apply: (v, _at, out) => { if (durationMs(v as string) > 0) setOption(out, key, v as string); } };
}

/** A kube-proxy string whose empty value means "use the default". */
function stringOption(key: keyof RawOptions, check?: (v: string, at: string) => void): Field {
  return {
    type: 'string',
    apply: (v, at, out) => {
      if (v === '') return;
      check?.(v as string, at);
      setOption(out, key, v as string);
    },
  };
}

function hostPortOption(key: keyof RawOptions, defaultPort: number): Field {
  return stringOption(key, (v, at) => parseHostPort(v, at, defaultPort));
}

const SCHEMA: Schema = {
  apiVersion: { type: 'string', apply: (v, at) => expectExactly(v as string, KUBE_PROXY_CONFIG_API_VERSION, at) },
  kind: { type: 'string', apply: (v, at) => expectExactly(v as string, KUBE_PROXY_CONFIG_KIND, at) },
  featureGates: ignored('boolMap'),
  clientConnection: {
    type: {
      kubeconfig: stringOption('kubeconfig'),
      acceptContentTypes: ignored('string'),
      contentType: ignored('string', 'application/vnd.kubernetes.protobuf'),
      qps: ignored('number', 5),
      burst: ignored('integer', 10),
    },
  },
  logging: ignored('opaque'),
  hostnameOverride: stringOption('hostnameOverride'),
  bindAddress: stringOption('bindAddress', (v, at) => {
    if (!isIP(v)) throw new UsageError(`${at}: "${v}" is not an IP address`);
  }),
  healthzBindAddress: hostPortOption('healthzBindAddress', 10256),
  metricsBindAddress: hostPortOption('metricsBindAddress', 10249),
  bindAddressHardFail: ignored('boolean'),
  enableProfiling: ignored('boolean'),
  showHiddenMetricsForVersion: ignored('string'),
  mode: {
    type: 'string',
    apply: (v, at) => {
      if (v !== '' && v !== 'userspace') {
        throw new UsageError(`${at}: "${String(v)}" is not supported: this proxy only runs in user space (leave ${at} empty or set it to "userspace")`);
      }
    },
  },
  iptables: {
    type: {
      syncPeriod: durationOption('iptablesSyncPeriod'),
      minSyncPeriod: durationOption('iptablesMinSyncPeriod'),
      masqueradeBit: ignored('integer', 14),
      masqueradeAll: ignored('boolean'),
      localhostNodePorts: ignored('boolean', true),
      snatNodeInternalIP: ignored('boolean'),
    },
  },
  ipvs: {
    type: {
      syncPeriod: ignored('duration', '30s'),
      minSyncPeriod: ignored('duration'),
      scheduler: ignored('string'),
      excludeCIDRs: ignored('stringList'),
      strictARP: ignored('boolean'),
      tcpTimeout: ignored('duration'),
      tcpFinTimeout: ignored('duration'),
      udpTimeout: ignored('duration'),
      ipSet: ignored('opaque'),
    },
  },
  nftables: {
    type: {
      masqueradeBit: ignored('integer', 14),
      masqueradeAll: ignored('boolean'),
      syncPeriod: ignored('duration', '30s'),
      minSyncPeriod: ignored('duration', '1s'),
    },
  },
  winkernel: {
    type: {
      networkName: ignored('string'),
      sourceVip: ignored('string'),
      enableDSR: ignored('boolean'),
      rootHnsEndpointName: ignored('string'),
      forwardHealthCheckVip: ignored('boolean'),
    },
  },
  detectLocalMode: ignored('string'),
  detectLocal: { type: { bridgeInterface: ignored('string'), interfaceNamePrefix: ignored('string') } },
  clusterCIDR: ignored('string'),
  nodePortAddresses: { type: 'stringList', apply: (v, at, out) => applyNodePortAddresses(v as string[], at, out) },
  oomScoreAdj: ignored('integer', -999),
  conntrack: {
    type: {
      maxPerCore: ignored('integer', 32768),
      min: ignored('integer', 131072),
      tcpEstablishedTimeout: ignored('duration', '24h0m0s'),
      tcpCloseWaitTimeout: ignored('duration', '1h0m0s'),
      tcpBeLiberal: ignored('boolean'),
      udpTimeout: ignored('duration'),
      udpStreamTimeout: ignored('duration'),
    },
  },
  configSyncPeriod: durationOption('configSyncPeriod'),
  // The userspace proxy's own fields, kept by kube-proxy's v1alpha1 until the mode was removed.
  portRange: stringOption('proxyPortRange', (v, at) => parsePortRange(v, at)),
  udpIdleTimeout: durationOption('udpTimeout'),
  windowsRunAsService: ignored('boolean'),
  [EXTENSION_FIELD]: {
    type: {
      portal: { type: 'string', apply: (v, at, out) => { out.portal = oneOf(v as string, PORTAL_MODES, at); } },
      stateFile: { type: 'string', apply: (v, _at, out) => { if (v !== '') out.state = v as string; } },
      shutdownGracePeriod: { type: 'duration', apply: (v, _at, out) => { out.shutdownGracePeriod = v as string; } },
      tcpKeepAlive: { type: 'duration', apply: (v, _at, out) => { out.tcpKeepalive = v as string; } },
      tcpIdleTimeout: { type: 'duration', apply: (v, _at, out) => { out.tcpIdleTimeout = v as string; } },
      maxUDPSessions: {
        type: 'integer',
        apply: (v, at, out) => {
          if ((v as number) < 1) throw new UsageError(`${at}: ${String(v)} is not a positive whole number`);
          out.maxUdpSessions = String(v);
        },
      },
      // A whole number or "auto": YAML hands over either type.
      workers: {
        type: 'opaque',
        apply: (v, at, out) => {
          if (typeof v !== 'string' && typeof v !== 'number') throw new UsageError(`${at}: expected a whole number or "auto", got ${describe(v)}`);
          out.workers = String(parseWorkers(String(v), at));
        },
      },
      serviceClusterIPRanges: {
        type: 'stringList',
        apply: (v, at, out) => {
          const list = v as string[];
          list.forEach((c, i) => parseCidrFlag(c, `${at}[${i}]`));
          if (list.length > 0) out.serviceClusterIpRange = list.join(',');
        },
      },
      logLevel: { type: 'string', apply: (v, at, out) => { out.logLevel = oneOf(v as string, LOG_LEVELS, at); } },
      dnsBindAddress: hostPortOption('dnsBindAddress', 53),
      socksBindAddress: hostPortOption('socksBindAddress', 1080),
      clusterDomain: stringOption('clusterDomain', (v, at) => parseClusterDomain(v, at)),
      hostsFile: stringOption('hostsFile'),
      handoverSocket: stringOption('handoverSocket'),
      afterHandover: { type: 'string', apply: (v, at, out) => { out.afterHandover = oneOf(v as string, AFTER_HANDOVER, at); } },
      outlierDetection: {
        type: {
          consecutiveFailures: countOption('outlierConsecutiveFailures'),
          baseEjectionTime: { type: 'duration', apply: (v, _at, out) => { out.outlierBaseEjectionTime = v as string; } },
          maxEjectionTime: { type: 'duration', apply: (v, _at, out) => { out.outlierMaxEjectionTime = v as string; } },
          maxEjectionPercent: countOption('outlierMaxEjectionPercent'),
        },
      },
      holdMaxPerServicePort: countOption('holdMaxPerServicePort'),
      holdMaxPerNode: countOption('holdMaxPerNode'),
      emitEvents: { type: 'boolean', apply: (v, _at, out) => { out.emitEvents = v as boolean; } },
      dialer: { type: 'string', apply: (v, at, out) => { out.dialer = oneOf(v as string, DIALERS, at); } },
      namespaces: { type: 'stringList', apply: (v, _at, out) => { if ((v as string[]).length > 0) out.namespaces = v as string[]; } },
    },
  },
};

/** One of our counts: a whole number, 0 included (its meaning is the flag's). */
function countOption(key: 'outlierConsecutiveFailures' | 'outlierMaxEjectionPercent' | 'holdMaxPerServicePort' | 'holdMaxPerNode'): Field {
  return {
    type: 'integer',
    apply: (v, at, out) => {
      if ((v as number) < 0) throw new UsageError(`${at}: ${String(v)} is not a whole number of 0 or more`);
      out[key] = String(v);
    },
  };
}

/**
 * kube-proxy's nodePortAddresses: CIDRs, or the keywords `all` (every address: what an empty
 * list means here too) and `localhost`. `primary` needs the Node's addresses, which this proxy
 * does not look up: refused rather than silently widened.
 */
function applyNodePortAddresses(list: string[], at: string, out: RawOptions): void {
  if (list.length === 0 || list.includes('all')) return;
  const cidrs: string[] = [];
  list.forEach((entry, i) => {
    if (entry === 'localhost') cidrs.push('127.0.0.0/8', '::1/128');
    else if (entry === 'primary') throw new UsageError(`${at}[${i}]: "primary" is not supported here; list the node's CIDRs instead`);
    else {
      parseCidrFlag(entry, `${at}[${i}]`);
      cidrs.push(entry);
    }
  });
  out.nodeportAddresses = cidrs.join(',');
}

/** Parses and validates a KubeProxyConfiguration. Pure; `file` only names it in errors. */
export function parseKubeProxyConfiguration(text: string, file: string): ConfigFileResult {
  let doc: unknown;
  try {
    doc = load(text, { schema: CORE_SCHEMA, filename: file });
  } catch (err) {
    if (err instanceof YAMLException) {
      const where = err.mark ? `:${err.mark.line + 1}:${err.mark.column + 1}` : '';
      throw new ProxyError('PARSE', `${file}${where}: ${err.reason}`, { cause: err });
    }
    throw err;
  }
  if (!isRecord(doc)) throw new UsageError(`${file}: expected a ${KUBE_PROXY_CONFIG_KIND} object, got ${describe(doc)}`);
  for (const required of ['apiVersion', 'kind']) {
    if (doc[required] === undefined) throw new UsageError(`${file}: ${required}: missing (expected ${required === 'kind' ? KUBE_PROXY_CONFIG_KIND : KUBE_PROXY_CONFIG_API_VERSION})`);
  }
  const options: RawOptions = {};
  const ignoredSet: string[] = [];
  const fields: Record<string, string> = {};
  try {
    walk(doc, SCHEMA, '', options, ignoredSet, fields);
  } catch (err) {
    if (err instanceof UsageError) throw new UsageError(`${file}: ${err.message}`, { cause: err });
    throw err;
  }
  const warnings = ignoredSet.length > 0 ? [`${file}: ignored, as they have no meaning for a userspace proxy: ${ignoredSet.join(', ')}`] : [];
  const origins: OptionOrigins = {};
  for (const [key, at] of Object.entries(fields)) origins[key as keyof RawOptions] = `${file}: ${at}`;
  return { options, warnings, origins };
}

/** `fields`: for each option a field set, that field's path. */
function walk(obj: unknown, schema: Schema, path: string, out: RawOptions, ignoredSet: string[], fields: Record<string, string>): void {
  if (!isRecord(obj)) throw new UsageError(`${path}: expected an object, got ${describe(obj)}`);
  for (const [name, value] of Object.entries(obj)) {
    const at = path === '' ? name : `${path}.${name}`;
    const field = Object.hasOwn(schema, name) ? schema[name] : undefined;
    if (field === undefined) throw new UsageError(`${at}: unknown field`);
    // Go decodes null into a field as "not set".
    if (value === null) continue;
    if (typeof field.type === 'object') {
      walk(value, field.type, at, out, ignoredSet, fields);
      continue;
    }
    checkType(value, field.type, at);
    if (field.apply) {
      const before: Record<string, unknown> = { ...out };
      field.apply(value, at, out);
      for (const [key, v] of Object.entries(out)) if (v !== before[key]) fields[key] = at;
    } else if (!isZeroOrDefault(value, field)) ignoredSet.push(at);
  }
}

function checkType(value: unknown, type: Leaf, at: string): void {
  const fail = (expected: string): never => {
    throw new UsageError(`${at}: expected ${expected}, got ${describe(value)}`);
  };
  switch (type) {
    case 'string':
      if (typeof value !== 'string') fail('a string');
      return;
    case 'boolean':
      if (typeof value !== 'boolean') fail('true or false');
      return;
    case 'integer':
      if (typeof value !== 'number' || !Number.isInteger(value)) fail('a whole number');
      return;
    case 'number':
      if (typeof value !== 'number') fail('a number');
      return;
    case 'duration':
      if (typeof value !== 'string') fail('a duration string such as "30s"');
      parseDuration(value as string, at);
      return;
    case 'stringList':
      if (!Array.isArray(value)) fail('a list of strings');
      (value as unknown[]).forEach((v, i) => {
        if (typeof v !== 'string') throw new UsageError(`${at}[${i}]: expected a string, got ${describe(v)}`);
      });
      return;
    case 'boolMap':
      if (!isRecord(value)) fail('a map of names to true or false');
      for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
        if (typeof v !== 'boolean') throw new UsageError(`${at}.${k}: expected true or false, got ${describe(v)}`);
      }
      return;
    case 'opaque':
      return;
  }
}

function isZeroOrDefault(value: unknown, field: Field): boolean {
  if (field.type === 'opaque') return true;
  if (value === '' || value === 0 || value === false) return true;
  if (Array.isArray(value)) return value.length === 0;
  if (isRecord(value)) return Object.keys(value).length === 0;
  if (field.type === 'duration' && durationMs(value as string) === 0) return true;
  const d = field.kubeProxyDefault;
  if (d === undefined) return false;
  if (field.type === 'duration') return durationMs(value as string) === durationMs(d as string);
  return value === d;
}

function durationMs(text: string): number {
  return parseDuration(text, 'duration');
}

function expectExactly(value: string, expected: string, at: string): void {
  if (value !== expected) throw new UsageError(`${at}: "${value}" is not supported (expected ${expected})`);
}

function oneOf<T extends string>(value: string, allowed: readonly T[], at: string): T {
  if (!(allowed as readonly string[]).includes(value)) throw new UsageError(`${at}: "${value}" is not one of ${allowed.join(', ')}`);
  return value as T;
}

function setOption(out: RawOptions, key: keyof RawOptions, value: string): void {
  (out as Record<string, unknown>)[key] = value;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'an object';
  if (typeof v === 'string') return `string ${JSON.stringify(v)}`;
  // What is left is a number, boolean, bigint or undefined: String() says it as written.
  // eslint-disable-next-line @typescript-eslint/no-base-to-string
  return `${typeof v} ${String(v)}`;
}

/** Reads `--config FILE`. A file that cannot be read is a user error naming it. */
export async function readConfigFile(path: string): Promise<ConfigFileResult> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new UsageError(`--config: cannot read ${path}: ${errnoCode(err) ?? String(err)}`, { cause: err });
  }
  return parseKubeProxyConfiguration(text, path);
}

/** The flags given win over the file's values (kube-proxy would ignore them: see the top of this file). */
export function mergeOptions(file: RawOptions, flags: RawOptions): RawOptions {
  return { ...file, ...flags };
}

/**
 * The options main builds the config from: the flags alone, or, with `--config`, the file's
 * values under the flags. Warnings are for the caller's logger.
 */
export async function resolveOptions(flags: RawOptions): Promise<ConfigFileResult> {
  if (flags.config === undefined) return { options: flags, warnings: [], origins: {} };
  const file = await readConfigFile(flags.config);
  // A flag given wins over the file: its value is the flag's to name.
  const origins: OptionOrigins = {};
  for (const [key, at] of Object.entries(file.origins)) if ((flags as Record<string, unknown>)[key] === undefined) origins[key as keyof RawOptions] = at;
  return { options: mergeOptions(file.options, flags), warnings: file.warnings, origins };
}

/** The effective configuration as a KubeProxyConfiguration object (what --write-config-to writes). */
export function toKubeProxyConfiguration(config: ProxyConfig): Record<string, unknown> {
  return {
    apiVersion: KUBE_PROXY_CONFIG_API_VERSION,
    kind: KUBE_PROXY_CONFIG_KIND,
    mode: 'userspace',
    bindAddress: config.bindAddress,
    healthzBindAddress: hostPort(config.healthzBindAddress),
    metricsBindAddress: hostPort(config.metricsBindAddress),
    hostnameOverride: config.hostnameOverride ?? '',
    clientConnection: { kubeconfig: config.kubeconfig ?? '' },
    iptables: {
      syncPeriod: formatDuration(config.syncPeriodMs),
      // kube-proxy reads 0 as "the default" (1s): a zero minimum cannot round-trip through a file.
      minSyncPeriod: formatDuration(config.minSyncPeriodMs),
    },
    configSyncPeriod: formatDuration(config.configSyncPeriodMs),
    nodePortAddresses: config.nodePortAddresses,
    portRange: config.proxyPortRange ? formatPortRange(config.proxyPortRange) : '',
    udpIdleTimeout: formatDuration(config.udpIdleTimeoutMs),
    [EXTENSION_FIELD]: {
      portal: config.portal,
      stateFile: config.stateFile ?? '',
      shutdownGracePeriod: formatDuration(config.shutdownGracePeriodMs),
      tcpKeepAlive: formatDuration(config.tcpKeepAliveMs),
      tcpIdleTimeout: formatDuration(config.tcpIdleTimeoutMs),
      maxUDPSessions: config.maxUdpSessions,
      workers: config.workers,
      serviceClusterIPRanges: config.serviceClusterIPRanges,
      logLevel: config.logLevel,
      dnsBindAddress: config.dnsBindAddress ? hostPort(config.dnsBindAddress) : '',
      socksBindAddress: config.socksBindAddress ? hostPort(config.socksBindAddress) : '',
      clusterDomain: config.clusterDomain,
      hostsFile: config.hostsFile ?? '',
      handoverSocket: config.handoverSocket ?? '',
      afterHandover: config.afterHandover,
      outlierDetection: {
        consecutiveFailures: config.outlier.consecutiveFailures,
        baseEjectionTime: formatDuration(config.outlier.baseEjectionMs),
        maxEjectionTime: formatDuration(config.outlier.maxEjectionMs),
        maxEjectionPercent: config.outlier.maxEjectionPercent,
      },
      holdMaxPerServicePort: config.holdMaxPerServicePort,
      holdMaxPerNode: config.holdMaxPerNode,
      emitEvents: config.emitEvents,
      dialer: config.dialer,
      namespaces: config.namespaces,
    },
  };
}

export function renderKubeProxyConfiguration(config: ProxyConfig): string {
  return dump(toKubeProxyConfiguration(config), { schema: CORE_SCHEMA, lineWidth: -1, noRefs: true });
}

/** `--write-config-to FILE`. */
export async function writeConfigFile(path: string, config: ProxyConfig): Promise<void> {
  try {
    await writeFile(path, renderKubeProxyConfiguration(config));
  } catch (err) {
    throw new UsageError(`--write-config-to: cannot write ${path}: ${errnoCode(err) ?? String(err)}`, { cause: err });
  }
}
