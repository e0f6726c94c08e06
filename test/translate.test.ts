import { readFileSync } from 'node:fs';
import { describe, it, expect } from 'vitest';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { translateService } from '../src/core/translate.js';
import { categorizeEndpoints } from '../src/core/endpoints.js';
import type { ServicePort } from '../src/core/model.js';
import { endpointSlice, service, type ServiceSpec, type SliceSpec } from './helpers/objects.js';

function fixture<T>(name: string): T {
  return JSON.parse(readFileSync(new URL(`./fixtures/kube/${name}`, import.meta.url), 'utf8')) as T;
}

const realServices = fixture<{ items: V1Service[] }>('services-list.json').items;
const realSlices = fixture<{ items: V1EndpointSlice[] }>('endpointslices-v1-list.json').items;
const real = (name: string): V1Service => {
  const s = realServices.find((x) => x.metadata?.name === name);
  if (!s) throw new Error(`no fixture Service ${name}`);
  return s;
};

const svc = (s: Partial<ServiceSpec> & { spec?: Record<string, unknown> } = {}): V1Service => {
  const base = service({ name: 'web', ports: [{ name: 'http', port: 80 }], ...s }) as { spec: Record<string, unknown> };
  return { ...base, spec: { ...base.spec, ...s.spec } };
};
const slice = (s: Partial<SliceSpec> & { extra?: Record<string, unknown> } = {}): V1EndpointSlice =>
  ({ ...endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: [], ...s }), ...s.extra }) as unknown as V1EndpointSlice;

const port = (ports: ServicePort[], name: string): ServicePort => {
  const p = ports.find((x) => x.name.port === name);
  if (!p) throw new Error(`no port ${name}`);
  return p;
};

describe('translateService on objects from a real API server', () => {
  it('turns the NodePort Service and its slice into two ServicePorts', () => {
    const { ports, skipped, notices } = translateService(real('web'), realSlices);
    expect(skipped).toBeUndefined();
    expect(notices).toEqual([]);
    expect(ports.map((p) => p.key)).toEqual(['default/web:http', 'default/web:dns']);
    const http = port(ports, 'http');
    expect(http).toEqual({
      name: { namespace: 'default', name: 'web', port: 'http' },
      key: 'default/web:http',
      protocol: 'TCP',
      port: 80,
      clusterIPs: ['10.96.110.96'],
      nodePort: 30738,
      externalIPs: ['192.0.2.10'],
      loadBalancerIPs: [],
      affinity: { type: 'ClientIP', timeoutSeconds: 10800 },
      internalTrafficPolicy: 'Cluster',
      externalTrafficPolicy: 'Cluster',
      healthCheckNodePort: 0,
      endpoints: [
        { ip: '10.244.1.5', port: 8080, ready: true, serving: true, terminating: false, nodeName: 'node1', zone: 'zone-a', targetPod: { namespace: 'default', name: 'web-1' } },
        { ip: '10.244.2.7', port: 8080, ready: false, serving: true, terminating: true, nodeName: 'node2', zone: 'zone-b' },
      ],
      lastChangeTriggerTime: Date.parse('2026-11-22T10:00:00Z'),
    });
    const dns = port(ports, 'dns');
    expect(dns.protocol).toBe('UDP');
    expect(dns.nodePort).toBe(30480);
    expect(dns.endpoints.map((e) => `${e.ip}:${e.port}`)).toEqual(['10.244.1.5:5353', '10.244.2.7:5353']);
  });

  it('serves the kubernetes Service (no slices given: no endpoints, no trigger time)', () => {
    const { ports } = translateService(real('kubernetes'), []);
    expect(ports).toHaveLength(1);
    expect(ports[0]).toMatchObject({ key: 'default/kubernetes:https', port: 443, nodePort: 0, endpoints: [] });
    expect(ports[0]?.lastChangeTriggerTime).toBeUndefined();
  });

  it('skips the ExternalName and headless Services', () => {
    expect(translateService(real('ext'), [])).toEqual({ ports: [], skipped: 'type ExternalName: resolved by DNS, not proxied', notices: [] });
    expect(translateService(real('headless'), [])).toEqual({ ports: [], skipped: 'headless (clusterIP None)', notices: [] });
  });
});

