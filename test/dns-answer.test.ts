import dnsPacket from 'dns-packet';
import type { DecodedPacket, Packet, RecordType } from 'dns-packet';
import { describe, expect, it } from 'vitest';
import { answerDnsQuery, type AnswerOptions } from '../src/core/dns-answer.js';
import { ServiceDirectory, type DirectoryUnit } from '../src/core/service-directory.js';
import { seeded } from './helpers/seeded.js';

/**
 * The responder's decisions on encoded messages, decoded back with the same library a client
 * would use (the real-client tests, with dig and Node's resolver, are in dns-server.test.ts).
 */

function unit(service: string, portName: string, port: number, clusterIPs: string[], protocol = 'TCP'): DirectoryUnit {
  return { service, servicePort: `${service}:${portName}`, protocol, portals: clusterIPs.map((ip) => ({ kind: 'clusterIP' as const, ip, port })) };
}

const units: DirectoryUnit[] = [
  unit('default/web', 'http', 80, ['10.96.0.10', 'fd00::10']),
  unit('default/web', 'grpc', 9090, ['10.96.0.10', 'fd00::10']),
  unit('kube-system/kube-dns', 'dns', 53, ['10.96.0.53'], 'UDP'),
  unit('kube-system/kube-dns', 'dns-tcp', 53, ['10.96.0.53']),
  unit('default/plain', '', 8080, ['10.96.0.11']),
];
const directory = new ServiceDirectory({ domain: 'cluster.local', units: () => units, clientAddresses: (_s, ips) => ips });

function opts(over: Partial<AnswerOptions> = {}): AnswerOptions {
  return { directory, ttlSeconds: 5, transport: 'udp', ready: true, ...over };
}

function query(name: string, type: RecordType | 'ANY' = 'A', extra: Partial<Packet> = {}): Buffer {
  return dnsPacket.encode({ type: 'query', id: 4242, flags: dnsPacket.RECURSION_DESIRED, questions: [{ name, type: type as RecordType, class: 'IN' }], ...extra });
}

function ask(name: string, type: RecordType | 'ANY' = 'A', o: Partial<AnswerOptions> = {}, extra: Partial<Packet> = {}): DecodedPacket & { rcode?: string } {
  const out = answerDnsQuery(query(name, type, extra), opts(o));
  expect(out).toBeDefined();
  return dnsPacket.decode(out!);
}

function data(p: Packet): unknown[] {
  return (p.answers ?? []).map((a) => ('data' in a ? a.data : undefined));
}

