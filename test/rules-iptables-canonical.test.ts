import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { IPFamily } from '../src/core/address.js';
import type { ServicePort } from '../src/core/model.js';
import { emptyChains } from '../src/core/rules/chains.js';
import { parseConntrackList, staleFlows } from '../src/core/rules/conntrack-entries.js';
import { chainsInDump, freshJumps, parseIptablesSave, planRemoval } from '../src/core/rules/iptables-save.js';
import { renderIptablesRules, type IptablesRenderInput, type PortalTarget } from '../src/core/rules/render-iptables.js';
import { planSync } from '../src/core/rules/sync-plan.js';
import { planUnits } from '../src/core/units.js';
import { iptablesSkipReason, nsExec, reportSkip, run } from './helpers/netns.js';
import { servicePort } from './helpers/service-port.js';

/**
 * Addresses and CIDRs that are valid but not written the way iptables-save writes them back
 * (`--nodeport-addresses 192.168.1.5/24`, an upper-case or uncompressed IPv6 externalIP or
 * ClusterIP, an IPv6 --bind-address written long-hand). The rendered rules must still read back
 * identical, or every periodic sync finds the chains different from the dump and rewrites them.
 */
function targets(ports: ServicePort[], first = 40001): PortalTarget[] {
  let next = first;
  return ports.flatMap((p) => planUnits(p, { clusterEndpoints: [], externalEndpoints: [] })).map((unit) => ({ unit, proxyPort: next++ }));
}

const cases: Array<{ name: string; family: IPFamily; ports: ServicePort[]; over?: Partial<IptablesRenderInput> }> = [
  { name: '--nodeport-addresses with host bits set', family: 4, ports: [servicePort('default/web:http', { nodePort: 30080 })], over: { nodePortCIDRs: ['192.168.1.5/24'] } },
  { name: 'IPv6 --nodeport-addresses in capitals, not compressed', family: 6, ports: [servicePort('default/web:http', { clusterIPs: ['fd00::a'], nodePort: 30080 })], over: { nodePortCIDRs: ['FD00:1:0::/64'] } },
  { name: 'IPv6 ClusterIP in capitals', family: 6, ports: [servicePort('default/web:http', { clusterIPs: ['FD00::A'] })] },
  { name: 'IPv6 ClusterIP and externalIP not compressed', family: 6, ports: [servicePort('default/web:http', { clusterIPs: ['fd00:0:0::b'], externalIPs: ['2001:db8:0:0:0:0:0:1'] })] },
  { name: 'IPv4-compatible and -mapped IPv6 externalIPs', family: 6, ports: [servicePort('default/web:http', { clusterIPs: ['fd00::c'], externalIPs: ['::a01:203', '::ffff:a01:204'] })] },
  { name: 'IPv6 --bind-address written long-hand', family: 6, ports: [servicePort('default/web:http', { clusterIPs: ['fd00::c'], protocol: 'UDP', nodePort: 30090 })], over: { bindAddress: 'fd00:0::1' } },
];

function input(c: (typeof cases)[number]): IptablesRenderInput {
  return { family: c.family, targets: targets(c.ports), bindAddress: c.family === 4 ? '0.0.0.0' : '::', hostIP: c.family === 4 ? '192.168.1.10' : '2001:db8::10', nodePortCIDRs: [], ...c.over };
}

describe('rules are rendered with addresses as iptables-save writes them', () => {
  it('no address or CIDR is written other than in its canonical form', () => {
    const text = cases.map((c) => planSync(renderIptablesRules(input(c)).chains, emptyChains(), freshJumps())).join('');
    expect(text).not.toMatch(/FD00|fd00:0:|2001:db8:0:0|192\.168\.1\.5\/24|::a01:203|a01:204/);
    expect(text).toContain('-d 192.168.1.0/24 ');
    expect(text).toContain('-d fd00:1::/64 ');
    expect(text).toContain('-d fd00::a/128 ');
    expect(text).toContain('-d ::10.1.2.3/128 ');
    expect(text).toContain('-d ::ffff:10.1.2.4/128 ');
    expect(text).toContain('--to-destination [fd00::1]:40001');
  });

  it('stale conntrack entries of a portal written long-hand are found (conntrack writes it short)', () => {
    const [t] = targets([servicePort('default/dns:dns', { protocol: 'UDP', port: 53, clusterIPs: ['fd00:0:0::b'] })], 40053);
    const entries = parseConntrackList('udp      17 29 src=fd00::2 dst=fd00::b sport=5555 dport=53 src=fd00::1 dst=fd00::2 sport=40001 dport=5555 mark=0 use=1\n');
    expect(staleFlows(entries, { family: 6, targets: [{ unit: t!.unit, proxyPort: 40053 }], localAddresses: new Set(['fd00::1']), servedTcpPorts: new Set() })).toHaveLength(1);
  });
});

reportSkip('rules-iptables-canonical.test.ts', iptablesSkipReason);

describe.skipIf(iptablesSkipReason !== undefined)('... and read back identical by real iptables (in a namespace)', () => {
  const ns = `kup-${process.pid}-canon`;
  beforeAll(async () => {
    await run('ip', ['netns', 'add', ns]);
  });
  afterAll(async () => {
    await run('ip', ['netns', 'del', ns]).catch(() => {});
  });

  it.each(cases.map((c) => c.name))('%s', async (name) => {
    const c = cases.find((x) => x.name === name)!;
    const { chains } = renderIptablesRules(input(c));
    const restore = c.family === 4 ? 'iptables-restore' : 'ip6tables-restore';
    const save = c.family === 4 ? 'iptables-save' : 'ip6tables-save';
    try {
      await nsExec(ns, restore, ['--noflush'], { input: planSync(chains, emptyChains(), freshJumps()) });
      const dumped = parseIptablesSave((await nsExec(ns, save, [])).stdout);
      // What a periodic sync would write on a node nobody touched: nothing.
      expect(planSync(chains, chainsInDump(dumped), { nat: [], filter: [] })).toBe('');
    } finally {
      const left = planRemoval(parseIptablesSave((await nsExec(ns, save, [])).stdout));
      if (left !== '') await nsExec(ns, restore, ['--noflush'], { input: left });
    }
  });
});
