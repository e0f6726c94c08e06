import { readFileSync } from 'node:fs';
import { describe, it, expect } from 'vitest';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { isIPv4, isIPv6, ipFamily } from '../src/core/address.js';
import { validateEndpointSlice, validateService } from '../src/core/validate.js';
import type { ObjectProblem } from '../src/core/model.js';
import { endpointSlice, service } from './helpers/objects.js';

function fixture<T>(name: string): T {
  return JSON.parse(readFileSync(new URL(`./fixtures/kube/${name}`, import.meta.url), 'utf8')) as T;
}

const svc = (over: Record<string, unknown> = {}, spec: Record<string, unknown> = {}): V1Service => {
  const base = service({ name: 'web', ports: [{ name: 'http', port: 80 }] });
  return { ...base, ...over, spec: { ...(base.spec as object), ...spec } };
};

const slice = (over: Record<string, unknown> = {}): V1EndpointSlice => {
  const base = endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.0.0.1' }] });
  return { ...base, ...over } as unknown as V1EndpointSlice;
};

/** `field: message` of each problem, for compact assertions. */
const fields = (ps: ObjectProblem[]): string[] => ps.map((p) => p.field);

describe('ip syntax', () => {
  it('accepts dotted-decimal IPv4 and refuses leading zeros, short forms and out-of-range octets', () => {
    for (const ok of ['10.96.0.1', '0.0.0.0', '255.255.255.255', '192.0.2.10']) expect(isIPv4(ok), ok).toBe(true);
    for (const bad of ['010.0.0.1', '1.2.3', '1.2.3.4.5', '256.1.1.1', '1.2.3.4 ', '', 'a.b.c.d', '1..2.3']) {
      expect(isIPv4(bad), bad).toBe(false);
    }
  });

  it('accepts RFC 4291 IPv6 text, with :: and a trailing dotted quad, and refuses zones and malformed forms', () => {
    for (const ok of ['::', '::1', 'fd00::1', '2001:db8:0:0:0:0:0:1', 'fe80::1:2:3:4:5:6', '::ffff:192.0.2.1', '1:2:3:4:5:6:1.2.3.4', 'FD00::A']) {
      expect(isIPv6(ok), ok).toBe(true);
    }
    for (const bad of ['1:2:3:4:5:6:7', '1:2:3:4:5:6:7:8:9', '1::2::3', ':1', '1:', ':::', 'fe80::1%eth0', '12345::', '1.2.3.4::', '::1.2.3', 'g::1', '1:2:3:4:5:6:7::8:9']) {
      expect(isIPv6(bad), bad).toBe(false);
    }
  });

  it('names the family', () => {
    expect(ipFamily('10.0.0.1')).toBe(4);
    expect(ipFamily('fd00::1')).toBe(6);
    expect(ipFamily('None')).toBeUndefined();
  });
});