describe('answerDnsQuery', () => {
  it('answers A and AAAA for each form of a Service name, case-insensitively, echoing the question as asked', () => {
    for (const name of ['web.default.svc.cluster.local', 'web.default.svc', 'web.default', 'WEB.Default.SVC.Cluster.Local']) {
      const a = ask(name, 'A');
      expect(a.rcode).toBe('NOERROR');
      expect(a.id).toBe(4242);
      expect(a.flag_qr && a.flag_aa && a.flag_rd).toBe(true);
      expect(a.flag_ra).toBe(false);
      expect(a.questions).toEqual([{ name, type: 'A', class: 'IN' }]);
      expect(a.answers).toEqual([{ name, type: 'A', ttl: 5, class: 'IN', flush: false, data: '10.96.0.10' }]);
      expect(data(ask(name, 'AAAA'))).toEqual(['fd00::10']);
    }
    expect(data(ask('web.default.svc.cluster.local', 'ANY'))).toEqual(['10.96.0.10', 'fd00::10']);
  });

  it('answers SRV for named ports, with the target\'s addresses as additionals', () => {
    const srv = ask('_http._tcp.web.default.svc.cluster.local', 'SRV');
    expect(srv.rcode).toBe('NOERROR');
    expect(data(srv)).toEqual([{ priority: 0, weight: 100, port: 80, target: 'web.default.svc.cluster.local' }]);
    expect(srv.additionals?.map((a) => ('data' in a ? a.data : a.type))).toEqual(['10.96.0.10', 'fd00::10']);
    expect(data(ask('_dns._udp.kube-dns.kube-system.svc', 'SRV'))).toEqual([{ priority: 0, weight: 100, port: 53, target: 'kube-dns.kube-system.svc.cluster.local' }]);
    // At the Service's own name: every named port.
    expect(data(ask('web.default.svc.cluster.local', 'SRV')).map((d) => (d as { port: number }).port)).toEqual([80, 9090]);
    // A port name the Service lacks, or the wrong protocol: no such name.
    expect(ask('_http._udp.web.default.svc.cluster.local', 'SRV').rcode).toBe('NXDOMAIN');
    expect(ask('_nope._tcp.web.default.svc.cluster.local', 'SRV').rcode).toBe('NXDOMAIN');
    // An unnamed port has no SRV record; the name still exists.
    const plain = ask('plain.default.svc.cluster.local', 'SRV');
    expect(plain.rcode).toBe('NOERROR');
    expect(plain.answers).toEqual([]);
  });

  it('answers NXDOMAIN with the SOA for unknown names in the domain and in svc, REFUSED elsewhere', () => {
    const nx = ask('nope.default.svc.cluster.local');
    expect(nx.rcode).toBe('NXDOMAIN');
    expect(nx.flag_aa).toBe(true);
    expect(nx.authorities).toHaveLength(1);
    expect(nx.authorities![0]).toMatchObject({ type: 'SOA', name: 'cluster.local', ttl: 5, data: { mname: 'ns.dns.cluster.local', minimum: 5 } });
    expect(ask('1-2-3-4.default.pod.cluster.local').rcode).toBe('NXDOMAIN');
    expect(ask('nope.default.svc').authorities![0]).toMatchObject({ type: 'SOA', name: 'svc' });
    expect(ask('example.com').rcode).toBe('REFUSED'); // the two-label shape, but no such Service
    expect(ask('www.example.com').rcode).toBe('REFUSED');
    expect(ask('web.default.svc.other.domain').rcode).toBe('REFUSED');
    expect(ask('example.com').flag_aa).toBe(false);
  });

  it('answers NOERROR without records for names that exist with nothing of the type asked', () => {
    for (const [name, type] of [['default.svc.cluster.local', 'A'], ['svc.cluster.local', 'A'], ['cluster.local', 'NS'], ['web.default.svc.cluster.local', 'MX'], ['_tcp.web.default.svc.cluster.local', 'SRV'], ['kube-dns.kube-system.svc', 'TXT']] as const) {
      const r = ask(name, type);
      expect(r.rcode, `${name} ${type}`).toBe('NOERROR');
      expect(r.answers).toEqual([]);
      expect(r.authorities?.[0]?.type).toBe('SOA');
    }
    expect(ask('nope.svc.cluster.local').rcode).toBe('NXDOMAIN'); // a namespace with no Service
    expect(data(ask('cluster.local', 'SOA'))[0]).toMatchObject({ rname: 'hostmaster.cluster.local' });
    expect(ask('Cluster.Local.', 'SOA').answers).toEqual([expect.objectContaining({ type: 'SOA', name: 'cluster.local' })]);
    // svc.<domain> exists but is no zone's apex: an answer owned by cluster.local would be thrown
    // away by a validating resolver (RFC 1034 4.3.2): NODATA, the SOA in the authority section.
    const svcSoa = ask('svc.cluster.local', 'SOA');
    expect(svcSoa.rcode).toBe('NOERROR');
    expect(svcSoa.answers).toEqual([]);
    expect(svcSoa.authorities?.[0]).toMatchObject({ type: 'SOA', name: 'cluster.local' });
  });

  it('answers SERVFAIL in the domain until the first sync', () => {
    expect(ask('web.default.svc.cluster.local', 'A', { ready: false }).rcode).toBe('SERVFAIL');
    expect(ask('www.example.org', 'A', { ready: false }).rcode).toBe('REFUSED');
  });

  it('answers NOTIMP for other opcodes, FORMERR for what it cannot read, nothing for responses and scraps', () => {
    const notify = query('web.default.svc.cluster.local');
    notify.writeUInt16BE(notify.readUInt16BE(2) | (4 << 11), 2); // NOTIFY
    const n = dnsPacket.decode(answerDnsQuery(notify, opts())!) as { rcode?: string; opcode?: string };
    expect(n.rcode).toBe('NOTIMP');
    expect(n.opcode).toBe('NOTIFY');
    const two = dnsPacket.encode({ type: 'query', id: 7, questions: [{ name: 'a.b', type: 'A' }, { name: 'c.d', type: 'A' }] });
    expect((dnsPacket.decode(answerDnsQuery(two, opts())!) as { rcode?: string }).rcode).toBe('FORMERR');
    const truncated = query('web.default.svc.cluster.local').subarray(0, 20);
    const f = answerDnsQuery(truncated, opts())!;
    expect(f.readUInt16BE(0)).toBe(4242);
    expect(f.readUInt16BE(2) & 0xf).toBe(1);
    expect(answerDnsQuery(Buffer.from([1, 2, 3]), opts())).toBeUndefined();
    const response = query('web.default.svc.cluster.local');
    response.writeUInt16BE(response.readUInt16BE(2) | 0x8000, 2);
    expect(answerDnsQuery(response, opts())).toBeUndefined();
    expect(ask('web.default.svc.cluster.local', 'A', {}, {}).rcode).toBe('NOERROR');
    const chaos = dnsPacket.encode({ type: 'query', id: 9, questions: [{ name: 'version.bind', type: 'TXT', class: 'CH' }] });
    expect((dnsPacket.decode(answerDnsQuery(chaos, opts())!) as { rcode?: string }).rcode).toBe('REFUSED');
  });

  it('speaks EDNS(0): echoes an OPT record, answers BADVERS to other versions', () => {
    const edns = { additionals: [{ type: 'OPT' as const, name: '.', udpPayloadSize: 4096, extendedRcode: 0, ednsVersion: 0, flags: 0, flag_do: false, options: [] }] };
    const r = ask('web.default.svc.cluster.local', 'A', {}, edns);
    expect(r.additionals).toMatchObject([{ type: 'OPT', udpPayloadSize: 1232 }]);
    const v1 = { additionals: [{ ...edns.additionals[0]!, ednsVersion: 1 }] };
    const bad = ask('web.default.svc.cluster.local', 'A', {}, v1);
    expect(bad.answers).toEqual([]);
    expect(bad.additionals).toMatchObject([{ type: 'OPT', extendedRcode: 1 }]); // 16: BADVERS
  });

  it('sets TC when the answer does not fit a UDP message, and answers in full over TCP', () => {
    const big: DirectoryUnit[] = [];
    for (let i = 0; i < 60; i++) big.push(unit('default/wide', `port-${i}`, 1000 + i, ['10.96.1.1']));
    const wide = new ServiceDirectory({ domain: 'cluster.local', units: () => big, clientAddresses: (_s, ips) => ips });
    const overUdp = dnsPacket.decode(answerDnsQuery(query('wide.default.svc.cluster.local', 'SRV'), opts({ directory: wide }))!);
    expect(overUdp.flag_tc).toBe(true);
    expect(overUdp.answers).toEqual([]);
    expect(overUdp.questions).toHaveLength(1);
    const overTcp = dnsPacket.decode(answerDnsQuery(query('wide.default.svc.cluster.local', 'SRV'), opts({ directory: wide, transport: 'tcp' }))!);
    expect(overTcp.flag_tc).toBe(false);
    expect(overTcp.answers).toHaveLength(60);
  });

  it('never throws on random bytes or on a real query with bytes flipped', () => {
    const random = seeded(20261124);
    const base = query('_http._tcp.web.default.svc.cluster.local', 'SRV', { additionals: [{ type: 'OPT', name: '.', udpPayloadSize: 4096, extendedRcode: 0, ednsVersion: 0, flags: 0, flag_do: false, options: [] }] });
    let answered = 0;
    const bad: string[] = [];
    for (let i = 0; i < 2_000; i++) {
      let msg: Buffer;
      if (i % 2 === 0) {
        msg = Buffer.alloc(Math.floor(random() * 80));
        for (let j = 0; j < msg.length; j++) msg[j] = Math.floor(random() * 256);
      } else {
        msg = Buffer.from(base);
        for (let k = 0; k < 3; k++) msg[Math.floor(random() * msg.length)] = Math.floor(random() * 256);
        if (random() < 0.3) msg = msg.subarray(0, Math.floor(random() * msg.length));
      }
      for (const transport of ['udp', 'tcp'] as const) {
        const out = answerDnsQuery(msg, opts({ transport }));
        if (out === undefined) continue;
        answered++;
        // Whatever goes out is a well-formed response to that id.
        const r = dnsPacket.decode(out);
        if (r.type !== 'response' || r.id !== msg.readUInt16BE(0) || (transport === 'udp' && out.length > 1232)) bad.push(msg.toString('hex'));
      }
    }
    expect(bad).toEqual([]);
    expect(answered).toBeGreaterThan(500);
  });
});
