import { execFile, spawnSync } from 'node:child_process';
import { Resolver } from 'node:dns/promises';
import { mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startProxy, type RunningProxy } from '../src/app.js';
import { buildConfig } from '../src/config.js';
import { HOSTS_BEGIN, HOSTS_END } from '../src/core/hosts-block.js';
import { parseKubeProxyConfiguration, renderKubeProxyConfiguration } from '../src/kube-proxy-config.js';
import { silentLogger } from '../src/log.js';
import { runCli, type Spawned } from './helpers/cli.js';
import { freePort, tcpEchoServer, tcpRequest, waitFor } from './helpers/net.js';
import { endpointSlice, list, service } from './helpers/objects.js';

/**
 * Service names end to end: a state file -> the sync loop -> the directory -> the DNS responder
 * (asked by dig and by Node's resolver) and the hosts-file block; then the CLI as a black box:
 * the lines it prints, the block removed on SIGTERM and by --cleanup, its flags.
 */
const run = promisify(execFile);
const HAVE_DIG = spawnSync('dig', ['-v']).status === 0;

let dir: string;
let stateFile: string;
let hostsFile: string;
let backendPort: number;
let webPort: number;
const closers: Array<() => unknown> = [];
const HOSTS_BEFORE = '127.0.0.1 localhost\n# a line the proxy must not touch\n::1 localhost ip6-localhost';

function objects(opts: { withApi?: boolean } = {}): string {
  const items: unknown[] = [
    service({ name: 'web', clusterIP: '10.96.41.10', ports: [{ name: 'http', port: webPort }] }),
    endpointSlice({ service: 'web', ports: [{ name: 'http', port: backendPort }], endpoints: [{ ip: '127.0.41.1' }] }),
  ];
  if (opts.withApi) {
    items.push(
      service({ name: 'api', namespace: 'shop', clusterIP: '10.96.41.11', ports: [{ name: 'grpc', port: 9090 }] }),
      endpointSlice({ service: 'api', namespace: 'shop', ports: [{ name: 'grpc', port: backendPort }], endpoints: [{ ip: '127.0.41.1' }] }),
    );
  }
  return list(items);
}

async function writeState(text: string): Promise<void> {
  const tmp = `${stateFile}.tmp`;
  await writeFile(tmp, text);
  await rename(tmp, stateFile);
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-names-'));
  stateFile = join(dir, 'state.json');
  hostsFile = join(dir, 'hosts');
  webPort = await freePort('127.96.41.10');
  backendPort = await freePort('127.0.41.1');
  const echo = await tcpEchoServer('127.0.41.1', 'web', backendPort);
  closers.push(() => echo.close());
  await writeState(objects());
  await writeFile(hostsFile, HOSTS_BEFORE);
});

afterAll(async () => {
  for (const c of closers) await c();
  await rm(dir, { recursive: true, force: true });
});