describe('validateService', () => {
  it('accepts every Service a real API server listed', () => {
    const list = fixture<{ items: V1Service[] }>('services-list.json');
    for (const s of list.items) expect(validateService(s), s.metadata?.name).toEqual([]);
    expect(validateService(fixture<V1Service>('service-late.json'))).toEqual([]);
  });

  it('names the object and the field path', () => {
    const ps = validateService(svc({}, { ports: [{ name: 'a', port: 80 }, { name: 'b', port: 70000 }] }));
    expect(ps).toEqual([
      { object: 'Service default/web', field: 'spec.ports[1].port', message: 'must be an integer from 1 to 65535, got 70000' },
    ]);
  });

  it('checks every port number the proxy uses', () => {
    const ports = [
      { name: 'a', port: 0 },
      { name: 'b', port: '80' },
      { name: 'c', port: 80, nodePort: 65536 },
      { name: 'd', port: 81, targetPort: 0 },
      { name: 'e', port: 82, targetPort: 'http' },
      { name: 'f', port: 83, targetPort: '' },
      { name: 'g', port: 84, nodePort: 0, targetPort: 8080 },
      { name: 'h' },
    ];
    expect(fields(validateService(svc({}, { ports })))).toEqual([
      'spec.ports[0].port',
      'spec.ports[1].port',
      'spec.ports[2].nodePort',
      'spec.ports[3].targetPort',
      'spec.ports[5].targetPort',
      'spec.ports[7].port',
    ]);
  });

  it('accepts TCP, UDP and SCTP (absent means TCP) and nothing else', () => {
    const ports = [{ name: 'a', port: 1, protocol: 'UDP' }, { name: 'b', port: 2, protocol: 'SCTP' }, { name: 'c', port: 3 }, { name: 'd', port: 4, protocol: 'tcp' }];
    const ps = validateService(svc({}, { ports }));
    expect(ps).toHaveLength(1);
    expect(ps[0]).toMatchObject({ field: 'spec.ports[3].protocol', message: 'must be one of TCP, UDP, SCTP, got "tcp"' });
  });

  it('needs a distinct name on each port once there are several, since names key everything', () => {
    const ps = validateService(svc({}, { ports: [{ port: 1 }, { name: 'x', port: 2 }, { name: 'x', port: 3 }] }));
    expect(fields(ps)).toEqual(['spec.ports[0].name', 'spec.ports[2].name']);
    expect(validateService(svc({}, { ports: [{ port: 1 }] }))).toEqual([]);
  });

  it('refuses two ports on one port number and protocol, or one node port and protocol, as the API server does', () => {
    const ps = validateService(svc({}, {
      type: 'NodePort',
      ports: [
        { name: 'a', port: 80, nodePort: 30080 },
        { name: 'b', port: 80, protocol: 'TCP', nodePort: 30080 },
        { name: 'c', port: 80, protocol: 'UDP', nodePort: 30080 },
        { name: 'd', port: 81, nodePort: 0 },
        { name: 'e', port: 82, nodePort: 0 },
      ],
    }));
    expect(ps.map((p) => `${p.field}: ${p.message}`)).toEqual([
      'spec.ports[1].port: duplicate: 80/TCP is already an earlier port\'s',
      'spec.ports[1].nodePort: duplicate: 30080/TCP is already an earlier port\'s',
    ]);
  });

  it('checks the syntax of cluster IPs, external IPs and load-balancer IPs', () => {
    expect(fields(validateService(svc({}, { clusterIP: '10.96.0.300', clusterIPs: ['10.96.0.300'] })))).toEqual([
      'spec.clusterIP',
      'spec.clusterIPs[0]',
    ]);
    expect(fields(validateService(svc({}, { externalIPs: ['192.0.2.1', 'example.com'] })))).toEqual(['spec.externalIPs[1]']);
    const lb = svc({ status: { loadBalancer: { ingress: [{ ip: '203.0.113.7' }, { hostname: 'lb.example' }, { ip: '1.2.3' }] } } });
    expect(fields(validateService(lb))).toEqual(['status.loadBalancer.ingress[2].ip']);
    const ranges = validateService(svc({}, { type: 'LoadBalancer', loadBalancerSourceRanges: ['203.0.113.0/24', ' fd00::/64 ', '10.0.0.1', 42] }));
    expect(ranges.map((p) => `${p.field}: ${p.message}`)).toEqual(['spec.loadBalancerSourceRanges: 2 entries are not CIDRs, e.g. [2] "10.0.0.1"']);
  });

  it('accepts dual-stack clusterIPs of two families and refuses two of one family or a mismatch with clusterIP', () => {
    expect(validateService(svc({}, { clusterIP: '10.96.0.10', clusterIPs: ['10.96.0.10', 'fd00::a'] }))).toEqual([]);
    expect(validateService(svc({}, { clusterIP: 'fd00::a', clusterIPs: ['fd00::a', '10.96.0.10'] }))).toEqual([]);
    expect(fields(validateService(svc({}, { clusterIP: '10.96.0.10', clusterIPs: ['10.96.0.10', '10.96.0.11'] })))).toEqual([
      'spec.clusterIPs[1]',
    ]);
    expect(fields(validateService(svc({}, { clusterIP: '10.96.0.9', clusterIPs: ['10.96.0.10'] })))).toEqual(['spec.clusterIPs[0]']);
    expect(fields(validateService(svc({}, { clusterIP: 'None', clusterIPs: ['None', 'fd00::1'] })))).toEqual(['spec.clusterIPs']);
  });

  it('accepts headless and IP-less Services: translation skips them, they are not wrong', () => {
    expect(validateService(svc({}, { clusterIP: 'None', clusterIPs: ['None'] }))).toEqual([]);
    expect(validateService(svc({}, { clusterIP: '', clusterIPs: [] }))).toEqual([]);
    const bare = { metadata: { name: 'x' }, spec: { ports: [{ port: 80 }] } } as V1Service;
    expect(validateService(bare)).toEqual([]);
  });

  it('checks sessionAffinity, its timeout and the traffic policies', () => {
    const timeout = (t: unknown): string[] =>
      fields(validateService(svc({}, { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: t } } })));
    expect(timeout(1)).toEqual([]);
    expect(timeout(86400)).toEqual([]);
    expect(timeout(0)).toEqual(['spec.sessionAffinityConfig.clientIP.timeoutSeconds']);
    expect(timeout(86401)).toEqual(['spec.sessionAffinityConfig.clientIP.timeoutSeconds']);
    expect(timeout(1.5)).toEqual(['spec.sessionAffinityConfig.clientIP.timeoutSeconds']);
    const ps = validateService(
      svc({}, { sessionAffinity: 'Sticky', internalTrafficPolicy: 'Node', externalTrafficPolicy: 'local', type: 'Headless' }),
    );
    expect(fields(ps).sort()).toEqual(['spec.externalTrafficPolicy', 'spec.internalTrafficPolicy', 'spec.sessionAffinity', 'spec.type']);
  });

  it('needs metadata.name, a valid name and a valid namespace', () => {
    expect(validateService(svc({ metadata: { namespace: 'prod' } }))).toEqual([
      { object: 'Service prod/<unnamed>', field: 'metadata.name', message: 'missing' },
    ]);
    expect(fields(validateService(svc({ metadata: { name: 'a/b' } })))).toEqual(['metadata.name']);
    expect(fields(validateService(svc({ metadata: { name: 'web', namespace: 'Prod' } })))).toEqual(['metadata.namespace']);
    expect(fields(validateService(svc({ metadata: undefined })))).toEqual(['metadata']);
  });

  it('names an object without a namespace as in default, and ignores unknown fields', () => {
    const s = svc({ metadata: { name: 'web' }, futureField: { x: 1 } }, { ports: [{ name: 'p', port: -1 }], somethingNew: true });
    expect(validateService(s)[0]?.object).toBe('Service default/web');
    expect(validateService(s)).toHaveLength(1);
  });

  it('survives shapes a YAML file can produce', () => {
    expect(fields(validateService(svc({}, { ports: 'http' })))).toEqual(['spec.ports']);
    expect(fields(validateService(svc({}, { ports: [42] })))).toEqual(['spec.ports[0]']);
    expect(fields(validateService(svc({}, { clusterIPs: '10.0.0.1' })))).toEqual(['spec.clusterIPs']);
    expect(fields(validateService({ metadata: { name: 'web' }, spec: 'x' } as unknown as V1Service))).toEqual(['spec']);
    expect(fields(validateService(null as unknown as V1Service))).toEqual(['']);
  });
});

