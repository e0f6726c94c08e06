import { spawn, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeAddress } from '../src/core/rules/node-address.js';
import { IptablesPortal } from '../src/io/portal/iptables-portal.js';
import type { NodeAddressSource } from '../src/io/portal/node-addresses.js';
import { silentLogger } from '../src/log.js';
import { conntrackSkipReason, nsExec, nsRunner, reportSkip, run } from './helpers/netns.js';
import { servicePort, unitsOf } from './helpers/service-port.js';

/**
 * A UDP Service is deleted while a client keeps talking to its ClusterIP; its proxy port, freed,
 * goes to another UDP Service (the port allocator quarantines it for one sync only). The client's
 * conntrack entry still says "NAT to that proxy port": unless the portal deletes the entries of
 * the deleted Service's portals (as kube-proxy does for deleted UDP ClusterIPs), the client's
 * packets to the deleted ClusterIP are answered by the other Service.
 */
const skip = conntrackSkipReason;
reportSkip('portal-netns-udp-reuse.test.ts', skip);

const NODE = '10.250.0.1';
const nodeAddresses: NodeAddressSource = {
  addresses: (): NodeAddress[] => [
    { ip: '127.0.0.1', family: 4, iface: 'lo', internal: true },
    { ip: NODE, family: 4, iface: 'dummy0', internal: false },
  ],
  defaultRouteInterface: () => 'dummy0',
  ipv6Enabled: () => false,
};

/** One process in the namespace: UDP servers that answer with their name, and one client socket on a fixed port. */
const SCRIPT = `
  const dgram = require('node:dgram');
  const servers = new Map();
  const client = dgram.createSocket('udp4');
  let waiting;
  client.on('message', (m) => { if (waiting) { const w = waiting; waiting = undefined; w(m.toString()); } });
  client.bind(5555, () => process.stdout.write('ready\\n'));
  const rl = require('node:readline').createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    const [cmd, a, b] = line.split(' ');
    if (cmd === 'serve') {
      const s = dgram.createSocket('udp4');
      s.on('message', (m, r) => s.send(a, r.port, r.address));
      s.bind(Number(b), '0.0.0.0', () => { servers.set(a, s); process.stdout.write('ok\\n'); });
    } else if (cmd === 'close') {
      servers.get(a).close(() => process.stdout.write('ok\\n'));
    } else if (cmd === 'send') {
      const t = setTimeout(() => { waiting = undefined; process.stdout.write('reply none\\n'); }, 700);
      waiting = (text) => { clearTimeout(t); process.stdout.write('reply ' + text + '\\n'); };
      client.send('x', Number(b), a);
    }
  });
  setTimeout(() => process.exit(0), 60000).unref();`;

describe.skipIf(skip !== undefined)('a deleted UDP Service\'s conntrack entries and a reused proxy port', () => {
  const ns = `kup-${process.pid}-udpreuse`;
  let child: ChildProcess | undefined;
  let out = '';
  const lines: string[] = [];

  async function command(line: string): Promise<string> {
    const before = lines.length;
    child!.stdin!.write(`${line}\n`);
    const deadline = Date.now() + 5000;
    while (lines.length === before) {
      if (Date.now() > deadline) throw new Error(`no answer to ${line}: ${out}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    return lines[before]!;
  }

  beforeAll(async () => {
    await run('ip', ['netns', 'add', ns]);
    try {
      await nsExec(ns, 'ip', ['link', 'set', 'lo', 'up']);
      // A veth pair with both ends here: an interface with an address and a default route, nothing outside.
      await nsExec(ns, 'ip', ['link', 'add', 'dummy0', 'type', 'veth', 'peer', 'name', 'dummy1']);
      await nsExec(ns, 'ip', ['link', 'set', 'dummy1', 'up']);
      await nsExec(ns, 'ip', ['addr', 'add', `${NODE}/24`, 'dev', 'dummy0']);
      await nsExec(ns, 'ip', ['link', 'set', 'dummy0', 'up']);
      await nsExec(ns, 'ip', ['route', 'add', 'default', 'dev', 'dummy0']);
      child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', SCRIPT], { stdio: ['pipe', 'pipe', 'pipe'] });
      child.stdout!.on('data', (d: Buffer) => {
        out += d.toString();
        const parts = out.split('\n');
        out = parts.pop() ?? '';
        lines.push(...parts);
      });
      const deadline = Date.now() + 10_000;
      while (!lines.includes('ready')) {
        if (Date.now() > deadline) throw new Error('helper did not start');
        await new Promise((r) => setTimeout(r, 20));
      }
      lines.length = 0;
    } catch (err) {
      await run('ip', ['netns', 'del', ns]).catch(() => {});
      throw err;
    }
  }, 30_000);

  afterAll(async () => {
    if (child && child.exitCode === null) child.kill('SIGKILL');
    await run('ip', ['netns', 'del', ns]).catch(() => {});
  });

  it('after the Service is deleted, its client is not answered by the Service that got its proxy port', async () => {
    const P = 40053;
    const [a] = unitsOf(servicePort('default/a:dns', { protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.53'] }));
    const [b] = unitsOf(servicePort('default/b:dns', { protocol: 'UDP', port: 53, clusterIPs: ['10.96.0.54'] }));
    const portal = new IptablesPortal({ runner: nsRunner(ns), logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [] });
    try {
      await portal.start();
      expect(await command(`serve A ${P}`)).toBe('ok');
      expect((await portal.sync([{ unit: a!, proxyPort: P }], false)).errors).toEqual([]);
      expect(await command('send 10.96.0.53 53')).toBe('reply A');
      // Service a is deleted: its socket closes, the portal is synced without it.
      expect(await command('close A')).toBe('ok');
      expect((await portal.sync([], false)).errors).toEqual([]);
      // Next batch: the freed port goes to Service b.
      expect(await command(`serve B ${P}`)).toBe('ok');
      expect((await portal.sync([{ unit: b!, proxyPort: P }], false)).errors).toEqual([]);
      expect(await command('send 10.96.0.54 53')).toBe('reply B');
      // The client of the deleted Service a: nothing serves 10.96.0.53 any more.
      expect(await command('send 10.96.0.53 53')).toBe('reply none');
    } finally {
      await portal.cleanup().catch(() => {});
    }
  }, 30_000);
});
