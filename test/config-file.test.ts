import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { buildConfig, type OptionOrigins, type RawOptions } from '../src/config.js';
import { ProxyError, UsageError } from '../src/core/errors.js';
import { parseKubeProxyConfiguration, renderKubeProxyConfiguration, resolveOptions } from '../src/kube-proxy-config.js';
import { runCli, type Spawned } from './helpers/cli.js';

/** `--config FILE` (a KubeProxyConfiguration) and `--write-config-to FILE`. */

const HEAD = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n';

function parse(body: string): { options: RawOptions; warnings: string[]; origins: OptionOrigins } {
  return parseKubeProxyConfiguration(HEAD + body, 'proxy.yaml');
}

function errorOf(fn: () => unknown): Error {
  try {
    fn();
  } catch (err) {
    return err as Error;
  }
  throw new Error('expected an error');
}

let dir: string;
const running: Spawned[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-config-'));
});

afterAll(async () => {
  for (const r of running) r.kill();
  await rm(dir, { recursive: true, force: true });
});

describe('a valid KubeProxyConfiguration', () => {
  it('sets every field that applies, in the flags\' vocabulary', () => {
    const { options, warnings } = parse(`
mode: userspace
bindAddress: 10.0.0.5
healthzBindAddress: 0.0.0.0:10266
metricsBindAddress: 127.0.0.1
hostnameOverride: node-a
portRange: 30000-30100
udpIdleTimeout: 1s
configSyncPeriod: 5m
nodePortAddresses: [10.0.0.0/8, localhost]
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
iptables:
  syncPeriod: 1m0s
  minSyncPeriod: 2s
kubeUserspaceProxy:
  portal: iptables
  stateFile: /etc/state.yaml
  shutdownGracePeriod: 0s
  maxUDPSessions: 100
  serviceClusterIPRanges: [10.96.0.0/12]
  logLevel: debug
`);
    expect(warnings).toEqual([]);
    expect(options).toEqual({
      bindAddress: '10.0.0.5',
      healthzBindAddress: '0.0.0.0:10266',
      metricsBindAddress: '127.0.0.1',
      hostnameOverride: 'node-a',
      proxyPortRange: '30000-30100',
      udpTimeout: '1s',
      configSyncPeriod: '5m',
      nodeportAddresses: '10.0.0.0/8,127.0.0.0/8,::1/128',
      kubeconfig: '/var/lib/kube-proxy/kubeconfig.conf',
      iptablesSyncPeriod: '1m0s',
      iptablesMinSyncPeriod: '2s',
      portal: 'iptables',
      state: '/etc/state.yaml',
      shutdownGracePeriod: '0s',
      maxUdpSessions: '100',
      serviceClusterIpRange: '10.96.0.0/12',
      logLevel: 'debug',
    });
    const config = buildConfig(options);
    expect(config).toMatchObject({
      metricsBindAddress: { host: '127.0.0.1', port: 10249 },
      healthzBindAddress: { host: '0.0.0.0', port: 10266 },
      syncPeriodMs: 60_000,
      minSyncPeriodMs: 2000,
      configSyncPeriodMs: 300_000,
      shutdownGracePeriodMs: 0,
      proxyPortRange: { base: 30000, size: 101 },
    });
  });

  it('reads kube-proxy\'s zero values as "use the default", as kube-proxy\'s defaulting does', () => {
    const { options } = parse(`
mode: ""
bindAddress: ""
healthzBindAddress: ""
hostnameOverride: ""
portRange: ""
udpIdleTimeout: 0s
configSyncPeriod: 0s
nodePortAddresses: null
iptables: { syncPeriod: 0s, minSyncPeriod: 0s, masqueradeBit: null }
`);
    expect(options).toEqual({});
    expect(buildConfig(options)).toMatchObject({ syncPeriodMs: 30_000, minSyncPeriodMs: 1000, udpIdleTimeoutMs: 250 });
  });

  it('loads the file kube-proxy itself writes, warning once about the fields it ignores', () => {
    // `kube-proxy --write-config-to` output (pkg/proxy/apis/config/scheme/testdata), with two values changed.
    const { options, warnings } = parse(`
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection: { acceptContentTypes: "", burst: 10, contentType: application/vnd.kubernetes.protobuf, kubeconfig: "", qps: 5 }
clusterCIDR: ""
configSyncPeriod: 15m0s
conntrack: { maxPerCore: 65536, min: 131072, tcpBeLiberal: false, tcpCloseWaitTimeout: 1h0m0s, tcpEstablishedTimeout: 24h0m0s, udpStreamTimeout: 0s, udpTimeout: 0s }
detectLocal: { bridgeInterface: "", interfaceNamePrefix: "" }
detectLocalMode: ""
enableProfiling: false
featureGates: {}
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables: { localhostNodePorts: true, masqueradeAll: true, masqueradeBit: 14, minSyncPeriod: 1s, syncPeriod: 30s }
ipvs: { excludeCIDRs: null, minSyncPeriod: 0s, scheduler: "", strictARP: false, syncPeriod: 0s, tcpFinTimeout: 0s, tcpTimeout: 0s, udpTimeout: 0s }
logging: { flushFrequency: 5s, format: text, options: { json: { infoBufferSize: "0" } }, verbosity: 0 }
metricsBindAddress: 127.0.0.1:10249
mode: ""
nftables: { masqueradeAll: false, masqueradeBit: 14, minSyncPeriod: 0s, syncPeriod: 0s }
nodePortAddresses: null
oomScoreAdj: -999
portRange: ""
showHiddenMetricsForVersion: ""
winkernel: { enableDSR: false, forwardHealthCheckVip: false, networkName: "", rootHnsEndpointName: "", sourceVip: "" }
`);
    expect(warnings).toEqual(['proxy.yaml: ignored, as they have no meaning for a userspace proxy: conntrack.maxPerCore, iptables.masqueradeAll']);
    expect(buildConfig(options)).toMatchObject({ syncPeriodMs: 30_000, healthzBindAddress: { host: '0.0.0.0', port: 10256 } });
  });

  it('accepts JSON too', () => {
    const { options } = parseKubeProxyConfiguration('{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","iptables":{"syncPeriod":"10s"}}', 'p.json');
    expect(options).toEqual({ iptablesSyncPeriod: '10s' });
  });
});