describe('validateEndpointSlice', () => {
  it('accepts the slices a real API server listed (as v1)', () => {
    const list = fixture<{ items: V1EndpointSlice[] }>('endpointslices-v1-list.json');
    for (const s of list.items) expect(validateEndpointSlice(s)).toEqual([]);
  });

  it('needs the kubernetes.io/service-name label, by which the proxy finds the Service', () => {
    const s = slice({ metadata: { name: 'web-x', namespace: 'default', labels: {} } });
    expect(validateEndpointSlice(s)).toEqual([
      {
        object: 'EndpointSlice default/web-x',
        field: 'metadata.labels["kubernetes.io/service-name"]',
        message: "missing: the proxy finds a slice's Service by this label",
      },
    ]);
  });

  it('checks addressType and that each address is an IP of that family', () => {
    expect(fields(validateEndpointSlice(slice({ addressType: 'IPv5' })))).toEqual(['addressType']);
    const eps = [{ addresses: ['10.0.0.1'] }, { addresses: ['fd00::1'] }, { addresses: ['pod.local'] }, { addresses: [] }];
    expect(fields(validateEndpointSlice(slice({ endpoints: eps })))).toEqual([
      'endpoints[1].addresses[0]',
      'endpoints[2].addresses[0]',
      'endpoints[3].addresses',
    ]);
    const v6 = validateEndpointSlice(slice({ addressType: 'IPv6', endpoints: [{ addresses: ['10.0.0.1'] }] }));
    expect(v6[0]?.message).toBe('"10.0.0.1" is not an IPv6 address (addressType IPv6)');
  });

  it('does not check FQDN addresses as IPs (the proxy ignores FQDN slices)', () => {
    expect(validateEndpointSlice(slice({ addressType: 'FQDN', endpoints: [{ addresses: ['db.example.com'] }] }))).toEqual([]);
  });

  it('accepts an empty slice as the API sends it (endpoints: null)', () => {
    expect(validateEndpointSlice(slice({ endpoints: null, ports: null }))).toEqual([]);
  });

  it('checks endpoint ports and protocols, and lets an unset port through (kube-proxy skips it)', () => {
    const ports = [{ name: 'a', port: 0 }, { name: 'b', port: 70000 }, { name: 'c', protocol: 'ICMP', port: 1 }, { name: 'd' }];
    expect(fields(validateEndpointSlice(slice({ ports })))).toEqual(['ports[0].port', 'ports[1].port', 'ports[2].protocol']);
  });

  it('checks conditions and hints shapes', () => {
    const eps = [
      { addresses: ['10.0.0.1'], conditions: { ready: 'yes' } },
      { addresses: ['10.0.0.2'], hints: { forZones: ['zone-a'] } },
      { addresses: ['10.0.0.3'], hints: { forZones: [{ name: 'zone-a' }], forNodes: [{ name: 'n1' }] }, conditions: { terminating: null } },
    ];
    expect(fields(validateEndpointSlice(slice({ endpoints: eps })))).toEqual(['endpoints[0].conditions.ready', 'endpoints[1].hints.forZones']);
  });

describe('bounded reports of hostile input', () => {
  /** `{a: {a: ... 1}}`, `levels` deep, built without recursion (as JSON.parse builds it). */
  const nested = (levels: number): unknown => {
    let v: unknown = 1;
    for (let i = 0; i < levels; i++) v = { a: v };
    return v;
  };

  it('reports a list\'s bad entries once, with a count and the first example', () => {
    const ps = validateService(svc({}, { externalIPs: Array.from({ length: 100_000 }, () => 'x') }));
    expect(ps).toEqual([{ object: 'Service default/web', field: 'spec.externalIPs', message: '100000 entries are not IP addresses, e.g. [0] "x"' }]);
    const eps = [{ addresses: ['10.0.0.1', 'a', 'fd00::1', 'b', 'fd00::2'] }];
    expect(validateEndpointSlice(slice({ endpoints: eps })).map((p) => `${p.field}: ${p.message}`)).toEqual([
      'endpoints[0].addresses: 2 entries are not IP addresses, e.g. [1] "a"',
      'endpoints[0].addresses: 2 entries are not IPv4 addresses (addressType IPv4), e.g. [2] "fd00::1"',
    ]);
  });

  it('lists at most ten problems of one object and counts the rest in the last', () => {
    const ports = Array.from({ length: 5000 }, (_, i) => ({ name: `p${i}`, port: 0 }));
    const ps = validateService(svc({}, { ports }));
    expect(ps).toHaveLength(11);
    expect(ps[10]).toEqual({
      object: 'Service default/web',
      field: 'spec.ports[10].port',
      message: 'must be an integer from 1 to 65535, got 0 (and 4989 more problems in this object)',
    });
  });

  it('quotes at most 200 characters of a value, and of a name', () => {
    const long = 'x'.repeat(100_000);
    const [p] = validateService(svc({}, { type: { big: Array.from({ length: 100 }, () => long) } }));
    expect(p?.field).toBe('spec.type');
    expect(p?.message.length).toBeLessThan(300);
    expect(p?.message).toMatch(/^must be one of .*, got \{"big":\["xxxx+…$/);
    const [named] = validateService(svc({ metadata: { name: long } }));
    expect(named?.object.length).toBeLessThan(250);
    expect(named?.message.length).toBeLessThan(250);
  });

  it('refuses an object nested deeper than 100 levels, naming the path, without overflowing the stack', () => {
    const deep = svc({ metadata: { name: 'web', annotations: { deep: nested(100_000) } } });
    expect(validateService(deep)).toEqual([
      { object: 'Service default/web', field: 'metadata.annotations.deep.a.a.a…', message: 'nested more than 100 levels deep' },
    ]);
    const deepSlice = slice({ endpoints: [{ addresses: ['10.0.0.1'], hints: { forZones: [nested(200)] } }] });
    expect(fields(validateEndpointSlice(deepSlice))).toEqual(['endpoints[0].hints.forZones[0].a…']);
    // What real objects nest is far from the bound.
    expect(validateService(svc({ metadata: { name: 'web', annotations: { x: nested(90) } } }))).toEqual([]);
  });
});

describe('a load-balancer ingress entry that is not an object', () => {
  it('is a problem naming the entry, and translation of such an object does not throw', async () => {
    const { validateService } = await import('../src/core/validate.js');
    const { translateService } = await import('../src/core/translate.js');
    const svc = {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: 'lb', namespace: 'default' },
      spec: { type: 'LoadBalancer', clusterIP: '10.96.0.9', clusterIPs: ['10.96.0.9'], ports: [{ port: 80, protocol: 'TCP', nodePort: 30009 }] },
      status: { loadBalancer: { ingress: [null, { ip: '192.0.2.9' }] } },
    } as never;
    expect(validateService(svc).map((p) => p.field)).toEqual(['status.loadBalancer.ingress[0]']);
    expect(translateService(svc, []).ports[0]?.loadBalancerIPs).toEqual(['192.0.2.9']);
  });
});
});
