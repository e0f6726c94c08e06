import { describe, expect, it } from 'vitest';
import type { NodeAddress } from '../src/core/rules/node-address.js';
import type { ProxyUnit } from '../src/core/units.js';
import { UsageError } from '../src/core/errors.js';
import { BindPortal } from '../src/io/portal/bind-portal.js';
import { CommandError, type CommandResult, type CommandRunner } from '../src/io/portal/command-runner.js';
import type { NodeAddressSource } from '../src/io/portal/node-addresses.js';
import type { RunningUnitView } from '../src/seams/portal.js';
import { silentLogger } from '../src/log.js';
import { servicePort, unitsOf } from './helpers/service-port.js';

const sp = servicePort;

function views(units: ProxyUnit[]): RunningUnitView[] {
  return units.map((unit) => ({ unit }));
}

const nodeAddresses: NodeAddressSource = {
  addresses: (): NodeAddress[] => [
    { ip: '127.0.0.1', family: 4, iface: 'lo', internal: true },
    { ip: '192.168.1.10', family: 4, iface: 'eth0', internal: false },
    { ip: '10.0.0.5', family: 4, iface: 'eth1', internal: false },
    { ip: '2001:db8::10', family: 6, iface: 'eth0', internal: false },
    { ip: 'fe80::1', family: 6, iface: 'eth0', internal: false },
    { ip: '10.96.0.10', family: 4, iface: 'kube-userspace0', internal: false },
  ],
  defaultRouteInterface: () => 'eth0',
  ipv6Enabled: () => true,
};

/** A fake `ip`: links and their addresses, as the bind portal's commands change them. No iptables. */
class FakeIp implements CommandRunner {
  links = new Map<string, Set<string>>([['lo', new Set(['127.0.0.1'])]]);
  calls: string[] = [];
  unsupportedTypes = new Set<string>();
  /** Addresses the kernel refuses to add. */
  refuse = new Set<string>();

  async run(command: string, args: readonly string[], input?: string): Promise<CommandResult> {
    return this.runSync(command, args, input, false);
  }

  runSync(command: string, args: readonly string[], input?: string, sync = true): CommandResult {
    const line = `${sync ? 'SYNC ' : ''}${command} ${args.join(' ')}`;
    this.calls.push(input ? `${line} <<${input.trim().split('\n').join('; ')}` : line);
    const fail = (stderr: string, cause?: unknown): never => {
      throw new CommandError(command, args, { exitCode: cause ? null : 1, stderr, cause });
    };
    if (command !== 'ip') return fail('', Object.assign(new Error('spawn ENOENT'), { code: 'ENOENT' }));
    const a = args.join(' ');
    if (a === '-j link show') return ok(JSON.stringify([...this.links.keys()].map((ifname) => ({ ifname }))));
    let m = /^link add (\S+) type (\S+)$/.exec(a);
    if (m) {
      if (this.unsupportedTypes.has(m[2]!)) fail('Error: Unknown device type.');
      this.links.set(m[1]!, new Set());
      return ok('');
    }
    if (/^link set \S+ up$/.test(a)) return ok('');
    m = /^link del (\S+)$/.exec(a);
    if (m) {
      if (!this.links.delete(m[1]!)) fail('Cannot find device');
      return ok('');
    }
    m = /^-j addr show dev (\S+)$/.exec(a);
    if (m) {
      const addrs = this.links.get(m[1]!);
      if (!addrs) fail('Device does not exist');
      return ok(JSON.stringify([{ ifname: m[1], addr_info: [...addrs!].map((local) => ({ local })) }]));
    }
    if (a === '-force -batch -') {
      let failed = false;
      for (const l of (input ?? '').trim().split('\n')) {
        const b = /^address (add|del) ([^/]+)\/\d+ dev (\S+)/.exec(l);
        const set = b ? this.links.get(b[3]!) : undefined;
        if (!b || !set || this.refuse.has(b[2]!)) {
          failed = true;
          continue;
        }
        if (b[1] === 'add') set.add(b[2]!);
        else set.delete(b[2]!);
      }
      if (failed) fail('Command failed -:1');
      return ok('');
    }
    return fail(`unexpected: ip ${a}`);
  }

