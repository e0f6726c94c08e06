import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { IPFamily } from '../src/core/address.js';
import type { NodeAddress } from '../src/core/rules/node-address.js';
import { chainsInDump, parseIptablesSave, planJumps, planRemoval } from '../src/core/rules/iptables-save.js';
import { renderIptablesRules } from '../src/core/rules/render-iptables.js';
import type { ProxyUnit } from '../src/core/units.js';
import { UsageError } from '../src/core/errors.js';
import { CommandError, type CommandResult, type CommandRunner } from '../src/io/portal/command-runner.js';
import { IptablesPortal } from '../src/io/portal/iptables-portal.js';
import type { NodeAddressSource } from '../src/io/portal/node-addresses.js';
import type { RunningUnitView } from '../src/seams/portal.js';
import { silentLogger } from '../src/log.js';
import { iptablesSkipReason, nsExec, nsRunner, reportSkip, run } from './helpers/netns.js';
import { captureLogger } from './helpers/proxy-fixtures.js';
import { servicePort, unitsOf } from './helpers/service-port.js';

const sp = servicePort;

function views(units: ProxyUnit[], first = 40001): RunningUnitView[] {
  return units.map((unit, i) => ({ unit, proxyPort: first + i }));
}

const nodeAddresses: NodeAddressSource = {
  addresses: (): NodeAddress[] => [
    { ip: '127.0.0.1', family: 4, iface: 'lo', internal: true },
    { ip: '10.0.0.5', family: 4, iface: 'eth1', internal: false },
    { ip: '192.168.1.10', family: 4, iface: 'eth0', internal: false },
    { ip: '2001:db8::10', family: 6, iface: 'eth0', internal: false },
  ],
  defaultRouteInterface: () => 'eth0',
  ipv6Enabled: () => true,
};

interface Call {
  command: string;
  args: readonly string[];
  input?: string;
}

/** A fake node: iptables-save answers `dumps[family]`, restores are recorded; failures on demand. */
class FakeNode implements CommandRunner {
  calls: Call[] = [];
  dumps: Record<IPFamily, string> = { 4: '', 6: '' };
  missing = new Set<string>();
  failNext = new Map<string, string>();
  linkExists = false;
  /** `conntrack -L` output per `<family> <protocol>` (`ipv4 udp`, ...). */
  conntrackLists: Record<string, string> = {};
  /** conntrack -D answers as versions that exit 1 when nothing matched. */
  conntrackDeleteNothing = false;

  async run(command: string, args: readonly string[], input?: string): Promise<CommandResult> {
    this.calls.push(input === undefined ? { command, args } : { command, args, input });
    if (this.missing.has(command)) throw new CommandError(command, args, { exitCode: null, stderr: '', cause: Object.assign(new Error('spawn ENOENT'), { code: 'ENOENT' }) });
    const failure = this.failNext.get(command);
    if (failure !== undefined) {
      this.failNext.delete(command);
      throw new CommandError(command, args, { exitCode: 1, stderr: failure });
    }
    if (command === 'iptables-save') return { stdout: this.dumps[4], stderr: '' };
    if (command === 'ip6tables-save') return { stdout: this.dumps[6], stderr: '' };
    if (command === 'ip' && args.join(' ') === '-j link show') return { stdout: JSON.stringify(this.linkExists ? [{ ifname: 'kube-userspace0' }] : [{ ifname: 'lo' }]), stderr: '' };
    if (command === 'ip' && args[0] === 'link' && args[1] === 'del') this.linkExists = false;
    if (command === 'conntrack') return this.conntrack(args);
    return { stdout: '', stderr: '' };
  }

  private conntrack(args: readonly string[]): CommandResult {
    const opt = (name: string): string => args[args.indexOf(name) + 1] ?? '';
    if (args[0] === '-L') return { stdout: this.conntrackLists[`${opt('-f')} ${opt('-p')}`] ?? '', stderr: 'conntrack v1.4.7 (conntrack-tools): 0 flow entries have been shown.\n' };
    if (this.conntrackDeleteNothing) throw new CommandError('conntrack', args, { exitCode: 1, stderr: 'conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n' });
    return { stdout: '', stderr: 'conntrack v1.4.7 (conntrack-tools): 2 flow entries have been deleted.\n' };
  }

  conntrackCalls(): string[] {
    return this.calls.filter((c) => c.command === 'conntrack').map((c) => c.args.join(' '));
  }