describe('an invalid KubeProxyConfiguration is one error naming the file and the field', () => {
  it.each([
    ['iptables:\n  syncPeriodd: 30s\n', /^proxy\.yaml: iptables\.syncPeriodd: unknown field$/],
    ['kubeUserspaceProxy:\n  portals: bind\n', /^proxy\.yaml: kubeUserspaceProxy\.portals: unknown field$/],
    ['colour: blue\n', /^proxy\.yaml: colour: unknown field$/],
    ['iptables:\n  syncPeriod: 30\n', /^proxy\.yaml: iptables\.syncPeriod: expected a duration string such as "30s", got number 30$/],
    ['iptables:\n  syncPeriod: soon\n', /^proxy\.yaml: iptables\.syncPeriod: invalid duration "soon"/],
    ['iptables: 30s\n', /^proxy\.yaml: iptables: expected an object, got string "30s"$/],
    ['nodePortAddresses: 10.0.0.0/8\n', /^proxy\.yaml: nodePortAddresses: expected a list of strings, got string/],
    ['nodePortAddresses: [10.0.0.0/8, 10.1.0.0]\n', /^proxy\.yaml: nodePortAddresses\[1\]: "10\.1\.0\.0" is not a CIDR/],
    ['kubeUserspaceProxy:\n  maxUDPSessions: "100"\n', /^proxy\.yaml: kubeUserspaceProxy\.maxUDPSessions: expected a whole number, got string "100"$/],
    ['kubeUserspaceProxy:\n  portal: ipvs\n', /^proxy\.yaml: kubeUserspaceProxy\.portal: "ipvs" is not one of loopback, bind, iptables$/],
    ['conntrack:\n  maxPerCore: lots\n', /^proxy\.yaml: conntrack\.maxPerCore: expected a whole number, got string "lots"$/],
    ['featureGates:\n  Foo: "yes"\n', /^proxy\.yaml: featureGates\.Foo: expected true or false, got string "yes"$/],
    ['mode: iptables\n', /^proxy\.yaml: mode: "iptables" is not supported: this proxy only runs in user space/],
    ['metricsBindAddress: "localhost:x"\n', /^proxy\.yaml: metricsBindAddress: port "x"/],
    ['bindAddress: eth0\n', /^proxy\.yaml: bindAddress: "eth0" is not an IP address$/],
    ['portRange: 9000-8000\n', /^proxy\.yaml: portRange: invalid port range "9000-8000"/],
  ])('%j', (body, re) => {
    const err = errorOf(() => parse(body));
    expect(err).toBeInstanceOf(UsageError);
    expect(err.message).toMatch(re);
  });

  it('checks apiVersion and kind', () => {
    expect(errorOf(() => parseKubeProxyConfiguration('kind: KubeProxyConfiguration\n', 'p.yaml')).message).toBe('p.yaml: apiVersion: missing (expected kubeproxy.config.k8s.io/v1alpha1)');
    expect(errorOf(() => parseKubeProxyConfiguration('apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n', 'p.yaml')).message).toMatch(/^p\.yaml: apiVersion: "kubeproxy\.config\.k8s\.io\/v1alpha2" is not supported/);
    expect(errorOf(() => parseKubeProxyConfiguration(`${HEAD.split('\n')[0]}\nkind: KubeletConfiguration\n`, 'p.yaml')).message).toMatch(/^p\.yaml: kind: "KubeletConfiguration" is not supported/);
  });

  it('reports a YAML syntax error with its line and column', () => {
    const err = errorOf(() => parse('iptables:\n  syncPeriod: [30s\n'));
    expect(err).toBeInstanceOf(ProxyError);
    expect((err as ProxyError).code).toBe('PARSE');
    expect(err.message).toMatch(/^proxy\.yaml:\d+:\d+: /);
  });
});

