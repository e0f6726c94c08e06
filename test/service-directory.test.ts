import { describe, expect, it } from 'vitest';
import { parseClusterDomain, parseClusterName } from '../src/core/cluster-names.js';
import { ServiceDirectory, type ClientAddresses, type DirectoryUnit } from '../src/core/service-directory.js';
import type { ServiceResolver } from '../src/seams/service-resolver.js';

/** A unit as the proxier runs it: ClusterIP portals (and a node port when given). */
function unit(service: string, portName: string, port: number, clusterIPs: string[], opts: { protocol?: string; nodePort?: number; external?: boolean } = {}): DirectoryUnit {
  if (opts.external) return { service, servicePort: `${service}:${portName}`, protocol: opts.protocol ?? 'TCP', portals: [{ kind: 'nodePort', ip: '', port: opts.nodePort ?? 30000 }] };
  return {
    service,
    servicePort: `${service}:${portName}`,
    protocol: opts.protocol ?? 'TCP',
    portals: [...clusterIPs.map((ip) => ({ kind: 'clusterIP' as const, ip, port })), ...(opts.nodePort ? [{ kind: 'nodePort' as const, ip: '', port: opts.nodePort }] : [])],
  };
}

/** The loopback portal's mapping for these tests: 10.96.x.y -> 127.96.x.y. */
const loopback = (_svc: string, ips: readonly string[]): string[] => ips.filter((ip) => ip.startsWith('10.')).map((ip) => ip.replace(/^10\./, '127.'));
const asClusterIPs = (_svc: string, ips: readonly string[]): readonly string[] => ips;

function directory(units: DirectoryUnit[], clientAddresses: ClientAddresses = loopback): { dir: ServiceDirectory; units: DirectoryUnit[]; reads: () => number } {
  let reads = 0;
  const dir = new ServiceDirectory({
    domain: 'cluster.local',
    units: () => {
      reads++;
      return units;
    },
    clientAddresses,
  });
  return { dir, units, reads: () => reads };
}

describe('cluster names', () => {
  it('reads the three forms of a Service name, and SRV owners, case-insensitively', () => {
    expect(parseClusterName('web.default.svc.cluster.local', 'cluster.local')).toEqual({ kind: 'service', name: 'web', namespace: 'default', zone: 'domain' });
    expect(parseClusterName('WEB.Default.SVC.Cluster.Local.', 'cluster.local')).toEqual({ kind: 'service', name: 'web', namespace: 'default', zone: 'domain' });
    expect(parseClusterName('web.default.svc', 'cluster.local')).toEqual({ kind: 'service', name: 'web', namespace: 'default', zone: 'svc' });
    expect(parseClusterName('web.default', 'cluster.local')).toEqual({ kind: 'service', name: 'web', namespace: 'default', zone: 'none' });
    expect(parseClusterName('_http._TCP.web.default.svc.cluster.local', 'cluster.local')).toEqual({ kind: 'port', port: 'http', protocol: 'TCP', name: 'web', namespace: 'default', zone: 'domain' });
    expect(parseClusterName('_tcp.web.default.svc', 'cluster.local')).toMatchObject({ kind: 'protocol', name: 'web' });
    expect(parseClusterName('default.svc.cluster.local', 'cluster.local')).toEqual({ kind: 'namespace', namespace: 'default', zone: 'domain' });
    expect(parseClusterName('cluster.local', 'cluster.local')).toEqual({ kind: 'node', zone: 'domain' });
    expect(parseClusterName('svc.cluster.local', 'cluster.local')).toEqual({ kind: 'node', zone: 'domain' });
    expect(parseClusterName('1-2-3-4.default.pod.cluster.local', 'cluster.local')).toEqual({ kind: 'unknown', zone: 'domain' });
    expect(parseClusterName('a.b.web.default.svc.cluster.local', 'cluster.local')).toEqual({ kind: 'unknown', zone: 'domain' });
    expect(parseClusterName('example.org.uk', 'cluster.local')).toEqual({ kind: 'outside' });
    expect(parseClusterName('localhost', 'cluster.local')).toEqual({ kind: 'outside' });
    expect(parseClusterName('web.default.svc.k8s.example', 'k8s.example')).toMatchObject({ kind: 'service', name: 'web' });
  });

  it('takes a cluster domain as kubelet does, and names the flag for a bad one', () => {
    expect(parseClusterDomain('Cluster.Local.', '--cluster-domain')).toBe('cluster.local');
    expect(() => parseClusterDomain('bad_domain', '--cluster-domain')).toThrow('--cluster-domain: "bad_domain" is not a DNS domain name');
    expect(() => parseClusterDomain('', '--cluster-domain')).toThrow('--cluster-domain');
  });
});