describe('Service names, in-process', () => {
  let proxy: RunningProxy;
  let dnsPort: number;

  beforeAll(async () => {
    const config = buildConfig({ state: stateFile, metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', iptablesMinSyncPeriod: '0s', logLevel: 'silent', dnsBindAddress: '127.0.0.1:0', hostsFile });
    proxy = await startProxy(config, silentLogger());
    closers.unshift(() => proxy.stop(100));
    dnsPort = Number(proxy.names.dnsAddress?.split(':')[1]);
  });

  function resolver(): Resolver {
    const r = new Resolver({ timeout: 2000, tries: 1 });
    r.setServers([`127.0.0.1:${dnsPort}`]);
    return r;
  }

  it('answers a Service\'s name with its loopback address, where the proxy serves it', async () => {
    const [address] = await resolver().resolve4('web.default.svc.cluster.local');
    expect(address).toBe('127.96.41.10');
    expect(await tcpRequest(address!, webPort, 'hi')).toBe('web:hi');
    expect(proxy.names.directory.resolve('web.default', webPort, 'TCP')).toEqual({ host: '127.96.41.10', port: webPort });
  });

  it.skipIf(!HAVE_DIG)(HAVE_DIG ? 'answers dig over UDP and TCP' : 'answers dig over UDP and TCP: skipped, dig not found (apt-get install bind9-dnsutils)', async () => {
    const dig = async (...args: string[]): Promise<string> => (await run('dig', ['@127.0.0.1', '-p', String(dnsPort), '+time=2', '+tries=1', '+short', ...args])).stdout.trim();
    expect(await dig('web.default.svc.cluster.local')).toBe('127.96.41.10');
    expect(await dig('+tcp', 'web.default.svc')).toBe('127.96.41.10');
    expect(await dig('SRV', '_http._tcp.web.default.svc.cluster.local')).toBe(`0 100 ${webPort} web.default.svc.cluster.local.`);
  });

  it('writes the hosts-file block after the other lines', async () => {
    await waitFor(async () => (await readFile(hostsFile, 'utf8')).includes(HOSTS_END), 'the hosts-file block');
    expect(await readFile(hostsFile, 'utf8')).toBe(`${HOSTS_BEFORE}\n${HOSTS_BEGIN}\n127.96.41.10 web.default.svc.cluster.local web.default.svc web.default\n${HOSTS_END}`);
  });

  it('follows Services as they come and go: DNS answers and the hosts-file block', async () => {
    const r = resolver();
    await expect(r.resolve4('api.shop.svc.cluster.local')).rejects.toMatchObject({ code: 'ENOTFOUND' });
    await writeState(objects({ withApi: true }));
    expect(await waitFor(() => r.resolve4('api.shop.svc.cluster.local').catch(() => undefined), 'api.shop to resolve')).toEqual(['127.96.41.11']);
    expect(await r.resolveSrv('_grpc._tcp.api.shop.svc.cluster.local')).toMatchObject([{ name: 'api.shop.svc.cluster.local', port: 9090 }]);
    await waitFor(async () => (await readFile(hostsFile, 'utf8')).includes('api.shop.svc'), 'the block to list api.shop');
    expect(await readFile(hostsFile, 'utf8')).toBe(
      `${HOSTS_BEFORE}\n${HOSTS_BEGIN}\n127.96.41.10 web.default.svc.cluster.local web.default.svc web.default\n127.96.41.11 api.shop.svc.cluster.local api.shop.svc api.shop\n${HOSTS_END}`,
    );
    await writeState(objects());
    await waitFor(() => r.resolve4('api.shop.svc.cluster.local').then(() => false, (err: NodeJS.ErrnoException) => err.code === 'ENOTFOUND'), 'api.shop to be gone');
    await waitFor(async () => !(await readFile(hostsFile, 'utf8')).includes('api.shop.svc'), 'the block to drop api.shop');
  });

  it('takes the block out when it stops, leaving the file as it was, byte for byte', async () => {
    await proxy.stop(100);
    closers.shift();
    expect(await readFile(hostsFile, 'utf8')).toBe(HOSTS_BEFORE);
  });
});

describe('Service names, from the command line', () => {
  let cli: Spawned | undefined;

  afterAll(() => cli?.kill());

  it('prints how to use the names, and removes the block on SIGTERM', async () => {
    const dnsPort = await freePort('127.0.0.1');
    cli = runCli(['--state', stateFile, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--dns-bind-address', `127.0.0.1:${dnsPort}`, '--cluster-domain', 'Cluster.Local.', '--hosts-file', hostsFile]);
    const line = await cli.waitForLine(/kube-userspace-proxy started/);
    expect(JSON.parse(line)).toMatchObject({ dns: `127.0.0.1:${dnsPort}` });
    await waitFor(() => cli!.stderr().includes('kept in'), 'the lines for the user');
    const hints = cli.stderr();
    expect(hints).toContain(`dig @127.0.0.1 -p ${dnsPort} web.default.svc.cluster.local`);
    expect(hints).toContain(`printf 'nameserver 127.0.0.1\\nport ${dnsPort}\\n' > /etc/resolver/cluster.local`);
    expect(hints).toContain(`DNS=127.0.0.1:${dnsPort}\\nDomains=~cluster.local`);
    expect(hints).toContain(`Service names are kept in ${hostsFile}`);
    await waitFor(async () => (await readFile(hostsFile, 'utf8')).includes(HOSTS_END), 'the hosts-file block');
    cli.child.kill('SIGTERM');
    expect(await cli.exited).toBe(0);
    expect(await readFile(hostsFile, 'utf8')).toBe(HOSTS_BEFORE);
  });

  it('--cleanup removes a block a killed run left, and nothing else', async () => {
    await writeFile(hostsFile, `${HOSTS_BEFORE}\n${HOSTS_BEGIN}\n127.96.41.10 web.default.svc.cluster.local\n${HOSTS_END}`);
    // --portal named: with none, --cleanup as root would look for iptables leftovers on this host.
    const r = runCli(['--cleanup', '--portal', 'loopback', '--hosts-file', hostsFile]);
    expect(await r.exited).toBe(0);
    expect(await readFile(hostsFile, 'utf8')).toBe(HOSTS_BEFORE);
  });

  it('names the flag of a bad value in one line', async () => {
    for (const [args, code, message] of [
      [['--dns-bind-address', 'nowhere:53'], 2, '--dns-bind-address: "nowhere" in "nowhere:53" is not an IP address'],
      [['--dns-bind-address', '127.0.0.1:99999'], 2, '--dns-bind-address: port "99999"'],
      [['--cluster-domain', 'bad_domain'], 2, '--cluster-domain: "bad_domain" is not a DNS domain name'],
      [['--state', stateFile, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--hosts-file', join(dir, 'no-such-dir', 'hosts')], 1, `--hosts-file ${join(dir, 'no-such-dir', 'hosts')}: cannot write it: no such directory`],
    ] as const) {
      const r = runCli([...args]);
      expect(await r.exited, args.join(' ')).toBe(code);
      // One line, no stack.
      expect(r.stderr().startsWith(`kube-userspace-proxy: ${message}`), r.stderr()).toBe(true);
      expect(r.stderr().trimEnd().split('\n')).toHaveLength(1);
    }
  });
});

describe('Service names in the configuration file', () => {
  it('reads dnsBindAddress, clusterDomain and hostsFile under kubeUserspaceProxy, and writes them back', () => {
    const text = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nkubeUserspaceProxy:\n  dnsBindAddress: 127.0.0.1:5353\n  clusterDomain: k8s.example\n  hostsFile: /etc/hosts\n';
    const { options } = parseKubeProxyConfiguration(text, 'proxy.yaml');
    expect(options).toMatchObject({ dnsBindAddress: '127.0.0.1:5353', clusterDomain: 'k8s.example', hostsFile: '/etc/hosts' });
    const config = buildConfig(options);
    expect(config).toMatchObject({ dnsBindAddress: { host: '127.0.0.1', port: 5353 }, clusterDomain: 'k8s.example', hostsFile: '/etc/hosts' });
    expect(buildConfig(parseKubeProxyConfiguration(renderKubeProxyConfiguration(config), 'written.yaml').options)).toEqual(config);
    // Unset, the defaults: no responder, no hosts file, cluster.local.
    const defaults = buildConfig({});
    expect(defaults.dnsBindAddress).toBeUndefined();
    expect(defaults.hostsFile).toBeUndefined();
    expect(defaults.clusterDomain).toBe('cluster.local');
    expect(buildConfig(parseKubeProxyConfiguration(renderKubeProxyConfiguration(defaults), 'written.yaml').options)).toEqual(defaults);
    expect(() => parseKubeProxyConfiguration(text.replace('k8s.example', 'bad_domain'), 'proxy.yaml')).toThrow('proxy.yaml: kubeUserspaceProxy.clusterDomain: "bad_domain" is not a DNS domain name');
    expect(() => parseKubeProxyConfiguration(text.replace('127.0.0.1:5353', 'nowhere:53'), 'proxy.yaml')).toThrow('proxy.yaml: kubeUserspaceProxy.dnsBindAddress: "nowhere"');
  });
});