describe('flags and the file', () => {
  it('flags given on the command line override the file; the file overrides the defaults', async () => {
    const file = join(dir, 'override.yaml');
    await writeFile(file, `${HEAD}iptables:\n  syncPeriod: 1m\n  minSyncPeriod: 5s\nudpIdleTimeout: 2s\nkubeUserspaceProxy:\n  portal: loopback\n`);
    const cli = parseCommandLine(['--config', file, '--iptables-sync-period', '2m', '--udp-timeout', '3s']);
    if (cli.kind !== 'run') throw new Error('expected options');
    const { options } = await resolveOptions(cli.options);
    const config = buildConfig(options);
    expect(config.syncPeriodMs).toBe(120_000); // flag
    expect(config.udpIdleTimeoutMs).toBe(3000); // flag
    expect(config.minSyncPeriodMs).toBe(5000); // file
    expect(config.shutdownGracePeriodMs).toBe(10_000); // default
  });

  it('takes the TCP keepalive and idle limit under kubeUserspaceProxy, where an explicit 0s is a value', () => {
    const { options } = parse('kubeUserspaceProxy:\n  tcpKeepAlive: 0s\n  tcpIdleTimeout: 30m\n');
    expect(options).toEqual({ tcpKeepalive: '0s', tcpIdleTimeout: '30m' });
    expect(buildConfig(options)).toMatchObject({ tcpKeepAliveMs: 0, tcpIdleTimeoutMs: 1_800_000 });
    const written = buildConfig({ tcpKeepalive: '20s', tcpIdleTimeout: '1h' });
    expect(buildConfig(parseKubeProxyConfiguration(renderKubeProxyConfiguration(written), 'written.yaml').options)).toEqual(written);
  });

  it('a value from the file that is out of range is named by its file and field, not by a flag never given', async () => {
    const fromFile = (body: string): string => {
      const { options, origins } = parseKubeProxyConfiguration(HEAD + body, 'proxy.yaml');
      return errorOf(() => buildConfig(options, origins)).message;
    };
    expect(fromFile('iptables:\n  minSyncPeriod: 1m\n')).toBe('proxy.yaml: iptables.minSyncPeriod (1m) must not exceed --iptables-sync-period (default 30s)');
    expect(fromFile('udpIdleTimeout: 500us\n')).toBe('proxy.yaml: udpIdleTimeout: 500us is too short (at least 1ms)');
    expect(fromFile('kubeUserspaceProxy:\n  outlierDetection:\n    maxEjectionTime: 10s\n')).toBe('proxy.yaml: kubeUserspaceProxy.outlierDetection.maxEjectionTime (10s) must not be shorter than --outlier-base-ejection-time (default 30s)');
    // A flag given wins over the file, and its message names the flag.
    const file = join(dir, 'origins.yaml');
    await writeFile(file, `${HEAD}udpIdleTimeout: 2s\niptables:\n  minSyncPeriod: 1m\n`);
    const cli = parseCommandLine(['--config', file, '--iptables-min-sync-period', '2m', '--udp-timeout', '500us']);
    if (cli.kind !== 'run') throw new Error('expected options');
    const { options, origins } = await resolveOptions(cli.options);
    expect(errorOf(() => buildConfig(options, origins)).message).toBe('--udp-timeout: 500us is too short (at least 1ms)');
    expect(errorOf(() => buildConfig({ ...options, udpTimeout: '1s' }, origins)).message).toBe('--iptables-min-sync-period (2m) must not exceed --iptables-sync-period (default 30s)');
  });

  it('a missing file is a user error naming it', async () => {
    await expect(resolveOptions({ config: join(dir, 'absent.yaml') })).rejects.toThrow(/--config: cannot read .*absent\.yaml: ENOENT/);
  });

  it('what --write-config-to writes reads back to the same configuration', () => {
    const config = buildConfig({ portal: 'iptables', iptablesSyncPeriod: '45s', iptablesMinSyncPeriod: '2s', proxyPortRange: '30000+99', nodeportAddresses: '10.0.0.0/8', shutdownGracePeriod: '0s', healthzBindAddress: '[::]:10256', hostnameOverride: 'n1' });
    const text = renderKubeProxyConfiguration(config);
    expect(text).toMatch(/^apiVersion: kubeproxy\.config\.k8s\.io\/v1alpha1\nkind: KubeProxyConfiguration\n/);
    expect(buildConfig(parseKubeProxyConfiguration(text, 'written.yaml').options)).toEqual(config);
  });
});

