import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import type { IPFamily } from '../src/core/address.js';
import type { ServicePort } from '../src/core/model.js';
import { parseConntrackList, staleFlows, type ConntrackEntry, type StaleQuery } from '../src/core/rules/conntrack-entries.js';
import { emptyChains } from '../src/core/rules/chains.js';
import { freshJumps, parseIptablesSave } from '../src/core/rules/iptables-save.js';
import { previousProxyPorts } from '../src/core/rules/previous-ports.js';
import { renderIptablesRules } from '../src/core/rules/render-iptables.js';
import { planSync } from '../src/core/rules/sync-plan.js';
import type { ProxyUnit } from '../src/core/units.js';
import { servicePort, unitsOf } from './helpers/service-port.js';

function sp(over: Partial<ServicePort> & { key: string }): ServicePort {
  return servicePort(over.key, over);
}

const GOLDEN = fileURLToPath(new URL('./golden/iptables/', import.meta.url));

describe('previousProxyPorts', () => {
  it('reads back the proxy port of every unit the renderer wrote, in either family and either NAT target', () => {
    const units = unitsOf(
      sp({ key: 'default/web:http', nodePort: 30080, externalIPs: ['203.0.113.10'] }),
      sp({ key: 'default/dns:dns', protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.53', 'fd00::35'] }),
      sp({ key: 'default/local:http', nodePort: 30083, externalIPs: ['203.0.113.20'], externalTrafficPolicy: 'Local' }),
      sp({ key: 'default/v6:http', clusterIPs: ['fd00::10'] }),
    );
    const targets = units.map((unit, i) => ({ unit, proxyPort: 40001 + i }));
    const want = new Map(targets.map((t) => [t.unit.id, t.proxyPort]));
    for (const bindAddress of ['0.0.0.0', '192.168.1.10']) {
      const found = new Map<string, number>();
      for (const family of [4, 6] as IPFamily[]) {
        const rendered = renderIptablesRules({ family, targets, bindAddress, hostIP: family === 4 ? '192.168.1.10' : '2001:db8::10', nodePortCIDRs: [] });
        previousProxyPorts(parseIptablesSave(planSync(rendered.chains, emptyChains(), freshJumps())), found);
      }
      // With --bind-address (IPv4) the IPv6-only unit cannot be programmed: it has no NAT rule,
      // hence no flows whose entries its old port would keep, and nothing to read back.
      if (bindAddress !== '0.0.0.0') want.delete('default/v6:http');
      expect(found).toEqual(want);
    }
  });

  it('reads the golden layouts, the external half of a split service port included', () => {
    const ports = previousProxyPorts(parseIptablesSave(readFileSync(`${GOLDEN}split-traffic-policy.rules`, 'utf8')));
    expect(ports).toEqual(new Map([['default/local:http', 40001], ['default/local:http (external)', 40002]]));
    const v6 = previousProxyPorts(parseIptablesSave(readFileSync(`${GOLDEN}ipv6.rules`, 'utf8')));
    expect(v6).toEqual(new Map([['default/web6:http', 40001]]));
  });

  it('reads comments iptables-save printed without quotes, and ignores rules that are not ours or not readable', () => {
    const dump = [
      '*nat',
      ':KUBE-PORTALS-CONTAINER - [0:0]',
      '-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p udp -m comment --comment plain_name -m udp --dport 53 -j REDIRECT --to-ports 40123',
      '-A KUBE-PORTALS-CONTAINER -d 10.96.0.11/32 -p udp -m comment --comment "default/odd:x" -m udp --dport 53 -j REDIRECT --to-ports 99999',
      '-A KUBE-PORTALS-CONTAINER -d 10.96.0.12/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 40124',
      '-A PREROUTING -p tcp -m comment --comment "default/web:http" -j DNAT --to-destination 10.0.0.1:8080',
      'COMMIT',
      '*filter',
      ':KUBE-PROXY-PORTS - [0:0]',
      '-A KUBE-PROXY-PORTS -p tcp -m comment --comment "default/web:http node port" -m tcp --dport 30080 -j REJECT',
      'COMMIT',
      '',
    ].join('\n');
    expect(previousProxyPorts(parseIptablesSave(dump))).toEqual(new Map([['plain_name', 40123]]));
  });
});

const LIST = `
udp      17 117 src=10.200.1.2 dst=10.96.0.10 sport=40053 dport=53 src=10.200.1.1 dst=10.200.1.2 sport=41000 dport=40053 [ASSURED] mark=0 use=1
ipv4     2 udp      17 29 src=10.200.2.2 dst=10.200.2.1 sport=40054 dport=30053 [UNREPLIED] src=10.200.2.1 dst=10.200.2.2 sport=33001 dport=40054 mark=0 use=1
tcp      6 431999 ESTABLISHED src=10.200.1.2 dst=10.96.0.10 sport=40080 dport=80 src=10.200.1.1 dst=10.200.1.2 sport=33002 dport=40080 [ASSURED] mark=0 use=1
icmp     1 29 src=10.200.1.2 dst=10.200.1.1 type=8 code=0 id=7 src=10.200.1.1 dst=10.200.1.2 type=0 code=0 id=7 mark=0 use=1
conntrack v1.4.7 (conntrack-tools): 3 flow entries have been shown.
`;

describe('parseConntrackList', () => {
  it('reads both tuples of tcp and udp entries, plain or extended, and skips the rest', () => {
    expect(parseConntrackList(LIST)).toEqual([
      { protocol: 'udp', orig: { src: '10.200.1.2', dst: '10.96.0.10', sport: 40053, dport: 53 }, reply: { src: '10.200.1.1', dst: '10.200.1.2', sport: 41000, dport: 40053 } },
      { protocol: 'udp', orig: { src: '10.200.2.2', dst: '10.200.2.1', sport: 40054, dport: 30053 }, reply: { src: '10.200.2.1', dst: '10.200.2.2', sport: 33001, dport: 40054 } },
      { protocol: 'tcp', orig: { src: '10.200.1.2', dst: '10.96.0.10', sport: 40080, dport: 80 }, reply: { src: '10.200.1.1', dst: '10.200.1.2', sport: 33002, dport: 40080 } },
    ]);
  });

  it('lower-cases IPv6 addresses, so they compare with the portals', () => {
    const [e] = parseConntrackList('udp 17 20 src=FD00::2 dst=FD00::A sport=1 dport=53 src=fd00::1 dst=fd00::2 sport=40001 dport=1 mark=0 use=1');
    expect(e?.orig.dst).toBe('fd00::a');
  });
});

function entry(protocol: 'tcp' | 'udp', dst: string, dport: number, replySrc: string, replySport: number, src = '10.200.1.2', sport = 40000): ConntrackEntry {
  return { protocol, orig: { src, dst, sport, dport }, reply: { src: replySrc, dst: src, sport: replySport, dport: sport } };
}

describe('staleFlows', () => {
  const [udp, tcp] = unitsOf(
    sp({ key: 'default/echo:udp', protocol: 'UDP', port: 53, nodePort: 30053, externalIPs: ['203.0.113.10'] }),
    sp({ key: 'default/echo:tcp', port: 80, nodePort: 30080 }),
  ) as [ProxyUnit, ProxyUnit];
  const query = (over: Partial<StaleQuery> = {}): StaleQuery => ({
    family: 4,
    targets: [{ unit: udp, proxyPort: 41000 }, { unit: tcp, proxyPort: 41001 }],
    localAddresses: new Set(['127.0.0.1', '10.200.1.1', '10.200.2.1']),
    servedTcpPorts: new Set([41001]),
    ...over,
  });
  const keys = (entries: ConntrackEntry[], q = query()): string[] => staleFlows(entries, q).map((f) => `${f.protocol} ${f.origDst}:${f.origDport} -> ${f.replySrc}:${f.replySport} x${f.entries} (${f.unit})`);

  it('UDP: an entry NATed to another port than the current proxy port is stale, one filter per portal and old target', () => {
    expect(keys([
      entry('udp', '10.96.0.10', 53, '10.200.1.1', 33000),
      entry('udp', '10.96.0.10', 53, '10.200.1.1', 33000, '10.200.1.3'),
      entry('udp', '10.96.0.10', 53, '10.200.1.1', 41000), // current: kept
      entry('udp', '203.0.113.10', 53, '10.200.1.1', 33000),
      entry('udp', '10.200.2.1', 30053, '10.200.2.1', 33000),
    ])).toEqual([
      'UDP 10.96.0.10:53 -> 10.200.1.1:33000 x2 (default/echo:udp)',
      'UDP 203.0.113.10:53 -> 10.200.1.1:33000 x1 (default/echo:udp)',
      'UDP 10.200.2.1:30053 -> 10.200.2.1:33000 x1 (default/echo:udp)',
    ]);
  });

  it('UDP: an entry made before our rules existed (not NATed) is stale, except at a node port, which the proxy holds and serves', () => {
    expect(keys([
      entry('udp', '10.96.0.10', 53, '10.96.0.10', 53),
      entry('udp', '10.200.2.1', 30053, '10.200.2.1', 30053),
    ])).toEqual(['UDP 10.96.0.10:53 -> 10.96.0.10:53 x1 (default/echo:udp)']);
  });

  it('node ports: only entries our rules sent to this node count; other ports, protocols and families are not ours', () => {
    expect(keys([
      entry('udp', '10.200.9.9', 30053, '172.17.0.2', 8053), // someone else's DNAT, forwarded
      entry('udp', '10.96.0.10', 54, '10.200.1.1', 33000),
      entry('tcp', '10.96.0.10', 53, '10.200.1.1', 33000),
    ])).toEqual([]);
    expect(keys([entry('udp', '10.96.0.10', 53, '10.200.1.1', 33000)], query({ family: 6 }))).toEqual([]);
  });

  it('TCP: only entries NATed to this node at a port this process never bound; not-NATed ones may be real connections', () => {
    expect(keys([
      entry('tcp', '10.96.0.10', 80, '10.200.1.1', 33000),
      entry('tcp', '10.96.0.10', 80, '10.200.1.1', 41001), // current
      entry('tcp', '10.96.0.10', 80, '10.200.1.1', 39000), // served earlier in this run: may still run
      entry('tcp', '10.96.0.10', 80, '10.96.0.10', 80), // not NATed
      entry('tcp', '10.96.0.10', 80, '10.244.1.5', 8080), // NATed elsewhere (another proxy's DNAT to a pod)
      entry('tcp', '127.0.0.1', 30080, '10.200.2.1', 33000),
    ], query({ servedTcpPorts: new Set([41001, 39000]) }))).toEqual([
      'TCP 10.96.0.10:80 -> 10.200.1.1:33000 x1 (default/echo:tcp)',
      'TCP 127.0.0.1:30080 -> 10.200.2.1:33000 x1 (default/echo:tcp)',
    ]);
  });

  it('IPv6 portals match in an IPv6 dump; an exact portal wins over a node port of the same number', () => {
    const [v6] = unitsOf(sp({ key: 'default/v6:dns', protocol: 'UDP', port: 30053, clusterIPs: ['fd00::a'] }));
    const q = query({ family: 6, targets: [{ unit: v6 as ProxyUnit, proxyPort: 42000 }, { unit: udp, proxyPort: 41000 }], localAddresses: new Set(['fd00::1']) });
    expect(keys([entry('udp', 'fd00::a', 30053, 'fd00::1', 33000, 'fd00::2')], q)).toEqual(['UDP fd00::a:30053 -> fd00::1:33000 x1 (default/v6:dns)']);
  });
});