  runSync(): CommandResult {
    throw new Error('the iptables portal never blocks');
  }

  restores(): Call[] {
    return this.calls.filter((c) => c.command.endsWith('-restore'));
  }

  saves(): Call[] {
    return this.calls.filter((c) => c.command.endsWith('-save'));
  }
}

function portal(node: FakeNode, over: Partial<ConstructorParameters<typeof IptablesPortal>[0]> = {}): IptablesPortal {
  return new IptablesPortal({ runner: node, logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [], ...over });
}

const LEFTOVER = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-PORTALS-CONTAINER - [0:0]
-A PREROUTING -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-CONTAINER
-A PREROUTING -j SOMEONE-ELSE
-A KUBE-PORTALS-CONTAINER -d 10.96.0.99/32 -p tcp -m comment --comment "default/old:http" -m tcp --dport 80 -j REDIRECT --to-ports 39999
COMMIT
`;

describe('IptablesPortal (fake node)', () => {
  it('start-up keeps its own chains for the first sync to replace whole, and removes the bind mode\'s interface', async () => {
    const node = new FakeNode();
    node.dumps[4] = LEFTOVER;
    node.linkExists = true;
    const p = portal(node);
    await p.start();
    // No gap on restart: the old rules stay in force until the first sync's transaction.
    expect(node.restores()).toEqual([]);
    expect(node.calls.some((c) => c.command === 'ip' && c.args.join(' ') === 'link del kube-userspace0')).toBe(true);
    await p.sync([], false);
    const [first] = node.restores();
    expect(first?.command).toBe('iptables-restore');
    // Declaring the chain empties it: the old Service's rule is gone, someone else's jump untouched.
    expect(first?.input).toContain(':KUBE-PORTALS-CONTAINER - [0:0]');
    expect(first?.input).not.toContain('default/old:http');
    expect(first?.input).not.toContain('SOMEONE-ELSE');
  });

  it('--cleanup removes the leftovers of an earlier run, and only those', async () => {
    const node = new FakeNode();
    node.dumps[4] = LEFTOVER;
    node.linkExists = true;
    await portal(node).cleanup();
    const [removal] = node.restores();
    expect(removal?.command).toBe('iptables-restore');
    expect(removal?.input).toBe(planRemoval(parseIptablesSave(LEFTOVER)));
    expect(removal?.input).not.toContain('SOMEONE-ELSE');
    expect(node.calls.some((c) => c.command === 'ip' && c.args.join(' ') === 'link del kube-userspace0')).toBe(true);
  });

  it('start-up fails with one clear line when iptables is not installed', async () => {
    const node = new FakeNode();
    node.missing.add('iptables-save');
    await expect(portal(node).start()).rejects.toThrow(UsageError);
    await expect(portal(node).start()).rejects.toThrow(/iptables-save is not installed/);
  });

  it('asks for a proxy port per unit, and holds node ports open', () => {
    const p = portal(new FakeNode());
    const [v4] = unitsOf(sp('default/web:http', { nodePort: 30080 }));
    expect(p.listenSpecs(v4!).map((s) => [s.host, s.port, s.proxyPort ?? false])).toEqual([
      ['0.0.0.0', 0, true],
      ['0.0.0.0', 30080, false],
    ]);
    const [dual] = unitsOf(sp('default/dual:http', { clusterIPs: ['10.96.0.12', 'fd00::c'], nodePort: 30082 }));
    expect(p.listenSpecs(dual!).map((s) => [s.host, s.port, s.proxyPort ?? false])).toEqual([
      ['0.0.0.0', 0, true],
      ['::', 0, true],
      ['0.0.0.0', 30082, false],
      ['::', 30082, false],
    ]);
  });

  it('a node-port-only external half takes its families from the cluster half', () => {
    const p = portal(new FakeNode());
    const [cluster, external] = unitsOf(sp('default/v6:http', { clusterIPs: ['fd00::a'], nodePort: 30090, externalTrafficPolicy: 'Local' }));
    expect(external!.portals.map((x) => x.kind)).toEqual(['nodePort']);
    p.listenSpecs(cluster!);
    expect(p.listenSpecs(external!).map((s) => [s.host, s.proxyPort ?? false])).toEqual([
      ['::', true],
      ['::', false],
    ]);
  });

  it('with --bind-address, proxy ports listen there', () => {
    const p = portal(new FakeNode(), { bindAddress: '192.168.1.10' });
    const [u] = unitsOf(sp('default/web:http'));
    expect(p.listenSpecs(u!)[0]).toMatchObject({ host: '192.168.1.10', proxyPort: true });
  });

  it('writes everything at the first sync, nothing when nothing changed, and only the chains a change touches', async () => {
    const node = new FakeNode();
    const p = portal(node);
    const v = views(unitsOf(sp('default/web:http', { nodePort: 30080 })));
    expect(await p.sync(v, false)).toEqual({ errors: [], skipped: [] });
    // Not started: what the node holds is unknown, so the first sync reads a dump first.
    expect(node.saves().map((c) => c.command)).toEqual(['iptables-save']);
    expect(node.restores().map((c) => c.command)).toEqual(['iptables-restore']);
    expect(node.restores()[0]?.args).toEqual(['-w', '5', '--noflush']);
    const first = node.restores()[0]?.input ?? '';
    expect(first).toContain('-I PREROUTING 1 ');
    expect(first).toContain('-A KUBE-UP-PC-0a -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 40001');

    node.calls = [];
    await p.sync(v, false);
    expect(node.calls.filter((c) => c.command.startsWith('iptables'))).toEqual([]);

    // Another Service: its own leaves and the parents that gain a jump to them; web's leaves stay.
    node.calls = [];
    const [other] = unitsOf(sp('default/other:http', { clusterIPs: ['10.96.0.26'] }));
    await p.sync([...v, { unit: other!, proxyPort: 40002 }], false);
    expect(node.saves()).toHaveLength(0);
    const added = node.restores()[0]?.input ?? '';
    expect(added.split('\n').filter((l) => l.startsWith(':'))).toEqual([':KUBE-UP-PC-a - [0:0]', ':KUBE-UP-PC-1a - [0:0]', ':KUBE-UP-PP-t27 - [0:0]']);
    expect(added).not.toMatch(/^-[IA] (PREROUTING|OUTPUT|INPUT) /m);

    // Flushed by someone: the periodic sync reads a dump and writes chains and jumps again.
    node.calls = [];
    node.dumps[4] = '';
    await p.sync(v, true);
    expect(node.saves()).toHaveLength(1);
    expect(node.restores()[0]?.input).toContain('-I PREROUTING 1 ');
  });

  it('after start-up, the first sync writes what differs from the dump and fixes the jumps it showed, without another dump', async () => {
    const node = new FakeNode();
    const p = portal(node);
    await p.start();
    node.calls = [];
    await p.sync(views(unitsOf(sp('default/web:http'))), false);
    expect(node.saves()).toHaveLength(0);
    expect(node.restores()[0]?.input).toContain('-I PREROUTING 1 ');
  });

  it('touches ip6tables only for IPv6 or dual-stack units, and keeps emptying it once used', async () => {
    const node = new FakeNode();
    const p = portal(node);
    await p.sync(views(unitsOf(sp('default/web:http'))), false);
    expect(node.calls.some((c) => c.command.startsWith('ip6tables'))).toBe(false);
    await p.sync(views(unitsOf(sp('default/dual:dns', { protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.12', 'fd00::c'] }))), false);
    const v6 = node.restores().filter((c) => c.command === 'ip6tables-restore');
    expect(v6).toHaveLength(1);
    expect(v6[0]?.input).toContain('-A KUBE-UP-PH-0c -d fd00::c/128 -p udp -m comment --comment "default/dual:dns" -m udp --dport 53 -j DNAT --to-destination [2001:db8::10]:40001');
    node.calls = [];
    await p.sync(views(unitsOf(sp('default/web:http'))), false);
    const emptied = node.restores().find((c) => c.command === 'ip6tables-restore');
    expect(emptied?.input).not.toMatch(/ -j (REDIRECT|DNAT|REJECT|ACCEPT)\b/);
    expect(emptied?.input).toContain('-X KUBE-UP-PH-0c');
  });

  it('start-up reads the proxy port each unit had from the rules left behind; later the port each runs on; units gone are forgotten', async () => {
    const node = new FakeNode();
    node.dumps[4] = LEFTOVER;
    const p = portal(node);
    const [old, web] = unitsOf(sp('default/old:http', { clusterIPs: ['10.96.0.99'] }), sp('default/web:http'));
    await p.start();
    expect(p.preferredProxyPort(old!)).toBe(39999);
    expect(p.preferredProxyPort(web!)).toBeUndefined();
    await p.sync([{ unit: web!, proxyPort: 40005 }, { unit: old! }], false);
    // A unit whose proxy port did not bind keeps wanting the old one.
    expect(p.preferredProxyPort(old!)).toBe(39999);
    expect(p.preferredProxyPort(web!)).toBe(40005);
    await p.sync([{ unit: web!, proxyPort: 40005 }], false);
    expect(p.preferredProxyPort(old!)).toBeUndefined();
  });

  it('deletes stale conntrack entries after the rules are in: UDP units when new or changed, TCP units at the first sync only', async () => {
    const node = new FakeNode();
    const p = portal(node);
    const [dns, web] = unitsOf(sp('default/dns:dns', { protocol: 'UDP', port: 53 }), sp('default/web:http'));
    node.conntrackLists['ipv4 udp'] = 'udp 17 100 src=10.0.0.7 dst=10.96.0.10 sport=5000 dport=53 src=192.168.1.10 dst=10.0.0.7 sport=39000 dport=5000 [ASSURED] mark=0 use=1\n';
    node.conntrackLists['ipv4 tcp'] = 'tcp 6 100 TIME_WAIT src=10.0.0.7 dst=10.96.0.10 sport=5001 dport=80 src=192.168.1.10 dst=10.0.0.7 sport=39001 dport=5001 [ASSURED] mark=0 use=1\n';
    await p.sync([{ unit: dns!, proxyPort: 40001 }, { unit: web!, proxyPort: 40002 }], false);
    const restoreAt = node.calls.findIndex((c) => c.command === 'iptables-restore');
    const firstConntrack = node.calls.findIndex((c) => c.command === 'conntrack');
    expect(firstConntrack).toBeGreaterThan(restoreAt);
    expect(node.conntrackCalls()).toEqual([
      '-L -f ipv4 -p udp',
      '-D -f ipv4 -p udp --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 192.168.1.10 --reply-port-src 39000',
      '-L -f ipv4 -p tcp',
      '-D -f ipv4 -p tcp --orig-dst 10.96.0.10 --orig-port-dst 80 --reply-src 192.168.1.10 --reply-port-src 39001',
    ]);

    node.calls = [];
    await p.sync([{ unit: dns!, proxyPort: 40001 }, { unit: web!, proxyPort: 40002 }], true);
    expect(node.conntrackCalls()).toEqual([]);

    // Both recreated on other ports: only the UDP unit is looked at again.
    node.calls = [];
    await p.sync([{ unit: dns!, proxyPort: 40003 }, { unit: web!, proxyPort: 40004 }], false);
    expect(node.conntrackCalls()).toEqual(['-L -f ipv4 -p udp', '-D -f ipv4 -p udp --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 192.168.1.10 --reply-port-src 39000']);
  });

  it('no deletion before the rules are in force: a failed transaction leaves conntrack alone', async () => {
    const node = new FakeNode();
    const p = portal(node);
    node.failNext.set('iptables-restore', 'iptables-restore: line 3 failed');
    await p.sync(views(unitsOf(sp('default/dns:dns', { protocol: 'UDP', port: 53 }))), false);
    expect(node.conntrackCalls()).toEqual([]);
    await p.sync(views(unitsOf(sp('default/dns:dns', { protocol: 'UDP', port: 53 }))), false);
    expect(node.conntrackCalls()).toEqual(['-L -f ipv4 -p udp']);
  });

  it('without conntrack it says so once and carries on; "0 flow entries deleted" is no failure', async () => {
    const { logger, records } = captureLogger('info');
    const node = new FakeNode();
    node.missing.add('conntrack');
    const p = portal(node, { logger });
    expect(await p.sync(views(unitsOf(sp('default/dns:dns', { protocol: 'UDP', port: 53 }))), false)).toEqual({ errors: [], skipped: [] });
    await p.sync(views(unitsOf(sp('default/dns:dns', { protocol: 'UDP', port: 53 })), 40009), false);
    expect(node.conntrackCalls()).toHaveLength(1);
    expect(records.filter((r) => r.level === 40).map((r) => r.msg)).toEqual([expect.stringContaining('conntrack is not installed')]);

    const other = new FakeNode();
    const { logger: logger2, records: records2 } = captureLogger('info');
    other.conntrackLists['ipv4 udp'] = 'udp 17 100 src=10.0.0.7 dst=10.96.0.10 sport=5000 dport=53 src=10.96.0.10 dst=10.0.0.7 sport=53 dport=5000 mark=0 use=1\n';
    other.conntrackDeleteNothing = true;
    await portal(other, { logger: logger2 }).sync(views(unitsOf(sp('default/dns:dns', { protocol: 'UDP', port: 53 }))), false);
    expect(records2.filter((r) => r.level >= 40)).toEqual([]);
    expect(records2).toContainEqual(expect.objectContaining({ msg: 'deleted stale conntrack entries', deleted: 0, staleTarget: '10.96.0.10:53' }));
  });

  it('1,000 Services are one iptables-restore per sync', async () => {
    const node = new FakeNode();
    const p = portal(node);
    const ports = Array.from({ length: 1000 }, (_, i) => sp(`ns/svc${i}:http`, { clusterIPs: [`10.96.${i >> 8}.${i & 255}`], nodePort: 30000 + i }));
    await p.sync(views(unitsOf(...ports)), false);
    expect(node.restores()).toHaveLength(1);
    expect((node.restores()[0]?.input ?? '').split('\n').filter((l) => / -j (REDIRECT|DNAT) /.test(l))).toHaveLength(2000);
  });

  it('a failed transaction is reported, and the next sync starts from a fresh dump', async () => {
    const node = new FakeNode();
    const p = portal(node);
    const v = views(unitsOf(sp('default/web:http')));
    await p.sync(v, false);
    node.calls = [];
    node.failNext.set('iptables-restore', 'iptables-restore: line 7 failed\n');
    const moved = views(unitsOf(sp('default/web:http')), 40002);
    const failed = await p.sync(moved, false);
    expect(failed.errors).toEqual([expect.stringMatching(/^IPv4 portal rules not installed .*line 7 failed/)]);
    node.calls = [];
    expect(await p.sync(moved, false)).toEqual({ errors: [], skipped: [] });
    expect(node.saves()).toHaveLength(1);
    expect(node.restores()).toHaveLength(1);
  });

  it('a unit it cannot program by its configuration (IPv6 with an IPv4 --bind-address) is skipped, not an error: the sync did its work', async () => {
    const node = new FakeNode();
    const p = portal(node, { bindAddress: '192.168.1.10' });
    const v = views(unitsOf(sp('default/v4:http'), sp('default/dual:http', { clusterIPs: ['10.96.0.11', 'fd00::11'] })));
    const skipped = ['default/dual:http: cannot program its IPv6 portals: proxy ports listen on --bind-address 192.168.1.10 only'];
    expect(await p.sync(v, false)).toEqual({ errors: [], skipped });
    expect(await p.sync(v, true)).toEqual({ errors: [], skipped });
    expect(node.restores().some((r) => r.input?.includes('-d 10.96.0.11/32') === true)).toBe(true);
  });

  it('an add whose transaction failed is written by the next sync, from a dump, though nothing changed since; then syncs are incremental again', async () => {
    const node = new FakeNode();
    const p = portal(node);
    const [web, other, third] = unitsOf(sp('default/web:http'), sp('default/other:http', { clusterIPs: ['10.96.0.26'] }), sp('default/third:http', { clusterIPs: ['10.96.0.42'] }));
    const v = [{ unit: web!, proxyPort: 40001 }];
    await p.sync(v, false);
    node.failNext.set('iptables-restore', 'iptables-restore: line 3 failed\n');
    const added = [...v, { unit: other!, proxyPort: 40002 }];
    expect((await p.sync(added, false)).errors).toEqual([expect.stringMatching(/^IPv4 portal rules not installed/)]);

    // The same units: the render has nothing new, but the node did not take the last one. The
    // dump (empty here) is compared with every chain, and all of it is written again.
    node.calls = [];
    expect(await p.sync(added, false)).toEqual({ errors: [], skipped: [] });
    expect(node.saves()).toHaveLength(1);
    const full = node.restores()[0]?.input ?? '';
    expect(full).toContain('--comment "default/web:http"');
    expect(full).toContain('--comment "default/other:http"');
    expect(full).toContain('-I PREROUTING 1 ');

    // Known again: the next add writes its own leaves (and the jump to its new one), without a dump.
    node.calls = [];
    await p.sync([...added, { unit: third!, proxyPort: 40003 }], false);
    expect(node.saves()).toHaveLength(0);
    expect((node.restores()[0]?.input ?? '').split('\n').filter((l) => l.startsWith(':'))).toEqual([':KUBE-UP-PC-a - [0:0]', ':KUBE-UP-PC-2a - [0:0]', ':KUBE-UP-PP-t27 - [0:0]']);
  });

  it('cleanup removes what the dumps show, reports every failure together, and is fine twice', async () => {
    const node = new FakeNode();
    node.dumps[4] = LEFTOVER;
    node.dumps[6] = LEFTOVER.replace('10.96.0.99/32', 'fd00::99/128');
    node.linkExists = true;
    node.failNext.set('iptables-restore', 'iptables-restore: line 2 failed\n');
    node.failNext.set('ip6tables-restore', 'ip6tables-restore: line 2 failed\n');
    const p = portal(node);
    const err = await p.cleanup().then(() => undefined, (e: unknown) => e as Error);
    expect(err?.message).toMatch(/cleanup left 2 thing\(s\) in place:\n {2}iptables-restore .*line 2 failed\n {2}ip6tables-restore .*line 2 failed/);
    // The interface was removed although both iptables steps failed.
    expect(node.linkExists).toBe(false);
    node.dumps[4] = '';
    node.dumps[6] = '';
    await expect(p.cleanup()).resolves.toBeUndefined();
    await expect(p.cleanup()).resolves.toBeUndefined();
  });

  it('cleanup on a node without iptables has nothing to remove', async () => {
    const node = new FakeNode();
    node.missing.add('iptables-save').add('ip6tables-save');
    await expect(portal(node).cleanup()).resolves.toBeUndefined();
  });
});

reportSkip('portal-iptables.test.ts', iptablesSkipReason);

/**
 * The real commands, in a namespace of our own (the portal's runner prefixes `ip netns exec`).
 * This is where the figure for "1,000 Services in one transaction" comes from.
 */
describe.skipIf(iptablesSkipReason !== undefined)(`IptablesPortal against real iptables in a namespace${iptablesSkipReason ? ` [skipped: ${iptablesSkipReason}]` : ''}`, () => {
  const ns = `kup-${process.pid}-ipt`;
  const timings: string[] = [];
  const FOREIGN_NAT = '-A POSTROUTING -s 10.244.0.0/16 -m comment --comment "someone else" -j MASQUERADE';
  const FOREIGN_FILTER = '-A INPUT -i lo -m comment --comment "someone else" -j ACCEPT';

  beforeAll(async () => {
    await run('ip', ['netns', 'add', ns]);
    await nsExec(ns, 'iptables-restore', ['--noflush'], { input: `*nat\n${FOREIGN_NAT}\nCOMMIT\n*filter\n${FOREIGN_FILTER}\nCOMMIT\n` });
  });
  afterAll(async () => {
    await run('ip', ['netns', 'del', ns]).catch(() => {});
    if (timings.length > 0) process.stderr.write(`portal-iptables.test.ts timings:\n  ${timings.join('\n  ')}\n`);
  });

  async function dump(): Promise<string> {
    return (await nsExec(ns, 'iptables-save', [])).stdout;
  }

  function timedRunner(): { runner: CommandRunner; restoreMs: number[] } {
    const inner = nsRunner(ns);
    const restoreMs: number[] = [];
    return {
      restoreMs,
      runner: {
        run: async (cmd, args, input) => {
          const started = performance.now();
          const r = await inner.run(cmd, args, input);
          if (cmd.endsWith('-restore')) restoreMs.push(performance.now() - started);
          return r;
        },
        runSync: inner.runSync,
      },
    };
  }

  it('syncs 1,000 Services in one transaction, replaces our chains whole, and leaves other rules alone', async () => {
    const { runner, restoreMs } = timedRunner();
    const p = new IptablesPortal({ runner, logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [] });
    await p.start();
    const ports = Array.from({ length: 1000 }, (_, i) => sp(`ns${i % 10}/svc${i}:http`, { clusterIPs: [`10.96.${i >> 8}.${i & 255}`], nodePort: 30000 + i }));
    const all = views(unitsOf(...ports));

    const natRules = (text: string): string[] => text.split('\n').filter((l) => / -j (REDIRECT|DNAT) /.test(l));
    let started = performance.now();
    expect(await p.sync(all, false)).toEqual({ errors: [], skipped: [] });
    const firstSync = performance.now() - started;
    let saved = await dump();
    expect(natRules(saved)).toHaveLength(2000);
    expect(planJumps(parseIptablesSave(saved))).toEqual({ nat: [], filter: [] });
    timings.push(`first sync of 1,000 Services (2,000 NAT rules, the trees above them, the filter rules, 6 jumps): ${firstSync.toFixed(0)} ms in all, iptables-restore ${restoreMs[restoreMs.length - 1]?.toFixed(0)} ms`);

    // One Service gone: its rules disappear, and only the chains that held them are written.
    await nsExec(ns, 'iptables', ['-t', 'nat', '-A', 'KUBE-PORTALS-HOST', '-d', '10.99.0.1/32', '-j', 'RETURN']);
    const rest = all.filter((v) => v.unit.service !== 'ns5/svc5');
    started = performance.now();
    expect(await p.sync(rest, false)).toEqual({ errors: [], skipped: [] });
    timings.push(`resync of 999 Services: ${(performance.now() - started).toFixed(0)} ms in all, iptables-restore ${restoreMs[restoreMs.length - 1]?.toFixed(0)} ms`);
    saved = await dump();
    expect(saved).not.toContain('"ns5/svc5:http"');
    expect(natRules(saved)).toHaveLength(1998);
    expect(saved).toContain(FOREIGN_NAT);
    expect(saved).toContain(FOREIGN_FILTER);
    // A stray rule in a chain of ours that no change touched stays until the periodic sync,
    // which reads the chains back and writes again each one that differs.
    expect(saved).toContain('10.99.0.1/32');
    expect(await p.sync(rest, true)).toEqual({ errors: [], skipped: [] });
    expect(await dump()).not.toContain('10.99.0.1/32');

    // Flushed by someone: the periodic sync puts chains and jumps back.
    await nsExec(ns, 'iptables', ['-t', 'nat', '-F']);
    await nsExec(ns, 'iptables-restore', ['--noflush'], { input: `*nat\n${FOREIGN_NAT}\nCOMMIT\n` }); // its owner puts it back
    expect(await p.sync(rest, true)).toEqual({ errors: [], skipped: [] });
    saved = await dump();
    expect(planJumps(parseIptablesSave(saved))).toEqual({ nat: [], filter: [] });
    expect(natRules(saved)).toHaveLength(1998);

    started = performance.now();
    await p.cleanup();
    timings.push(`cleanup of 1,000 Services: ${(performance.now() - started).toFixed(0)} ms`);
    saved = await dump();
    expect(planRemoval(parseIptablesSave(saved))).toBe('');
    expect(saved).toContain(FOREIGN_NAT);
    expect(saved).toContain(FOREIGN_FILTER);
    await p.cleanup();
  });

  it('after each of a sequence of incremental syncs (node ports, the last Service of a leaf and of its parent), the node holds what a full render says', async () => {
    const p = new IptablesPortal({ runner: nsRunner(ns), logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [] });
    await p.start();
    const svc = (byte: number, over: Parameters<typeof sp>[1] = {}): Parameters<typeof unitsOf>[0] => sp(`seq/svc${byte}:http`, { clusterIPs: [`10.97.0.${byte}`], ...over });
    const pool = views(unitsOf(svc(10, { nodePort: 31000 }), svc(26), svc(11, { protocol: 'UDP', port: 53, nodePort: 32767 }), svc(42, { externalIPs: ['203.0.113.42'] })), 41000);
    const steps = [[0, 1, 2, 3], [0, 1, 2], [1, 2], [1], [1, 3, 0], [2], []].map((picked) => picked.map((i) => pool[i]!));
    for (const [i, step] of steps.entries()) {
      expect(await p.sync(step, false)).toEqual({ errors: [], skipped: [] });
      const want = renderIptablesRules({ family: 4, targets: step, bindAddress: '0.0.0.0', hostIP: '192.168.1.10', nodePortCIDRs: [] }).chains;
      expect(chainsInDump(parseIptablesSave(await dump())), `step ${i}`).toEqual(want);
    }
    await p.cleanup();
  });

  it('an earlier version\'s flat layout is replaced by the first sync: its rules, its jumps, and nothing else', async () => {
    const flat = [
      '*nat',
      ':KUBE-PORTALS-CONTAINER - [0:0]',
      ':KUBE-NODEPORT-CONTAINER - [0:0]',
      '-I PREROUTING 1 -m comment --comment "kube-userspace-proxy service portals; before node ports" -j KUBE-PORTALS-CONTAINER',
      '-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment "kube-userspace-proxy node ports; keep last" -j KUBE-NODEPORT-CONTAINER',
      '-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 40001',
      '-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j REDIRECT --to-ports 40001',
      'COMMIT',
      '*filter',
      ':KUBE-PROXY-PORTS - [0:0]',
      '-I INPUT 1 -m comment --comment "kube-userspace-proxy proxy ports answer portal traffic only" -j KUBE-PROXY-PORTS',
      '-A KUBE-PROXY-PORTS -p tcp -m comment --comment "default/web:http" -m tcp --dport 40001 -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j REJECT --reject-with tcp-reset',
      'COMMIT',
      '',
    ].join('\n');
    await nsExec(ns, 'iptables-restore', ['--noflush'], { input: flat });
    const p = new IptablesPortal({ runner: nsRunner(ns), logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [] });
    await p.start();
    const [web] = unitsOf(sp('default/web:http', { nodePort: 30080 }));
    expect(p.preferredProxyPort(web!)).toBe(40001);
    expect(await p.sync([{ unit: web!, proxyPort: 40001 }], false)).toEqual({ errors: [], skipped: [] });
    const saved = parseIptablesSave(await dump());
    expect(planJumps(saved)).toEqual({ nat: [], filter: [] });
    const rules = (await dump()).split('\n');
    expect(rules.filter((l) => l.startsWith('-A KUBE-PORTALS-CONTAINER '))).toEqual(['-A KUBE-PORTALS-CONTAINER -d 0.0.0.10/0.0.0.15 -j KUBE-UP-PC-a']);
    expect(rules.filter((l) => l.startsWith('-A INPUT ') && l.includes('kube-userspace-proxy'))).toHaveLength(2);
    expect(rules.filter((l) => / -j REDIRECT /.test(l))).toHaveLength(2);
    expect(rules).toContain(FOREIGN_FILTER);
    // And nothing left to do: a periodic sync reads the node back and writes nothing.
    const { runner, restoreMs } = timedRunner();
    const again = new IptablesPortal({ runner, logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [] });
    await again.start();
    await again.sync([{ unit: web!, proxyPort: 40001 }], true);
    expect(restoreMs).toEqual([]);
    await again.cleanup();
  });

  it('packets of other connections on the node do not enter our filter chains: only a connection\'s first one can', async () => {
    const p = new IptablesPortal({ runner: nsRunner(ns), logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [] });
    await p.start();
    const ports = Array.from({ length: 100 }, (_, i) => sp(`ns/svc${i}:http`, { clusterIPs: [`10.96.1.${i + 1}`], nodePort: 30000 + i }));
    expect(await p.sync(views(unitsOf(...ports)), false)).toEqual({ errors: [], skipped: [] });
    await nsExec(ns, 'ip', ['link', 'set', 'lo', 'up']);
    await nsExec(ns, 'iptables', ['-Z', 'INPUT']);
    // One connection on loopback, 200 round trips: about 600 packets through INPUT.
    const script = `
      const net = require('node:net');
      const server = net.createServer((s) => s.on('data', (d) => s.write(d))).listen(0, '127.0.0.1', () => {
        const c = net.connect(server.address().port, '127.0.0.1', () => {
          let n = 0;
          c.on('data', () => (++n < 200 ? c.write('x') : (c.destroy(), server.close())));
          c.write('x');
        });
      });
      setTimeout(() => process.exit(1), 10000).unref();`;
    await nsExec(ns, process.execPath, ['-e', script]);
    const listing = (await nsExec(ns, 'iptables', ['-t', 'filter', '-L', 'INPUT', '-v', '-x', '-n'])).stdout;
    const packets = (chain: string): number => Number(listing.split('\n').find((l) => l.includes(` ${chain} `))?.trim().split(/\s+/)[0] ?? NaN);
    // The first packet (the SYN) may be looked at by the guard; none may go to the ACCEPTs (not DNATed).
    expect(packets('KUBE-PROXY-PORTS')).toBeLessThanOrEqual(1);
    expect(packets('KUBE-NODEPORT-NON-LOCAL')).toBe(0);
    await p.cleanup();
  });

  it('for comparison: one iptables process per rule, as the Go proxy ran', async () => {
    const started = performance.now();
    for (let i = 0; i < 20; i++) await nsExec(ns, 'iptables', ['-w', '5', '-t', 'nat', '-A', 'POSTROUTING', '-d', `10.98.0.${i}/32`, '-j', 'RETURN']);
    const per = (performance.now() - started) / 20;
    timings.push(`one iptables process per rule: ${per.toFixed(1)} ms each (x 7,000 rules = ${((per * 7000) / 1000).toFixed(0)} s)`);
    expect(per).toBeGreaterThan(0);
  });
});
