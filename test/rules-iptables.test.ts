import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { seededRandom } from '../src/core/balancer/shared-order.js';
import type { IPFamily } from '../src/core/address.js';
import type { ServicePort } from '../src/core/model.js';
import { emptyChains, type TableChains } from '../src/core/rules/chains.js';
import { chainsInDump, freshJumps, parseIptablesSave, planJumps, planRemoval, splitWords } from '../src/core/rules/iptables-save.js';
import { IncrementalRender } from '../src/core/rules/incremental-render.js';
import { familyInUse, renderIptablesRules, type IptablesRenderInput, type PortalTarget, type RenderedRules } from '../src/core/rules/render-iptables.js';
import { addressTree, portTree } from '../src/core/rules/dispatch-tree.js';
import { planSync } from '../src/core/rules/sync-plan.js';
import { planUnits } from '../src/core/units.js';
import { iptablesSkipReason, nsExec, reportSkip, run as runCmd } from './helpers/netns.js';
import { servicePort } from './helpers/service-port.js';

/**
 * Golden tests of the rendered iptables-restore payloads. To accept a change after reading the
 * diff: UPDATE_GOLDEN=1 npx vitest run test/rules-iptables.test.ts
 */
const GOLDEN = fileURLToPath(new URL('./golden/iptables/', import.meta.url));
const update = process.env.UPDATE_GOLDEN === '1';

function sp(over: Partial<ServicePort> & { key: string }): ServicePort {
  return servicePort(over.key, over);
}

/** Units of `ports`, given proxy ports in order starting at `firstProxyPort`. */
function targets(ports: ServicePort[], firstProxyPort = 40001): PortalTarget[] {
  let next = firstProxyPort;
  return ports.flatMap((p) => planUnits(p, { clusterEndpoints: [], externalEndpoints: [] })).map((unit) => ({ unit, proxyPort: next++ }));
}

function chainsOf(family: IPFamily, t: PortalTarget[], over: Partial<IptablesRenderInput> = {}): { chains: TableChains; errors: string[] } {
  return renderIptablesRules({ family, targets: t, bindAddress: '0.0.0.0', hostIP: family === 4 ? '192.168.1.10' : '2001:db8::10', nodePortCIDRs: [], ...over });
}

/** The transaction of a fresh install: every chain, every jump. */
function render(family: IPFamily, t: PortalTarget[], over: Partial<IptablesRenderInput> = {}): { payload: string; errors: string[] } {
  const rendered = chainsOf(family, t, over);
  return { payload: planSync(rendered.chains, emptyChains(), freshJumps()), errors: rendered.errors };
}

/** The NAT rules of a payload: one per portal (per node-port CIDR), each naming its unit. */
function natRules(payload: string): string[] {
  return payload.split('\n').filter((l) => / -j (REDIRECT|DNAT) /.test(l));
}

function golden(name: string, text: string): void {
  const file = join(GOLDEN, `${name}.rules`);
  if (update || !existsSync(file)) {
    if (!update) throw new Error(`golden file ${file} is missing; run with UPDATE_GOLDEN=1 to create it, then read it`);
    mkdirSync(GOLDEN, { recursive: true });
    writeFileSync(file, text);
    return;
  }
  expect(text).toBe(readFileSync(file, 'utf8'));
}

const cases: Array<{ name: string; family: IPFamily; ports: ServicePort[]; over?: Partial<IptablesRenderInput> }> = [
  { name: 'clusterip', family: 4, ports: [sp({ key: 'default/web:http' })] },
  { name: 'nodeport', family: 4, ports: [sp({ key: 'default/web:http', nodePort: 30080 })] },
  {
    name: 'nodeport-addresses',
    family: 4,
    ports: [sp({ key: 'default/web:http', nodePort: 30080 })],
    over: { nodePortCIDRs: ['192.168.1.0/24', '10.0.0.0/8', 'fd00:1::/64'] },
  },
  { name: 'externalip', family: 4, ports: [sp({ key: 'default/web:http', externalIPs: ['203.0.113.10', '203.0.113.11'] })] },
  { name: 'loadbalancer', family: 4, ports: [sp({ key: 'default/web:https', port: 443, nodePort: 30443, loadBalancerIPs: ['198.51.100.7'] })] },
  {
    // Served from the ranges only, written as iptables-save writes them back (host bits cleared);
    // the IPv6 range has no IPv4 rule, the ClusterIP and node port take no ranges. The second load
    // balancer has ranges of the other family only: as with kube-proxy, every source.
    name: 'loadbalancer-source-ranges',
    family: 4,
    ports: [
      sp({ key: 'default/web:https', port: 443, nodePort: 30443, loadBalancerIPs: ['198.51.100.7'], loadBalancerSourceRanges: ['203.0.113.5/24', '192.0.2.7/32', '2001:db8::/32'] }),
      sp({ key: 'default/api:https', port: 443, clusterIPs: ['10.96.0.11'], loadBalancerIPs: ['198.51.100.8'], loadBalancerSourceRanges: ['2001:db8::/32'] }),
    ],
  },
  {
    name: 'loadbalancer-source-ranges-ipv6',
    family: 6,
    ports: [sp({ key: 'default/web6:https', port: 443, clusterIPs: ['fd00:10:96::a'], loadBalancerIPs: ['2001:db8:1::7'], loadBalancerSourceRanges: ['2001:0DB8:0:0:1:0:0:1/128', 'fd00:0:0:1::5/64', '0.0.0.0/0'] })],
  },
  {
    name: 'tcp-and-udp',
    family: 4,
    ports: [
      sp({ key: 'kube-system/kube-dns:dns-tcp', port: 53, protocol: 'TCP', clusterIPs: ['10.96.0.10'] }),
      sp({ key: 'kube-system/kube-dns:dns', port: 53, protocol: 'UDP', clusterIPs: ['10.96.0.10'] }),
    ],
  },
  { name: 'ipv6', family: 6, ports: [sp({ key: 'default/web6:http', clusterIPs: ['fd00:10:96::a'], nodePort: 30081, externalIPs: ['2001:db8:1::10'] })] },
  {
    name: 'dual-stack-ipv4-side',
    family: 4,
    ports: [sp({ key: 'default/dual:http', clusterIPs: ['10.96.0.12', 'fd00:10:96::c'], nodePort: 30082 })],
  },
  {
    // externalTrafficPolicy Local splits the service port: the external half (node port only)
    // has its own proxy port, and takes its families from the cluster half.
    name: 'split-traffic-policy',
    family: 4,
    ports: [sp({ key: 'default/local:http', nodePort: 30083, externalIPs: ['203.0.113.20'], externalTrafficPolicy: 'Local' })],
  },
  { name: 'bind-address', family: 4, ports: [sp({ key: 'default/web:http', nodePort: 30080 })], over: { bindAddress: '192.168.1.10' } },
];