  addresses(): string[] {
    return [...(this.links.get('kube-userspace0') ?? [])].sort();
  }
}

function ok(stdout: string): CommandResult {
  return { stdout, stderr: '' };
}

function portal(ip: FakeIp, nodePortAddresses: string[] = []): BindPortal {
  return new BindPortal({ runner: ip, logger: silentLogger(), nodeAddresses, nodePortAddresses });
}

describe('BindPortal (fake ip, no iptables on the node)', () => {
  it('start-up keeps its own interface for the first sync, which drops the addresses of Services gone; without iptables installed', async () => {
    const ip = new FakeIp();
    ip.links.set('kube-userspace0', new Set(['10.96.9.9']));
    const p = portal(ip);
    await p.start();
    // No gap on restart: the addresses stay local until the first sync has the new state.
    expect(ip.calls).not.toContain('ip link del kube-userspace0');
    expect(ip.addresses()).toEqual(['10.96.9.9']);
    await p.sync([], false);
    expect(ip.addresses()).toEqual([]);
  });

  it('start-up creates the interface when there is none', async () => {
    const ip = new FakeIp();
    await portal(ip).start();
    expect(ip.calls).toContain('ip link add kube-userspace0 type dummy');
  });

  it('falls back to an ifb link where the kernel has no dummy', async () => {
    const ip = new FakeIp();
    ip.unsupportedTypes.add('dummy');
    await portal(ip).start();
    expect(ip.calls).toContain('ip link add kube-userspace0 type ifb');
    expect(ip.links.has('kube-userspace0')).toBe(true);
  });

  it('fails start-up with one clear line when no link can be made', async () => {
    const ip = new FakeIp();
    ip.unsupportedTypes.add('dummy').add('ifb');
    await expect(portal(ip).start()).rejects.toThrow(UsageError);
    await expect(portal(ip).start()).rejects.toThrow(/cannot create interface kube-userspace0/);
  });

  it('listens on every portal address and on node ports, with the addresses made local first', async () => {
    const ip = new FakeIp();
    const p = portal(ip);
    await p.start();
    const [u] = unitsOf(sp('default/web:http', { clusterIPs: ['10.96.0.10', 'fd00::a'], externalIPs: ['203.0.113.10'], loadBalancerIPs: ['198.51.100.7'], nodePort: 30080 }));
    const specs = p.listenSpecs(u!);
    expect(specs.map((s) => `${s.host} ${s.port}`)).toEqual(['10.96.0.10 80', 'fd00::a 80', '203.0.113.10 80', '198.51.100.7 80', '0.0.0.0 30080', ':: 30080']);
    expect(specs.some((s) => s.proxyPort)).toBe(false);
    expect(ip.addresses()).toEqual(['10.96.0.10', '198.51.100.7', '203.0.113.10', 'fd00::a']);
    expect(ip.calls.filter((c) => c.startsWith('SYNC'))).toEqual([
      'SYNC ip -force -batch - <<address add 10.96.0.10/32 dev kube-userspace0; address add fd00::a/128 dev kube-userspace0 nodad; address add 203.0.113.10/32 dev kube-userspace0; address add 198.51.100.7/32 dev kube-userspace0',
    ]);
  });

  it('prepare() adds the addresses of a whole sync in one batch, so listenSpecs need not block', async () => {
    const ip = new FakeIp();
    const p = portal(ip);
    await p.start();
    const units = unitsOf(sp('default/a:http', { clusterIPs: ['10.96.0.1'] }), sp('default/b:http', { clusterIPs: ['10.96.0.2'] }));
    expect(await p.prepare(units)).toEqual({ errors: [] });
    for (const u of units) p.listenSpecs(u);
    expect(ip.calls.filter((c) => c.startsWith('SYNC'))).toEqual([]);
    expect(ip.calls.filter((c) => c.includes('-batch'))).toHaveLength(1);
  });

  it('with --nodeport-addresses, node ports listen on each allowed node address of the family', async () => {
    const ip = new FakeIp();
    const p = portal(ip, ['192.168.1.0/24', '127.0.0.0/8', '2001:db8::/64']);
    await p.start();
    const [v4] = unitsOf(sp('default/web:http', { nodePort: 30080 }));
    expect(p.listenSpecs(v4!).filter((s) => s.port === 30080).map((s) => s.host)).toEqual(['127.0.0.1', '192.168.1.10']);
    const [dual] = unitsOf(sp('default/dual:http', { clusterIPs: ['10.96.0.12', 'fd00::c'], nodePort: 30082 }));
    expect(p.listenSpecs(dual!).filter((s) => s.port === 30082).map((s) => s.host)).toEqual(['127.0.0.1', '192.168.1.10', '2001:db8::10']);
  });

  it('sync removes the addresses of removed Services in one batch and keeps the rest', async () => {
    const ip = new FakeIp();
    const p = portal(ip);
    await p.start();
    const units = unitsOf(sp('default/a:http', { clusterIPs: ['10.96.0.1'] }), sp('default/b:http', { clusterIPs: ['10.96.0.2'], externalIPs: ['203.0.113.2'] }));
    for (const u of units) p.listenSpecs(u);
    expect(await p.sync(views(units), false)).toEqual({ errors: [] });
    ip.calls = [];
    expect(await p.sync(views(units.slice(0, 1)), false)).toEqual({ errors: [] });
    expect(ip.addresses()).toEqual(['10.96.0.1']);
    expect(ip.calls.filter((c) => c.includes('-batch'))).toEqual([
      'ip -force -batch - <<address del 10.96.0.2/32 dev kube-userspace0; address del 203.0.113.2/32 dev kube-userspace0',
    ]);
  });

  it('a periodic sync puts back what someone removed, even the whole interface', async () => {
    const ip = new FakeIp();
    const p = portal(ip);
    await p.start();
    const units = unitsOf(sp('default/a:http', { clusterIPs: ['10.96.0.1'] }));
    for (const u of units) p.listenSpecs(u);
    await p.sync(views(units), false);
    ip.links.delete('kube-userspace0');
    expect(await p.sync(views(units), false)).toEqual({ errors: [] }); // not noticed yet: no re-read
    expect(await p.sync(views(units), true)).toEqual({ errors: [] });
    expect(ip.addresses()).toEqual(['10.96.0.1']);
  });

  it('an address the kernel refuses is one error, retried next sync; the others are in place', async () => {
    const ip = new FakeIp();
    const p = portal(ip);
    await p.start();
    ip.refuse.add('203.0.113.66');
    const units = unitsOf(sp('default/a:http', { clusterIPs: ['10.96.0.1'] }), sp('default/b:http', { clusterIPs: ['10.96.0.2'], externalIPs: ['203.0.113.66'] }));
    const result = await p.sync(views(units), false);
    expect(result.errors).toEqual([expect.stringMatching(/^cannot make 203\.0\.113\.66 local to this node \(retried next sync\)/)]);
    expect(ip.addresses()).toEqual(['10.96.0.1', '10.96.0.2']);
    ip.refuse.clear();
    expect(await p.sync(views(units), false)).toEqual({ errors: [] });
    expect(ip.addresses()).toEqual(['10.96.0.1', '10.96.0.2', '203.0.113.66']);
  });

  it('cleanup deletes the interface, and is fine twice and on a node without iptables', async () => {
    const ip = new FakeIp();
    const p = portal(ip);
    await p.start();
    p.listenSpecs(unitsOf(sp('default/a:http'))[0]!);
    await p.cleanup();
    expect(ip.links.has('kube-userspace0')).toBe(false);
    await expect(p.cleanup()).resolves.toBeUndefined();
  });
});
