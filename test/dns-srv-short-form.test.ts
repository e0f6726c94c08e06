import dnsPacket from 'dns-packet';
import type { DecodedPacket, RecordType } from 'dns-packet';
import { describe, expect, it } from 'vitest';
import { answerDnsQuery } from '../src/core/dns-answer.js';
import { parseClusterName } from '../src/core/cluster-names.js';
import { ServiceDirectory, type DirectoryUnit } from '../src/core/service-directory.js';

/**
 * cluster-names.ts: "Three forms name a Service: `svc.ns.svc.<domain>`, `svc.ns.svc` and `svc.ns`
 * ...; a named port's SRV owner is `_port._proto.` before any of them." The `svc.ns` form's SRV
 * owner (`_http._tcp.web.default`) was read as outside every zone and REFUSED, while `web.default`
 * itself is answered.
 */

function unit(service: string, portName: string, port: number, clusterIPs: string[], protocol = 'TCP'): DirectoryUnit {
  return { service, servicePort: `${service}:${portName}`, protocol, portals: clusterIPs.map((ip) => ({ kind: 'clusterIP' as const, ip, port })) };
}
const directory = new ServiceDirectory({ domain: 'cluster.local', units: () => [unit('default/web', 'http', 80, ['10.96.0.10'])], clientAddresses: (_s, ips) => ips });

function ask(name: string, type: RecordType): DecodedPacket & { rcode?: string } {
  const q = dnsPacket.encode({ type: 'query', id: 1, flags: dnsPacket.RECURSION_DESIRED, questions: [{ name, type, class: 'IN' }] });
  return dnsPacket.decode(answerDnsQuery(q, { directory, ttlSeconds: 5, transport: 'udp', ready: true })!);
}

describe('SRV owners before the two-label svc.ns form', () => {
  it('parses _port._proto.svc.ns as the port of Service svc.ns', () => {
    expect(parseClusterName('_http._tcp.web.default', 'cluster.local')).toEqual({ kind: 'port', port: 'http', protocol: 'TCP', name: 'web', namespace: 'default', zone: 'none' });
  });

  it('answers SRV for _http._tcp.web.default as for _http._tcp.web.default.svc', () => {
    const long = ask('_http._tcp.web.default.svc', 'SRV');
    expect(long.rcode).toBe('NOERROR');
    const short = ask('_http._tcp.web.default', 'SRV');
    expect(short.rcode).toBe('NOERROR');
    expect(short.answers?.map((a) => ('data' in a ? a.data : undefined))).toEqual([{ priority: 0, weight: 100, port: 80, target: 'web.default.svc.cluster.local' }]);
  });

  it('still leaves names of the same shape that are no Service to other servers (REFUSED, no SOA of ours)', () => {
    const r = ask('_sip._tcp.example.com', 'SRV');
    expect(r.rcode).toBe('REFUSED');
    expect(r.authorities ?? []).toEqual([]);
    expect(ask('_tcp.example.com', 'SRV').rcode).toBe('REFUSED');
    expect(ask('_nope._tcp.web.default', 'SRV').rcode).toBe('REFUSED');
    // Names that exist: the protocol node under a running Service, and a wrong-type query.
    expect(ask('_tcp.web.default', 'SRV').rcode).toBe('NOERROR');
    expect(ask('_http._tcp.web.default', 'A').rcode).toBe('NOERROR');
  });
});
