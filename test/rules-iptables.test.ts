import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { IPFamily } from '../src/core/address.js';
import type { ServicePort } from '../src/core/model.js';
import { freshJumps, parseIptablesSave, planJumps, planRemoval, splitWords } from '../src/core/rules/iptables-save.js';
import { renderIptablesRules, restorePayload, type IptablesRenderInput, type PortalTarget } from '../src/core/rules/render-iptables.js';
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

function render(family: IPFamily, t: PortalTarget[], over: Partial<IptablesRenderInput> = {}): { payload: string; errors: string[] } {
  const rendered = renderIptablesRules({ family, targets: t, bindAddress: '0.0.0.0', hostIP: family === 4 ? '192.168.1.10' : '2001:db8::10', nodePortCIDRs: [], ...over });
  return { payload: restorePayload(rendered, freshJumps()), errors: rendered.errors };
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

  it('renders every rule of a Service with the namespace/name:port comment', () => {
    const { payload } = render(4, targets([sp({ key: 'default/web:http', nodePort: 30080, externalIPs: ['203.0.113.10'], loadBalancerIPs: ['198.51.100.7'] })]));
    const rules = payload.split('\n').filter((l) => l.startsWith('-A KUBE-'));
    expect(rules.length).toBeGreaterThan(0);
    for (const r of rules) expect(r).toContain('--comment "default/web:http');
  });

  it('an IPv4-only Service has no IPv6 rules; a dual-stack one has both', () => {
    const v4only = render(6, targets([sp({ key: 'default/web:http', nodePort: 30080 })])).payload;
    expect(v4only).not.toMatch(/^-A KUBE-/m);
    const dual = render(6, targets([sp({ key: 'default/dual:http', clusterIPs: ['10.96.0.12', 'fd00::c'] })])).payload;
    expect(dual).toContain('-A KUBE-PORTALS-CONTAINER -d fd00::c/128');
    expect(dual).toContain('-j DNAT --to-destination [2001:db8::10]:40001');
  });

  it('a unit without a proxy port yet has no rules', () => {
    const [t] = targets([sp({ key: 'default/web:http' })]);
    const { payload } = render(4, [{ unit: t!.unit }]);
    expect(payload).not.toMatch(/^-A KUBE-/m);
  });

  it('with --bind-address of the other family, the portals are reported, not written', () => {
    const { payload, errors } = render(6, targets([sp({ key: 'default/web6:http', clusterIPs: ['fd00::a'] })]), { bindAddress: '192.168.1.10' });
    expect(payload).not.toMatch(/^-A KUBE-PORTALS/m);
    expect(errors).toEqual(['default/web6:http: cannot program its IPv6 portals: proxy ports listen on --bind-address 192.168.1.10 only']);
  });

  it('1,000 Services render as one payload, quickly', () => {
    const ports = Array.from({ length: 1000 }, (_, i) => sp({ key: `ns${i % 10}/svc${i}:http`, clusterIPs: [`10.96.${i >> 8}.${i & 255}`], nodePort: 30000 + i }));
    const t = targets(ports);
    const started = performance.now();
    const { payload } = render(4, t);
    const ms = performance.now() - started;
    expect(payload.split('\n').filter((l) => l.startsWith('-A KUBE-')).length).toBe(1000 * 7);
    expect(ms).toBeLessThan(1000);
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

  it('splits words the way iptables-restore does', () => {
    expect(splitWords('-m comment --comment "a \\"b\\" c" -j X')).toEqual(['-m', 'comment', '--comment', 'a "b" c', '-j', 'X']);
  });

  it('finds our chains and jumps among other rules', () => {
    const saved = parseIptablesSave(ours);
    expect([...saved.keys()]).toEqual(['nat', 'filter']);
    expect(saved.get('nat')!.chains.has('KUBE-PORTALS-HOST')).toBe(true);
    expect(saved.get('nat')!.rules.filter((r) => r.target === 'KUBE-PORTALS-HOST')).toHaveLength(2);
  });

  it('plans the missing jumps, removes doubled ones, and leaves the rest alone', () => {
    const plan = planJumps(parseIptablesSave(ours));
    expect(plan.nat).toEqual([
      '-D OUTPUT -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-HOST',
      '-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment "kube-userspace-proxy node ports; keep last" -j KUBE-NODEPORT-HOST',
    ]);
    expect(plan.filter).toEqual(['-I INPUT 1 -m comment --comment "kube-userspace-proxy proxy ports answer portal traffic only" -j KUBE-PROXY-PORTS']);
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
    const dumped = (await nsExec(ns, save, [])).stdout;
    const want = payload.split('\n').filter((l) => l.startsWith('-A KUBE-')).length;
    expect(dumped.split('\n').filter((l) => l.startsWith('-A KUBE-')).length).toBe(want);
    expect(planJumps(parseIptablesSave(dumped))).toEqual({ nat: [], filter: [] });
    const removal = planRemoval(parseIptablesSave(dumped));
    await nsExec(ns, restore, ['--noflush'], { input: removal });
    expect(planRemoval(parseIptablesSave((await nsExec(ns, save, [])).stdout))).toBe('');
  });

  it('every golden file has a case', () => {
    const files = readdirSync(GOLDEN).map((f) => f.replace(/\.rules$/, ''));
    expect(files.sort()).toEqual(cases.map((c) => c.name).sort());
  });
});