describe('rendered iptables-restore payloads (golden)', () => {
  it.each(cases)('$name', ({ name, family, ports, over }) => {
    const { payload, errors } = render(family, targets(ports), over);
    expect(errors).toEqual([]);
    golden(name, payload);
  });

  it('renders every NAT rule of a Service with the namespace/name:port comment', () => {
    const { payload } = render(4, targets([sp({ key: 'default/web:http', nodePort: 30080, externalIPs: ['203.0.113.10'], loadBalancerIPs: ['198.51.100.7'] })]));
    const rules = natRules(payload);
    // ClusterIP, externalIP, LB IP and node port, once each: the node's own TCP takes the same rules.
    expect(rules).toHaveLength(4);
    for (const r of rules) expect(r).toContain('--comment "default/web:http"');
    const udp = natRules(render(4, targets([sp({ key: 'default/dns:dns', protocol: 'UDP', port: 53, nodePort: 30053 })])).payload);
    expect(udp).toHaveLength(4);
    for (const r of udp) expect(r).toContain('--comment "default/dns:dns"');
    // The node's own UDP: to the ClusterIP, DNAT to the node's address; to a node port (an address
    // of the node already, 127.0.0.1 among them) the port only, so the reply leaves from the
    // address the client sent to and conntrack matches it.
    expect(udp.filter((r) => r.includes(' -j DNAT '))).toEqual([
      expect.stringMatching(/^-A KUBE-UP-PH-\w+ -d 10\.96\.0\.10\/32 -p udp .* --dport 53 -j DNAT --to-destination 192\.168\.1\.10:40001$/),
      expect.stringMatching(/^-A KUBE-UP-NH-\w+ -p udp .* --dport 30053 -j DNAT --to-destination :40001$/),
    ]);
  });

  /** The rules that do something to a packet (not the jumps between our chains). */
  function actions(payload: string): string[] {
    return payload.split('\n').filter((l) => / -j (REDIRECT|DNAT|REJECT|ACCEPT)\b/.test(l));
  }

  it('an IPv4-only Service has no IPv6 rules; a dual-stack one has both', () => {
    const v4only = render(6, targets([sp({ key: 'default/web:http', nodePort: 30080 })])).payload;
    expect(actions(v4only)).toEqual([]);
    const dual = render(6, targets([sp({ key: 'default/dual:dns', protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.12', 'fd00::c'] })])).payload;
    expect(dual).toContain('-A KUBE-UP-PC-0c -d fd00::c/128 -p udp -m comment --comment "default/dual:dns" -m udp --dport 53 -j REDIRECT --to-ports 40001');
    expect(dual).toContain('-A KUBE-UP-PH-0c -d fd00::c/128 -p udp -m comment --comment "default/dual:dns" -m udp --dport 53 -j DNAT --to-destination [2001:db8::10]:40001');
  });

  it('a unit without a proxy port yet has no rules', () => {
    const [t] = targets([sp({ key: 'default/web:http' })]);
    const { payload } = render(4, [{ unit: t!.unit }]);
    expect(actions(payload)).toEqual([]);
  });

  it('with --bind-address of the other family, the portals are reported, not written', () => {
    const { payload, errors } = render(6, targets([sp({ key: 'default/web6:http', clusterIPs: ['fd00::a'] })]), { bindAddress: '192.168.1.10' });
    expect(natRules(payload)).toEqual([]);
    expect(errors).toEqual(['default/web6:http: cannot program its IPv6 portals: proxy ports listen on --bind-address 192.168.1.10 only']);
  });

  it('1,000 Services render as one payload', () => {
    const ports = Array.from({ length: 1000 }, (_, i) => sp({ key: `ns${i % 10}/svc${i}:http`, clusterIPs: [`10.96.${i >> 8}.${i & 255}`], nodePort: 30000 + i }));
    const { payload } = render(4, targets(ports));
    expect(natRules(payload)).toHaveLength(1000 * 2);
  });
});

describe('iptables-save parsing and plans', () => {
  const ours = `# Generated by iptables-save v1.8.9 (nf_tables)
*nat
:PREROUTING ACCEPT [10:600]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
:KUBE-NODEPORT-CONTAINER - [0:0]
:KUBE-NODEPORT-HOST - [0:0]
:KUBE-PORTALS-CONTAINER - [0:0]
:KUBE-PORTALS-HOST - [0:0]
-A PREROUTING -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-CONTAINER
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment "kube-userspace-proxy node ports; keep last" -j KUBE-NODEPORT-CONTAINER
-A OUTPUT -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-HOST
-A OUTPUT -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-HOST
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 40001
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-NODEPORT-NON-LOCAL - [0:0]
-A INPUT -m comment --comment "kube-userspace-proxy node port traffic may enter" -j KUBE-NODEPORT-NON-LOCAL
-A FORWARD -j DOCKER-USER
COMMIT
`;

  it('reads a rule\'s target, also with quotes around and after it', () => {
    const dump = ['*filter', ':X - [0:0]', '-A INPUT -m comment --comment "not -j THIS" -j X', '-A INPUT -p tcp -j LOG --log-prefix "a -j B "', '-A INPUT -m comment --comment "say \\"-j Y\\"" -j X', 'COMMIT', ''].join('\n');
    expect(parseIptablesSave(dump).get('filter')!.rules.map((r) => r.target)).toEqual(['X', 'LOG', 'X']);
  });

  it('splits words the way iptables-restore does', () => {
    expect(splitWords('-m comment --comment "a \\"b\\" c" -j X')).toEqual(['-m', 'comment', '--comment', 'a "b" c', '-j', 'X']);
  });

  it('finds our chains and jumps among other rules', () => {
    const saved = parseIptablesSave(ours);
    expect([...saved.keys()]).toEqual(['nat', 'filter']);
    expect(saved.get('nat')!.chains.has('KUBE-PORTALS-HOST')).toBe(true);
    expect(saved.get('nat')!.rules.filter((r) => r.target === 'KUBE-PORTALS-HOST')).toHaveLength(2);
  });

  it('plans the missing jumps, removes doubled ones, replaces an earlier version\'s, and leaves the rest alone', () => {
    const plan = planJumps(parseIptablesSave(ours));
    expect(plan.nat).toEqual([
      '-D OUTPUT -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-HOST',
      '-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment "kube-userspace-proxy node ports; keep last" -j KUBE-NODEPORT-HOST',
    ]);
    // The dump's filter jump is an earlier version's, without the conntrack conditions that keep
    // other traffic out of the chain: it is replaced, not kept.
    expect(plan.filter).toEqual([
      '-D INPUT -m comment --comment "kube-userspace-proxy node port traffic may enter" -j KUBE-NODEPORT-NON-LOCAL',
      '-I INPUT 1 -m conntrack --ctstate NEW -m conntrack --ctstate DNAT -m comment --comment "kube-userspace-proxy node port traffic may enter" -j KUBE-NODEPORT-NON-LOCAL',
      '-I INPUT 1 -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -m comment --comment "kube-userspace-proxy proxy ports answer portal traffic only" -j KUBE-PROXY-PORTS',
    ]);
  });

  it('removes jumps into any chain of ours from chains that are not ours', () => {
    const dump = ['*nat', ':KUBE-UP-PC-a5 - [0:0]', '-A PREROUTING -j KUBE-UP-PC-a5', 'COMMIT', ''].join('\n');
    expect(planJumps(parseIptablesSave(dump)).nat[0]).toBe('-D PREROUTING -j KUBE-UP-PC-a5');
  });

  it('plans nothing when every jump is there once', () => {
    const fresh = freshJumps();
    const dump = ['*nat', ...fresh.nat.map((l) => l.replace(/^-I (\S+) 1 /, '-A $1 ')), 'COMMIT', '*filter', ...fresh.filter.map((l) => l.replace(/^-I (\S+) 1 /, '-A $1 ')), 'COMMIT'].join('\n');
    expect(planJumps(parseIptablesSave(dump))).toEqual({ nat: [], filter: [] });
  });

  it('a fresh install puts the guard before the node-port ACCEPT', () => {
    const { filter } = freshJumps();
    expect(filter.map((l) => /-j (\S+)$/.exec(l)?.[1])).toEqual(['KUBE-NODEPORT-NON-LOCAL', 'KUBE-PROXY-PORTS']);
    // Inserted at position 1 in this order: the guard ends up first.
  });

  it('plans the removal of our jumps and chains only', () => {
    expect(planRemoval(parseIptablesSave(ours))).toBe(`*nat
-D PREROUTING -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-CONTAINER
-D PREROUTING -m addrtype --dst-type LOCAL -m comment --comment "kube-userspace-proxy node ports; keep last" -j KUBE-NODEPORT-CONTAINER
-D OUTPUT -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-HOST
-D OUTPUT -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-HOST
-F KUBE-PORTALS-CONTAINER
-F KUBE-PORTALS-HOST
-F KUBE-NODEPORT-CONTAINER
-F KUBE-NODEPORT-HOST
-X KUBE-PORTALS-CONTAINER
-X KUBE-PORTALS-HOST
-X KUBE-NODEPORT-CONTAINER
-X KUBE-NODEPORT-HOST
COMMIT
*filter
-D INPUT -m comment --comment "kube-userspace-proxy node port traffic may enter" -j KUBE-NODEPORT-NON-LOCAL
-F KUBE-NODEPORT-NON-LOCAL
-X KUBE-NODEPORT-NON-LOCAL
COMMIT
`);
    expect(planRemoval(parseIptablesSave('*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n'))).toBe('');
  });
});

describe('dispatch trees', () => {
  it('files a portal by the last byte of its address: low nibble, then the whole byte', () => {
    const v4 = addressTree('ROOT', 'P-', 4, [{ lastByte: 0xa5, spec: 'a' }, { lastByte: 0x05, spec: 'b' }, { lastByte: 0xa5, spec: 'c' }]);
    expect(Object.fromEntries(v4)).toEqual({
      ROOT: ['-d 0.0.0.5/0.0.0.15 -j P-5'],
      'P-5': ['-d 0.0.0.5/0.0.0.255 -j P-05', '-d 0.0.0.165/0.0.0.255 -j P-a5'],
      'P-05': ['b'],
      'P-a5': ['a', 'c'],
    });
    const v6 = addressTree('ROOT', 'P-', 6, [{ lastByte: 0x10, spec: 'x' }]);
    expect(Object.fromEntries(v6)).toEqual({ ROOT: ['-d ::/::f -j P-0'], 'P-0': ['-d ::10/::ff -j P-10'], 'P-10': ['x'] });
    expect(Object.fromEntries(addressTree('ROOT', 'P-', 4, []))).toEqual({ ROOT: [] });
  });

  it('files a port by protocol and block: 1,024 ports, then 64', () => {
    const entries = [
      { protocol: 'TCP' as const, port: 30080, spec: 'web' },
      { protocol: 'UDP' as const, port: 30080, spec: 'dns' },
      { protocol: 'TCP' as const, port: 65535, spec: 'top' },
      { protocol: 'TCP' as const, port: 1, spec: 'low' },
    ];
    expect(Object.fromEntries(portTree('ROOT', 'N-', entries, 2))).toEqual({
      ROOT: ['-p tcp -m tcp --dport 0:1023 -j N-t00', '-p tcp -m tcp --dport 29696:30719 -j N-t1d', '-p tcp -m tcp --dport 64512:65535 -j N-t3f', '-p udp -m udp --dport 29696:30719 -j N-u1d'],
      'N-t00': ['-p tcp -m tcp --dport 0:63 -j N-t000'],
      'N-t000': ['low'],
      'N-t1d': ['-p tcp -m tcp --dport 30080:30143 -j N-t1d6'],
      'N-t1d6': ['web'],
      'N-t3f': ['-p tcp -m tcp --dport 65472:65535 -j N-t3ff'],
      'N-t3ff': ['top'],
      'N-u1d': ['-p udp -m udp --dport 30080:30143 -j N-u1d6'],
      'N-u1d6': ['dns'],
    });
    expect(Object.fromEntries(portTree('ROOT', 'G-', entries.slice(0, 1), 1))).toEqual({ ROOT: ['-p tcp -m tcp --dport 29696:30719 -j G-t1d'], 'G-t1d': ['web'] });
  });

  /** The most rules a packet can be compared with below `chain`: its own, plus the longest way down from one of them. */
  function worstPath(chains: ReadonlyMap<string, readonly string[]>, chain: string): number {
    const rules = chains.get(chain) ?? [];
    let below = 0;
    for (const r of rules) {
      const to = / -j (\S+)$/.exec(r)?.[1];
      if (to !== undefined && chains.has(to)) below = Math.max(below, worstPath(chains, to));
    }
    return rules.length + below;
  }

  it('at 10,000 Services, a new connection meets about a hundred of our rules at most, not one per Service', () => {
    const ports = Array.from({ length: 10_000 }, (_, i) => sp({ key: `ns${i % 10}/svc${i}:http`, protocol: i % 5 === 0 ? 'UDP' : 'TCP', clusterIPs: [`10.96.${(i + 1) >> 8}.${(i + 1) & 255}`], nodePort: 30000 + i }));
    const { chains } = chainsOf(4, targets(ports, 33000));
    const worst = Object.fromEntries(['KUBE-PORTALS-CONTAINER', 'KUBE-PORTALS-HOST', 'KUBE-NODEPORT-CONTAINER', 'KUBE-NODEPORT-HOST'].map((c) => [c, worstPath(chains.nat, c)]));
    const filter = Object.fromEntries(['KUBE-PROXY-PORTS', 'KUBE-NODEPORT-NON-LOCAL'].map((c) => [c, worstPath(chains.filter, c)]));
    // Before the trees: 10,000 rules in each chain (20,000 in the guard).
    for (const n of [...Object.values(worst), ...Object.values(filter)]) expect(n).toBeLessThan(120);
  });
});

/** What iptables-restore does with a payload of ours, on a model of our chains: to check plans without a kernel. */
function applyPayload(before: TableChains, payload: string): TableChains {
  const after: TableChains = { nat: new Map([...before.nat].map(([c, r]) => [c, [...r]])), filter: new Map([...before.filter].map(([c, r]) => [c, [...r]])) };
  let table: Map<string, string[]> | undefined;
  for (const line of payload.split('\n')) {
    if (line.startsWith('*')) table = after[line.slice(1) as 'nat' | 'filter'];
    else if (line.startsWith(':')) table!.set(line.slice(1).split(' ')[0]!, []);
    else if (line.startsWith('-X ')) {
      const chain = line.slice(3);
      for (const rules of table!.values()) expect(rules.some((r) => r.endsWith(`-j ${chain}`)), `${chain} is still jumped to`).toBe(false);
      table!.delete(chain);
    } else if (line.startsWith('-A ')) {
      const [chain = '', ...rest] = line.slice(3).split(' ');
      const rules = table!.get(chain);
      if (rules) rules.push(rest.join(' '));
    }
  }
  return after;
}

describe('incremental syncs (planSync)', () => {
  const thousand = Array.from({ length: 1000 }, (_, i) => sp({ key: `ns${i % 10}/svc${i}:http`, clusterIPs: [`10.96.${(i + 1) >> 8}.${(i + 1) & 255}`], nodePort: 30000 + i }));
  const NONE = { nat: [], filter: [] };

  it('writes nothing when nothing changed', () => {
    const { chains } = chainsOf(4, targets(thousand));
    expect(planSync(chains, chainsOf(4, targets(thousand)).chains, NONE)).toBe('');
  });

  it('adding one Service to 1,000 writes its leaves (and their parents only where a leaf is new), and gets the node to the full result', () => {
    const before = chainsOf(4, targets(thousand)).chains;
    const added = sp({ key: 'zz/new:http', clusterIPs: ['10.96.200.77'], nodePort: 32000 });
    const after = chainsOf(4, [...targets(thousand), ...targets([added], 45000)]).chains;
    const payload = planSync(after, before, NONE);
    const written = payload.split('\n').filter((l) => l.startsWith(':')).map((l) => l.slice(1, l.indexOf(' ')));
    // The ClusterIP's leaf (77 = 0x4d: an existing leaf), the node port's new leaf and its new
    // block of 1,024 (with the roots that list them), the guard's and the ACCEPT's leaves.
    expect(written).toEqual(['KUBE-UP-PC-4d', 'KUBE-NODEPORT-CONTAINER', 'KUBE-UP-NC-t1f', 'KUBE-UP-NC-t1f4', 'KUBE-PROXY-PORTS', 'KUBE-UP-PP-t1f', 'KUBE-UP-PP-t2b', 'KUBE-NODEPORT-NON-LOCAL', 'KUBE-UP-NL-t2b']);
    expect(payload.split('\n').length).toBeLessThan(60);
    expect(applyPayload(before, payload)).toEqual(after);
  });

  it('removing the last Service of a leaf deletes the leaf after its parent stops jumping to it', () => {
    const one = targets([sp({ key: 'default/web:http', clusterIPs: ['10.96.0.10'] }), sp({ key: 'default/other:http', clusterIPs: ['10.96.0.26'] })]);
    const before = chainsOf(4, one).chains;
    const after = chainsOf(4, one.slice(1)).chains;
    const payload = planSync(after, before, NONE);
    expect(payload).toContain('-X KUBE-UP-PC-0a');
    expect(payload.indexOf(':KUBE-UP-PC-a - [0:0]')).toBeLessThan(payload.indexOf('-X KUBE-UP-PC-0a'));
    expect(applyPayload(before, payload)).toEqual(after);
  });

  it('a changed proxy port rewrites the leaves that name it, and nothing else', () => {
    const before = chainsOf(4, targets(thousand)).chains;
    const moved = targets(thousand).map((t, i) => (i === 500 ? { ...t, proxyPort: 60000 } : t));
    const after = chainsOf(4, moved).chains;
    const payload = planSync(after, before, NONE);
    expect(applyPayload(before, payload)).toEqual(after);
    expect(payload.split('\n').filter((l) => l.startsWith(':')).length).toBeLessThan(12);
  });

  it('from an empty node, writes every chain and the jumps', () => {
    const { chains } = chainsOf(4, targets(thousand));
    const payload = planSync(chains, emptyChains(), freshJumps());
    expect(applyPayload(emptyChains(), payload)).toEqual(chains);
    expect(payload).toContain('-I PREROUTING 1 ');
  });
});

describe('familyInUse', () => {
  it('says a family is in use when a unit is served in it or its proxy port is reachable in it', () => {
    const split = targets([sp({ key: 'default/local:http', clusterIPs: ['10.96.0.5', 'fd00::5'], nodePort: 30090, externalTrafficPolicy: 'Local' })]);
    const cases: Array<[PortalTarget[], string, IPFamily, boolean]> = [
      [targets([sp({ key: 'default/web:http' })]), '0.0.0.0', 6, false],
      [targets([sp({ key: 'default/web:http' })]), '0.0.0.0', 4, true],
      [targets([sp({ key: 'default/v6:http', clusterIPs: ['fd00::a'] })]), '0.0.0.0', 6, true],
      [targets([sp({ key: 'default/v6:http', clusterIPs: ['fd00::a'] })]), '0.0.0.0', 4, false],
      // A node-port-only external half: its sibling's families, and IPv4 without a sibling.
      [split.slice(1), '0.0.0.0', 4, true],
      [split, '0.0.0.0', 6, true],
      [targets([sp({ key: 'default/v6:http', clusterIPs: ['fd00::a'] })]), '192.168.1.10', 4, true],
      [[], '192.168.1.10', 4, false],
    ];
    for (const [t, bind, family, want] of cases) expect(familyInUse(family, t, bind), `${t.map((x) => x.unit.id).join()} ${bind} IPv${family}`).toBe(want);
  });
});

describe('incremental render (IncrementalRender)', () => {
  const NONE = { nat: [], filter: [] };
  const hostIPOf = (family: IPFamily): string => (family === 4 ? '192.168.1.10' : '2001:db8::10');

  interface Step {
    targets: PortalTarget[];
    over?: Partial<IptablesRenderInput>;
  }

  /**
   * Renders each step incrementally (one IncrementalRender throughout) and from scratch, and holds
   * them to the same: the same chains in the same order, the same errors, and the same
   * iptables-restore payload from the previous step's rules; applying the payloads one after
   * another gets a model of the node to the full render. Returns the incremental renders and
   * their payloads.
   */
  function replay(family: IPFamily, steps: readonly Step[], label = ''): Array<RenderedRules & { payload: string }> {
    const incremental = new IncrementalRender();
    let before = { incremental: emptyChains(), full: emptyChains() };
    let node = emptyChains();
    return steps.map((step, i) => {
      const input: IptablesRenderInput = { family, targets: step.targets, bindAddress: '0.0.0.0', hostIP: hostIPOf(family), nodePortCIDRs: [], ...step.over };
      const inc = incremental.render(input);
      const full = renderIptablesRules(input);
      const at = `${label} step ${i}`;
      expect(inc.errors, `${at}: errors`).toEqual(full.errors);
      for (const table of ['nat', 'filter'] as const) expect([...inc.chains[table]], `${at}: ${table}`).toEqual([...full.chains[table]]);
      const payload = planSync(inc.chains, before.incremental, NONE);
      expect(payload, `${at}: payload`).toBe(planSync(full.chains, before.full, NONE));
      node = applyPayload(node, payload);
      for (const table of ['nat', 'filter'] as const) expect(new Map([...node[table]].sort()), `${at}: the node after it`).toEqual(new Map([...full.chains[table]].sort()));
      before = { incremental: inc.chains, full: full.chains };
      return { ...inc, payload };
    });
  }

  /** The chains a payload declares (writes or deletes). */
  function declared(payload: string): string[] {
    return payload.split('\n').filter((l) => l.startsWith(':')).map((l) => l.slice(1, l.indexOf(' ')));
  }

  it('removing the last unit of a leaf, then of its parent, and adding them back, plans what a full render plans', () => {
    // 10.96.0.10 and .26 share a nibble (0xa); .10 alone is in leaf 0a, the node port 30080 alone in its blocks.
    const [web, other, dns] = targets([
      sp({ key: 'default/web:http', clusterIPs: ['10.96.0.10'], nodePort: 30080 }),
      sp({ key: 'default/other:http', clusterIPs: ['10.96.0.26'] }),
      sp({ key: 'kube-system/dns:dns', protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.58'], nodePort: 30053 }),
    ]) as [PortalTarget, PortalTarget, PortalTarget];
    const renders = replay(4, [
      { targets: [web, other, dns] },
      { targets: [other, dns] },
      { targets: [dns] },
      { targets: [] },
      { targets: [dns, web] },
      { targets: [dns, web, other] },
    ]);
    expect([...renders[3]!.chains.nat.keys()]).toEqual(['KUBE-PORTALS-CONTAINER', 'KUBE-PORTALS-HOST', 'KUBE-NODEPORT-CONTAINER', 'KUBE-NODEPORT-HOST']);
  });

  it('node ports: a new block of 1,024 and of 64, one emptied, a UDP one (its host rules), and two Services on one node port', () => {
    const np = (key: string, nodePort: number, over: Partial<ServicePort> = {}): ServicePort => sp({ key, clusterIPs: [`10.96.1.${nodePort & 255}`], nodePort, ...over });
    const base = targets([np('a/one:http', 30001), np('a/two:http', 30002), np('a/three:http', 30070)]);
    const far = targets([np('b/far:http', 32767)], 41000);
    const udp = targets([np('b/dns:dns', 30003, { protocol: 'UDP', port: 53 })], 42000);
    const clash = targets([np('c/clash:http', 30001)], 43000);
    replay(4, [
      { targets: base },
      { targets: [...base, ...far] },
      { targets: [...base, ...far, ...udp] },
      { targets: [base[0]!, base[1]!, ...far, ...udp] },
      { targets: [base[0]!, ...udp, ...clash] },
      { targets: [...clash] },
      { targets: [] },
    ]);
  });

  it('a moved proxy port, new portals under the same id, and a unit that lost its proxy port', () => {
    const a = targets([sp({ key: 'default/web:http', nodePort: 30080 }), sp({ key: 'default/dns:dns', protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.53'] })]);
    replay(4, [
      { targets: a },
      { targets: a },
      { targets: [{ ...a[0]!, proxyPort: 41000 }, a[1]!] },
      // The same id, new portals (a new unit object, as the proxier makes on a change).
      { targets: [{ unit: { ...a[0]!.unit, portals: [{ kind: 'clusterIP', ip: '10.96.0.99', port: 80 }] }, proxyPort: 41000 }, a[1]!] },
      // New unit objects of the same shape: nothing to write.
      { targets: targets([sp({ key: 'default/dns:dns', protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.53'] })], 40002) },
      { targets: [{ unit: a[1]!.unit }] },
      { targets: [a[1]!] },
    ]);
  });

  it('another node address or --nodeport-addresses renders every unit anew; errors follow the units', () => {
    const a = targets([sp({ key: 'default/web:http', nodePort: 30080 }), sp({ key: 'default/dns:dns', protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.53'] })]);
    replay(4, [
      { targets: a },
      { targets: a, over: { hostIP: '192.168.1.11' } },
      { targets: a, over: { hostIP: '192.168.1.11', nodePortCIDRs: ['192.168.1.0/24', '10.0.0.0/8'] } },
      { targets: a },
      // Node ports on every address, then on none of this family's: not the same context.
      { targets: a, over: { nodePortCIDRs: ['2001:db8::/64'] } },
      { targets: a },
    ]);
    const v6 = targets([sp({ key: 'default/b6:http', clusterIPs: ['fd00::b'] }), sp({ key: 'default/a6:http', clusterIPs: ['fd00::a'] })]);
    const renders = replay(6, [
      { targets: v6, over: { bindAddress: '192.168.1.10' } },
      { targets: v6.slice(0, 1), over: { bindAddress: '192.168.1.10' } },
      { targets: v6 },
    ]);
    expect(renders[0]!.errors).toHaveLength(2);
    expect(renders[1]!.errors).toEqual(['default/b6:http: cannot program its IPv6 portals: proxy ports listen on --bind-address 192.168.1.10 only']);
  });

  it('two units of one id render as a full render does', () => {
    const [web] = targets([sp({ key: 'default/web:http' })]);
    const again = { unit: { ...web!.unit, portals: [{ kind: 'clusterIP' as const, ip: '10.96.0.77', port: 80 }] }, proxyPort: 40077 };
    replay(4, [{ targets: [web!] }, { targets: [web!, again] }, { targets: [web!] }, { targets: [web!, again] }, { targets: [again] }]);
  });

  it('over random sequences of adds, removals and changes (both families, every kind of portal), plans what a full render plans', () => {
    for (const [seed, family, over] of [
      [1, 4, {}],
      [2, 6, {}],
      [3, 4, { bindAddress: '192.168.1.10', nodePortCIDRs: ['192.168.1.0/24'] }],
      [4, 6, { nodePortCIDRs: ['2001:db8::/64', '192.168.1.0/24'] }],
    ] as Array<[number, IPFamily, Partial<IptablesRenderInput>]>) {
      const payloads = replay(family, randomWalk(seed, 120).map((t) => ({ targets: t, over })), `seed ${seed}`).map((r) => r.payload);
      // The walk went where it should: leaves and their parents emptied and deleted, steps with nothing to write.
      expect(payloads.filter((p) => /^-X KUBE-UP-P[CH]-[0-9a-f]$/m.test(p)).length, `seed ${seed}`).toBeGreaterThan(0);
      expect(payloads.filter((p) => /^-X KUBE-UP-N[CH]-[tu][0-9a-f]{2}$/m.test(p)).length, `seed ${seed}`).toBeGreaterThan(0);
      expect(payloads.filter((p) => p === '').length, `seed ${seed}`).toBeGreaterThan(0);
    }
  });

  it('adding one Service at 1,000 renders its leaves and the parents of new ones: every other chain is the array it was', () => {
    const thousand = Array.from({ length: 1000 }, (_, i) => sp({ key: `ns${i % 10}/svc${i}:http`, clusterIPs: [`10.96.${(i + 1) >> 8}.${(i + 1) & 255}`], nodePort: 30000 + i }));
    const incremental = new IncrementalRender();
    const input = (t: PortalTarget[]): IptablesRenderInput => ({ family: 4, targets: t, bindAddress: '0.0.0.0', hostIP: '192.168.1.10', nodePortCIDRs: [] });
    const before = incremental.render(input(targets(thousand))).chains;
    expect(planSync(incremental.render(input(targets(thousand))).chains, before, NONE)).toBe('');
    const after = incremental.render(input([...targets(thousand), ...targets([sp({ key: 'zz/new:http', clusterIPs: ['10.96.200.77'], nodePort: 32000 })], 45000)])).chains;
    const renderedAgain = (['nat', 'filter'] as const).flatMap((t) => [...after[t]].filter(([chain, rules]) => before[t].get(chain) !== rules).map(([chain]) => chain));
    const payload = planSync(after, before, NONE);
    expect(renderedAgain).toEqual(declared(payload));
    expect(renderedAgain).toEqual(['KUBE-UP-PC-4d', 'KUBE-NODEPORT-CONTAINER', 'KUBE-UP-NC-t1f', 'KUBE-UP-NC-t1f4', 'KUBE-PROXY-PORTS', 'KUBE-UP-PP-t1f', 'KUBE-UP-PP-t2b', 'KUBE-NODEPORT-NON-LOCAL', 'KUBE-UP-NL-t2b']);
  });
});

/**
 * `steps` sets of running units, each a few changes from the one before: Services added, removed,
 * changed (new portals), their units made anew with the same shape, proxy ports moved, lost or
 * regained; listed in a new order each time. Addresses and node ports are drawn from few values,
 * so leaves and their parents fill up and empty out, and node ports clash.
 */
function randomWalk(seed: number, steps: number): PortalTarget[][] {
  const rng = seededRandom(seed);
  const pick = (n: number): number => Math.floor(rng() * n);
  let nextPort = 40000;
  const shape = (k: number): ServicePort => {
    const byte = (): number => pick(48);
    const ipv6 = rng() < 0.3;
    const dual = !ipv6 && rng() < 0.2;
    const v4 = `10.96.${k & 3}.${byte()}`;
    const v6 = `fd00::${byte().toString(16)}`;
    return sp({
      key: `ns${k % 3}/svc${k}:p${k % 2}`,
      protocol: rng() < 0.25 ? 'UDP' : 'TCP',
      port: 53 + pick(3),
      clusterIPs: ipv6 ? [v6] : dual ? [v4, v6] : [v4],
      nodePort: rng() < 0.4 ? 30000 + pick(2200) : 0,
      externalIPs: rng() < 0.15 ? [ipv6 ? `2001:db8:1::${byte().toString(16)}` : `203.0.113.${byte()}`] : [],
      loadBalancerIPs: rng() < 0.1 ? [`198.51.100.${byte()}`] : [],
      externalTrafficPolicy: rng() < 0.2 ? 'Local' : 'Cluster',
    });
  };
  const portsOf = (units: readonly PortalTarget[]): PortalTarget[] => units.map(({ unit }) => (rng() < 0.1 ? { unit } : { unit, proxyPort: nextPort++ }));
  const running = new Map<number, { port: ServicePort; targets: PortalTarget[] }>();
  const add = (k: number, port = shape(k)): void => {
    running.set(k, { port, targets: portsOf(planUnits(port, { clusterEndpoints: [], externalEndpoints: [] }).map((unit) => ({ unit }))) });
  };
  const out: PortalTarget[][] = [];
  for (let step = 0; step < steps; step++) {
    for (let op = step === 0 ? 30 : 1 + pick(4); op > 0; op--) {
      const k = pick(60);
      const r = running.get(k);
      const what = pick(5);
      if (r === undefined) add(k);
      else if (what === 0) running.delete(k);
      else if (what === 1) add(k);
      else if (what === 2) add(k, r.port);
      else if (what === 3) r.targets = r.targets.map((t) => (rng() < 0.5 ? t : rng() < 0.2 ? { unit: t.unit } : { unit: t.unit, proxyPort: nextPort++ }));
      else r.targets = r.targets.map((t) => ({ ...t, unit: { ...t.unit } }));
    }
    const all = [...running.values()].flatMap((r) => r.targets);
    for (let i = all.length - 1; i > 0; i--) {
      const j = pick(i + 1);
      [all[i], all[j]] = [all[j]!, all[i]!];
    }
    out.push(all);
  }
  return out;
}

reportSkip('rules-iptables.test.ts', iptablesSkipReason);

describe.skipIf(iptablesSkipReason !== undefined)(`the goldens are accepted by iptables-restore (real, in a namespace)${iptablesSkipReason ? ` [skipped: ${iptablesSkipReason}]` : ''}`, () => {
  const ns = `kup-${process.pid}-golden`;
  beforeAll(async () => {
    await runCmd('ip', ['netns', 'add', ns]);
  });
  afterAll(async () => {
    await runCmd('ip', ['netns', 'del', ns]).catch(() => {});
  });

  it.each(cases.map((c) => c.name))('%s', async (name) => {
    const c = cases.find((x) => x.name === name)!;
    const payload = readFileSync(join(GOLDEN, `${name}.rules`), 'utf8');
    const restore = c.family === 4 ? 'iptables-restore' : 'ip6tables-restore';
    const save = c.family === 4 ? 'iptables-save' : 'ip6tables-save';
    await nsExec(ns, restore, ['--noflush'], { input: payload });
    // Applied twice: the chain declarations replace the contents, nothing doubles.
    await nsExec(ns, restore, ['--noflush'], { input: payload.replace(/^-I .*\n/gm, '').replace(/^-A (PREROUTING|OUTPUT) .*\n/gm, '') });
    const dumped = parseIptablesSave((await nsExec(ns, save, [])).stdout);
    // iptables-save prints every rule exactly as rendered: so a periodic sync, which compares a
    // dump with the rendered rules, finds nothing to write on a node nobody touched.
    const { chains } = chainsOf(c.family, targets(c.ports), c.over);
    expect(chainsInDump(dumped)).toEqual(chains);
    expect(planJumps(dumped)).toEqual({ nat: [], filter: [] });
    expect(planSync(chains, chainsInDump(dumped), planJumps(dumped))).toBe('');
    const removal = planRemoval(dumped);
    await nsExec(ns, restore, ['--noflush'], { input: removal });
    expect(planRemoval(parseIptablesSave((await nsExec(ns, save, [])).stdout))).toBe('');
  });

  it('every golden file has a case', () => {
    const files = readdirSync(GOLDEN).map((f) => f.replace(/\.rules$/, ''));
    expect(files.sort()).toEqual(cases.map((c) => c.name).sort());
  });
});