describe('translateService skip rules', () => {
  it('skips a Service with an empty or missing clusterIP', () => {
    expect(translateService(svc({ clusterIPs: [''] }), []).skipped).toBe('no clusterIP');
    const noIP = { metadata: { name: 'x', namespace: 'default' }, spec: { ports: [{ port: 80 }] } } as V1Service;
    expect(translateService(noIP, []).skipped).toBe('no clusterIP');
  });

  it('skips clusterIP None given only as spec.clusterIP', () => {
    const s = { metadata: { name: 'x', namespace: 'default' }, spec: { clusterIP: 'None', ports: [{ port: 80 }] } } as V1Service;
    expect(translateService(s, []).skipped).toBe('headless (clusterIP None)');
  });

  it('skips Services labelled for another proxy or as headless, as kube-proxy\'s selector does', () => {
    const other = translateService(svc({ labels: { 'service.kubernetes.io/service-proxy-name': 'cilium' } }), []);
    expect(other.skipped).toMatch(/service-proxy-name=cilium/);
    expect(other.ports).toEqual([]);
    const headless = translateService(svc({ labels: { 'service.kubernetes.io/headless': '' } }), []);
    expect(headless.skipped).toBe('labelled service.kubernetes.io/headless');
  });
});

describe('translateService ports', () => {
  it('skips SCTP ports with a notice and keeps the rest', () => {
    const s = svc({ ports: [{ name: 'sig', port: 3868, protocol: 'SCTP' }, { name: 'http', port: 80 }] });
    const r = translateService(s, []);
    expect(r.notices).toEqual(['SCTP port "sig" is not supported; skipped']);
    expect(r.ports.map((p) => p.key)).toEqual(['default/web:http']);
  });

  it('names an unnamed port with the empty string and matches it to unnamed slice ports', () => {
    const s = svc({ ports: [{ port: 80 }] });
    const r = translateService(s, [slice({ ports: [{ port: 8080 }], endpoints: [{ ip: '10.0.0.1' }] })]);
    expect(r.ports[0]?.key).toBe('default/web:');
    expect(r.ports[0]?.endpoints.map((e) => e.port)).toEqual([8080]);
  });

  it('matches slice ports by name and protocol, merging several slices', () => {
    const s = svc({ ports: [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' }] });
    const slices = [
      slice({ name: 'web-1', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.0.0.1' }, { ip: '10.0.0.2' }] }),
      slice({ name: 'web-2', ports: [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }], endpoints: [{ ip: '10.0.0.3' }] }),
      // Same name, other protocol: not the UDP port's endpoints.
      slice({ name: 'web-3', ports: [{ name: 'dns', port: 5353, protocol: 'TCP' }], endpoints: [{ ip: '10.0.0.4' }] }),
      // A port the Service does not have.
      slice({ name: 'web-4', ports: [{ name: 'metrics', port: 9090 }], endpoints: [{ ip: '10.0.0.5' }] }),
    ];
    const r = translateService(s, slices);
    expect(port(r.ports, 'http').endpoints.map((e) => e.ip)).toEqual(['10.0.0.1', '10.0.0.2', '10.0.0.3']);
    expect(port(r.ports, 'dns').endpoints.map((e) => `${e.ip}:${e.port}`)).toEqual(['10.0.0.3:5353']);
  });

  it('lets the same target port number differ per slice (during a rollout)', () => {
    const slices = [
      slice({ name: 'web-old', endpoints: [{ ip: '10.0.0.1' }] }),
      slice({ name: 'web-new', ports: [{ name: 'http', port: 9090 }], endpoints: [{ ip: '10.0.0.1' }] }),
    ];
    const eps = translateService(svc(), slices).ports[0]?.endpoints ?? [];
    expect(eps.map((e) => `${e.ip}:${e.port}`)).toEqual(['10.0.0.1:8080', '10.0.0.1:9090']);
  });

  it('deduplicates an ip:port found in two slices, preferring the ready copy', () => {
    const slices = [
      slice({ name: 'web-a', endpoints: [{ ip: '10.0.0.1', ready: false, serving: true, terminating: true }, { ip: '10.0.0.2' }] }),
      slice({ name: 'web-b', endpoints: [{ ip: '10.0.0.1', ready: true, nodeName: 'n1' }, { ip: '10.0.0.2', ready: false }] }),
    ];
    const eps = translateService(svc(), slices).ports[0]?.endpoints ?? [];
    expect(eps).toEqual([
      { ip: '10.0.0.1', port: 8080, ready: true, serving: true, terminating: false, nodeName: 'n1' },
      { ip: '10.0.0.2', port: 8080, ready: true, serving: true, terminating: false },
    ]);
  });

  it('keeps the first copy of an ip:port when its copies are alike in readiness (slices in name order)', () => {
    const slices = [
      slice({ name: 'web-b', endpoints: [{ ip: '10.0.0.1', nodeName: 'second' }, { ip: '10.0.0.2', ready: false, nodeName: 'second' }] }),
      slice({ name: 'web-a', endpoints: [{ ip: '10.0.0.1', nodeName: 'first' }, { ip: '10.0.0.2', ready: false, nodeName: 'first' }] }),
    ];
    const eps = translateService(svc(), slices).ports[0]?.endpoints ?? [];
    expect(eps.map((e) => `${e.ip} ${e.nodeName ?? ''}`)).toEqual(['10.0.0.1 first', '10.0.0.2 first']);
  });

  it('orders endpoints by IP as text, then by port as a number', () => {
    const slices = [
      slice({ name: 'web-a', ports: [{ name: 'http', port: 80 }], endpoints: [{ ip: '10.0.0.10' }, { ip: '10.0.0.1' }, { ip: '10.0.0.9' }] }),
      slice({ name: 'web-b', ports: [{ name: 'http', port: 9 }], endpoints: [{ ip: '10.0.0.1' }] }),
    ];
    const eps = translateService(svc(), slices).ports[0]?.endpoints ?? [];
    // As ip:port text the order would be 10.0.0.10:80, 10.0.0.1:80, 10.0.0.1:9, 10.0.0.9:80.
    expect(eps.map((e) => `${e.ip}:${e.port}`)).toEqual(['10.0.0.1:9', '10.0.0.1:80', '10.0.0.10:80', '10.0.0.9:80']);
  });

  it('reads absent conditions as kube-proxy does: ready=true, serving=true, terminating=false', () => {
    const s = slice({
      extra: {
        endpoints: [
          { addresses: ['10.0.0.1'] },
          { addresses: ['10.0.0.2'], conditions: { ready: false } },
          { addresses: ['10.0.0.3'], conditions: { ready: false, terminating: true } },
          { addresses: ['10.0.0.4'], conditions: {} },
        ],
      },
    });
    const eps = translateService(svc(), [s]).ports[0]?.endpoints ?? [];
    expect(eps.map((e) => [e.ip, e.ready, e.serving, e.terminating])).toEqual([
      ['10.0.0.1', true, true, false],
      ['10.0.0.2', false, true, false],
      ['10.0.0.3', false, true, true],
      ['10.0.0.4', true, true, false],
    ]);
    // So a terminating endpoint without `serving`, the only one left, takes connections, as with
    // kube-proxy; one that is merely not ready does not.
    const usable = (conditions: object): string[] => {
      const port = translateService(svc(), [slice({ extra: { endpoints: [{ addresses: ['10.0.0.3'], conditions }] } })]).ports[0];
      return port === undefined ? [] : categorizeEndpoints(port, { name: 'node-a' }).clusterEndpoints.map((e) => e.ip);
    };
    expect(usable({ ready: false, terminating: true })).toEqual(['10.0.0.3']);
    expect(usable({ ready: false })).toEqual([]);
  });

  it('keeps nodeName, zone and hints, and uses only an endpoint\'s first address', () => {
    const s = slice({
      extra: {
        endpoints: [
          {
            addresses: ['10.0.0.1', '10.0.0.99'],
            nodeName: 'n1',
            zone: 'z1',
            hints: { forZones: [{ name: 'z1' }, { name: 'z2' }], forNodes: [{ name: 'n1' }] },
          },
        ],
      },
    });
    expect(translateService(svc(), [s]).ports[0]?.endpoints).toEqual([
      { ip: '10.0.0.1', port: 8080, ready: true, serving: true, terminating: false, nodeName: 'n1', zone: 'z1', zoneHints: ['z1', 'z2'], nodeHints: ['n1'] },
    ]);
  });

  it('ignores FQDN slices, slices of other Services, and slice ports without a number', () => {
    const slices = [
      slice({ name: 'web-fqdn', extra: { addressType: 'FQDN', endpoints: [{ addresses: ['db.example.com'] }] } }),
      slice({ name: 'other-1', service: 'other', endpoints: [{ ip: '10.0.0.7' }] }),
      slice({ name: 'web-ns', namespace: 'prod', endpoints: [{ ip: '10.0.0.8' }] }),
      slice({ name: 'web-all', extra: { ports: [{ name: 'http', protocol: 'TCP' }] }, endpoints: [{ ip: '10.0.0.9' }] }),
      slice({ name: 'web-ok', endpoints: [{ ip: '10.0.0.1' }] }),
    ];
    expect(translateService(svc(), slices).ports[0]?.endpoints.map((e) => e.ip)).toEqual(['10.0.0.1']);
  });

  it('merges IPv4 and IPv6 slices of a dual-stack Service', () => {
    const slices = [
      slice({ name: 'web-v4', endpoints: [{ ip: '10.0.0.1' }] }),
      slice({ name: 'web-v6', addressType: 'IPv6', endpoints: [{ ip: 'fd00::1' }] }),
    ];
    const r = translateService(svc({ clusterIPs: ['10.96.0.10', 'fd00:96::10'] }), slices);
    expect(r.ports[0]?.clusterIPs).toEqual(['10.96.0.10', 'fd00:96::10']);
    expect(r.ports[0]?.endpoints.map((e) => e.ip)).toEqual(['10.0.0.1', 'fd00::1']);
  });

  it('takes the newest trigger time over the slices and ignores unparsable ones', () => {
    const at = (name: string, t: string): V1EndpointSlice => {
      const s = slice({ name }) as unknown as { metadata: Record<string, unknown> };
      s.metadata.annotations = { 'endpoints.kubernetes.io/last-change-trigger-time': t };
      return s as unknown as V1EndpointSlice;
    };
    const r = translateService(svc(), [at('a', '2026-01-01T00:00:00Z'), at('b', '2026-01-01T00:00:05.5+00:00'), at('c', 'soon')]);
    expect(r.ports[0]?.lastChangeTriggerTime).toBe(Date.parse('2026-01-01T00:00:05.500Z'));
  });
});

describe('translateService service-level fields', () => {
  it('falls back to [spec.clusterIP] without spec.clusterIPs', () => {
    const s = { metadata: { name: 'x' }, spec: { clusterIP: 'fd00::10', ports: [{ port: 80 }] } } as V1Service;
    const r = translateService(s, []);
    expect(r.ports[0]?.clusterIPs).toEqual(['fd00::10']);
    expect(r.ports[0]?.key).toBe('default/x:');
  });

  it('defaults affinity timeout and traffic policies', () => {
    const s = { metadata: { name: 'x', namespace: 'n' }, spec: { clusterIP: '10.0.0.1', sessionAffinity: 'ClientIP', ports: [{ port: 80 }] } } as V1Service;
    expect(translateService(s, []).ports[0]).toMatchObject({
      affinity: { type: 'ClientIP', timeoutSeconds: 10800 },
      internalTrafficPolicy: 'Cluster',
      externalTrafficPolicy: 'Cluster',
    });
    const t = translateService(svc({ sessionAffinity: 'ClientIP', timeoutSeconds: 60, internalTrafficPolicy: 'Local' }), []);
    expect(t.ports[0]).toMatchObject({ affinity: { type: 'ClientIP', timeoutSeconds: 60 }, internalTrafficPolicy: 'Local' });
  });

  it('keeps externalTrafficPolicy Local only where there is external traffic', () => {
    const policy = (s: V1Service): string | undefined => translateService(s, []).ports[0]?.externalTrafficPolicy;
    expect(policy(svc({ spec: { externalTrafficPolicy: 'Local' } }))).toBe('Cluster');
    expect(policy(svc({ externalIPs: ['192.0.2.1'], spec: { externalTrafficPolicy: 'Local' } }))).toBe('Local');
    expect(policy(svc({ type: 'NodePort', ports: [{ name: 'http', port: 80, nodePort: 30080 }], externalTrafficPolicy: 'Local' }))).toBe('Local');
    expect(policy(svc({ type: 'LoadBalancer', externalTrafficPolicy: 'Local' }))).toBe('Local');
  });

  it('gives node ports only to NodePort and LoadBalancer Services', () => {
    const clusterIP = svc({ type: 'ClusterIP', ports: [{ name: 'http', port: 80, nodePort: 30080 }] });
    expect(translateService(clusterIP, []).ports[0]?.nodePort).toBe(0);
    const lb = svc({ type: 'LoadBalancer', ports: [{ name: 'http', port: 80, nodePort: 30080 }] });
    expect(translateService(lb, []).ports[0]?.nodePort).toBe(30080);
  });

  it('takes load-balancer ingress IPs except hostnames and ipMode Proxy, and the health check port of a Local LoadBalancer', () => {
    const lb = svc({ type: 'LoadBalancer', externalTrafficPolicy: 'Local', spec: { healthCheckNodePort: 32000, trafficDistribution: 'PreferClose' } }) as unknown as Record<string, unknown>;
    lb.status = { loadBalancer: { ingress: [{ ip: '203.0.113.1' }, { hostname: 'lb.example' }, { ip: '203.0.113.2', ipMode: 'Proxy' }, { ip: '203.0.113.3', ipMode: 'VIP' }] } };
    const p = translateService(lb, []).ports[0];
    expect(p?.loadBalancerIPs).toEqual(['203.0.113.1', '203.0.113.3']);
    expect(p?.healthCheckNodePort).toBe(32000);
    expect(p?.trafficDistribution).toBe('PreferClose');
    const cluster = svc({ type: 'LoadBalancer', externalTrafficPolicy: 'Cluster', spec: { healthCheckNodePort: 32000 } });
    expect(translateService(cluster, []).ports[0]?.healthCheckNodePort).toBe(0);
    expect(translateService(cluster, []).ports[0]?.trafficDistribution).toBeUndefined();
  });

  it('takes spec.loadBalancerSourceRanges, trimmed as kube-proxy does; none when the list is empty', () => {
    const lb = svc({ type: 'LoadBalancer', spec: { loadBalancerSourceRanges: [' 203.0.113.0/24', 'fd00::/64 ', ''] } });
    expect(translateService(lb, []).ports[0]?.loadBalancerSourceRanges).toEqual(['203.0.113.0/24', 'fd00::/64']);
    expect(translateService(svc({ type: 'LoadBalancer', spec: { loadBalancerSourceRanges: [] } }), []).ports[0]?.loadBalancerSourceRanges).toBeUndefined();
  });

  it('gives each port its own arrays', () => {
    const r = translateService(svc({ ports: [{ name: 'a', port: 1 }, { name: 'b', port: 2 }] }), []);
    expect(r.ports[0]?.clusterIPs).not.toBe(r.ports[1]?.clusterIPs);
  });
});