describe('ServiceDirectory', () => {
  const units = [
    unit('default/web', 'http', 80, ['10.96.0.10'], { nodePort: 30080 }),
    unit('default/web', 'metrics', 9090, ['10.96.0.10']),
    unit('kube-system/kube-dns', 'dns', 53, ['10.96.0.53'], { protocol: 'UDP' }),
    unit('kube-system/kube-dns', 'dns-tcp', 53, ['10.96.0.53']),
    unit('default/single', '', 8080, ['10.96.0.11']),
    // The external half of a split service port carries no ClusterIP: it adds nothing.
    unit('default/split', 'http', 80, ['10.96.0.12']),
    unit('default/split', 'http', 80, [], { external: true }),
  ];

  it('lists each running Service with its client addresses and ports', () => {
    const { dir } = directory(units);
    expect(dir.entries().map((e) => `${e.namespace}/${e.name}`)).toEqual(['default/single', 'default/split', 'default/web', 'kube-system/kube-dns']);
    expect(dir.get('default', 'web')).toEqual({
      namespace: 'default',
      name: 'web',
      clusterIPs: ['10.96.0.10'],
      addresses: ['127.96.0.10'],
      ports: [{ name: 'http', port: 80, protocol: 'TCP' }, { name: 'metrics', port: 9090, protocol: 'TCP' }],
    });
    expect(dir.get('default', 'split')?.ports).toEqual([{ name: 'http', port: 80, protocol: 'TCP' }]);
    expect(dir.hasNamespace('kube-system')).toBe(true);
    expect(dir.hasNamespace('nope')).toBe(false);
  });

  it('resolves names, ClusterIPs and client addresses to where the proxy serves the port (ServiceResolver)', () => {
    const { dir } = directory(units);
    const resolver: ServiceResolver = dir;
    expect(resolver.resolve('web.default.svc.cluster.local', 80, 'TCP')).toEqual({ host: '127.96.0.10', port: 80 });
    expect(resolver.resolve('WEB.default.svc.', 9090, 'TCP')).toEqual({ host: '127.96.0.10', port: 9090 });
    expect(resolver.resolve('web.default', 80, 'TCP')).toEqual({ host: '127.96.0.10', port: 80 });
    expect(resolver.resolve('10.96.0.10', 80, 'TCP')).toEqual({ host: '127.96.0.10', port: 80 });
    expect(resolver.resolve('127.96.0.10', 80, 'TCP')).toEqual({ host: '127.96.0.10', port: 80 });
    expect(resolver.resolve('kube-dns.kube-system.svc.cluster.local', 53, 'UDP')).toEqual({ host: '127.96.0.53', port: 53 });
    // A port the Service does not have, a protocol it does not serve there, a Service not running.
    expect(resolver.resolve('web.default.svc.cluster.local', 81, 'TCP')).toBeUndefined();
    expect(resolver.resolve('web.default.svc.cluster.local', 80, 'UDP')).toBeUndefined();
    expect(resolver.resolve('nope.default.svc.cluster.local', 80, 'TCP')).toBeUndefined();
    expect(resolver.resolve('10.96.9.9', 80, 'TCP')).toBeUndefined();
    // The node port is not a Service port.
    expect(resolver.resolve('web.default', 30080, 'TCP')).toBeUndefined();
  });

  it('under the node-level portals, answers the ClusterIPs themselves, the asked family first', () => {
    const { dir } = directory([unit('default/dual', 'http', 80, ['fd00::10', '10.96.0.20'])], asClusterIPs);
    expect(dir.get('default', 'dual')?.addresses).toEqual(['10.96.0.20', 'fd00::10']);
    expect(dir.resolve('dual.default.svc.cluster.local', 80, 'TCP')).toEqual({ host: '10.96.0.20', port: 80 });
    expect(dir.resolve('fd00::10', 80, 'TCP')).toEqual({ host: 'fd00::10', port: 80 });
    expect(dir.hostsLines()).toEqual([
      '10.96.0.20 dual.default.svc.cluster.local dual.default.svc dual.default',
      'fd00::10 dual.default.svc.cluster.local dual.default.svc dual.default',
    ]);
  });

  it('under the loopback portal, an IPv6-only ClusterIP still resolves to the loopback address', () => {
    const { dir } = directory([unit('default/v6', 'http', 80, ['fd00::20'])], () => ['127.200.1.2']);
    expect(dir.resolve('fd00::20', 80, 'TCP')).toEqual({ host: '127.200.1.2', port: 80 });
  });

  it('rebuilds only when read after a change, and counts each rebuild as a version', () => {
    const { dir, units: live, reads } = directory([unit('default/a', 'http', 80, ['10.96.0.1'])]);
    expect(reads()).toBe(0);
    expect(dir.version).toBe(1);
    dir.get('default', 'a');
    dir.entries();
    expect(reads()).toBe(1);
    live.push(unit('default/b', 'http', 80, ['10.96.0.2']));
    dir.invalidate();
    dir.invalidate();
    expect(dir.get('default', 'b')?.addresses).toEqual(['127.96.0.2']);
    expect(dir.version).toBe(2);
    expect(reads()).toBe(2);
    live.splice(0, 1);
    dir.invalidate();
    expect(dir.get('default', 'a')).toBeUndefined();
    expect(dir.resolve('10.96.0.1', 80, 'TCP')).toBeUndefined();
  });

  it('lists hosts-file lines sorted by namespace and name', () => {
    const { dir } = directory(units);
    expect(dir.hostsLines()).toEqual([
      '127.96.0.11 single.default.svc.cluster.local single.default.svc single.default',
      '127.96.0.12 split.default.svc.cluster.local split.default.svc split.default',
      '127.96.0.10 web.default.svc.cluster.local web.default.svc web.default',
      '127.96.0.53 kube-dns.kube-system.svc.cluster.local kube-dns.kube-system.svc kube-dns.kube-system',
    ]);
  });
});