describe('the CLI', () => {
  it('--write-config-to writes the effective configuration and exits 0', async () => {
    const file = join(dir, 'in.yaml');
    const out = join(dir, 'out.yaml');
    await writeFile(file, `${HEAD}iptables:\n  syncPeriod: 1m\nkubeUserspaceProxy:\n  maxUDPSessions: 7\n`);
    const r = runCli(['--config', file, '--udp-timeout', '3s', '--write-config-to', out]);
    running.push(r);
    expect(await r.exited).toBe(0);
    const written = parseKubeProxyConfiguration(await readFile(out, 'utf8'), out);
    expect(buildConfig(written.options)).toMatchObject({ syncPeriodMs: 60_000, udpIdleTimeoutMs: 3000, maxUdpSessions: 7 });
  });

  it('a bad field in --config prints one line naming it and exits 2', async () => {
    const file = join(dir, 'bad.yaml');
    await writeFile(file, `${HEAD}iptables:\n  syncPeriod: 30\n`);
    const r = runCli(['--config', file]);
    running.push(r);
    expect(await r.exited).toBe(2);
    const lines = r.stderr().trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/bad\.yaml: iptables\.syncPeriod: expected a duration string/);
  });

  it('a value in --config out of its range is named by the file and field, in one line, exit 2', async () => {
    const file = join(dir, 'range.yaml');
    await writeFile(file, `${HEAD}udpIdleTimeout: 500us\n`);
    const r = runCli(['--config', file]);
    running.push(r);
    expect(await r.exited).toBe(2);
    expect(r.stderr().trim()).toMatch(/^kube-userspace-proxy: .*range\.yaml: udpIdleTimeout: 500us is too short \(at least 1ms\)$/);
  });
});
