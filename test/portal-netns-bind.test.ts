import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BIND_INTERFACE } from '../src/io/portal/bind-interface.js';
import { runCli, type Spawned } from './helpers/cli.js';
import { waitFor } from './helpers/net.js';
import {
  LAB,
  SERVICES as S,
  addForeignRules,
  createLab,
  labState,
  netnsSkipReason,
  nodeSnapshot,
  nsAdminGet,
  nsExec,
  nsRequest,
  reachabilityTests,
  reportSkip,
  startBackend,
  type Lab,
} from './helpers/netns.js';

/**
 * `--portal bind` on a real (namespaced) node, run with a PATH that holds `ip` and nothing else:
 * the node has no iptables as far as the proxy can tell. The test itself still reads iptables-save
 * (when installed) to show that no netfilter rule was written.
 */
reportSkip('portal-netns-bind.test.ts', netnsSkipReason);

const SYNC_PERIOD_MS = 2000;

function which(cmd: string): string | undefined {
  try {
    return execFileSync('sh', ['-c', `command -v ${cmd}`], { encoding: 'utf8' }).trim() || undefined;
  } catch {
    return undefined;
  }
}

const hasIptables = which('iptables-save') !== undefined;

describe.skipIf(netnsSkipReason !== undefined)(`--portal bind in network namespaces, without iptables${netnsSkipReason ? ` [skipped: ${netnsSkipReason}]` : ''}`, () => {
  let lab: Lab | undefined;
  let dir: string;
  let stateFile: string;
  /** The proxy's environment: PATH holds only `ip`. */
  let env: NodeJS.ProcessEnv;
  let before: Awaited<ReturnType<typeof nodeSnapshot>> | undefined;
  let backend: Awaited<ReturnType<typeof startBackend>> | undefined;
  const proxies: Spawned[] = [];

  function startProxy(): Spawned {
    const args = ['--portal', 'bind', '--state', stateFile, '--iptables-sync-period', `${SYNC_PERIOD_MS}ms`, '--iptables-min-sync-period', '50ms'];
    const proxy = runCli(args, { prefix: ['ip', 'netns', 'exec', lab!.node], env });
    proxies.push(proxy);
    return proxy;
  }

  async function cleanupCli(): Promise<{ code: number | string; stderr: string }> {
    const r = runCli(['--portal', 'bind', '--cleanup'], { prefix: ['ip', 'netns', 'exec', lab!.node], env });
    proxies.push(r);
    return { code: await r.exited, stderr: r.stderr() };
  }

  async function addresses(): Promise<string[] | undefined> {
    try {
      const { stdout } = await nsExec(lab!.node, 'ip', ['-j', 'addr', 'show', 'dev', BIND_INTERFACE]);
      const links = JSON.parse(stdout) as Array<{ addr_info: Array<{ local: string }> }>;
      return links.flatMap((l) => l.addr_info.map((a) => a.local)).filter((a) => !a.startsWith('fe80:')).sort();
    } catch {
      return undefined;
    }
  }

  async function snapshot(): Promise<Awaited<ReturnType<typeof nodeSnapshot>>> {
    const s = await nodeSnapshot(lab!.node);
    return hasIptables ? s : { ...s, iptables: '', ip6tables: '' };
  }

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-netns-bind-'));
    stateFile = join(dir, 'state.json');
    await writeFile(stateFile, labState(true));
    const bin = join(dir, 'bin');
    await mkdir(bin);
    await symlink(which('ip') ?? '/usr/sbin/ip', join(bin, 'ip'));
    env = { ...process.env, PATH: bin };
    expect(execFileSync('/bin/sh', ['-c', 'command -v iptables-save iptables-restore iptables || echo none'], { env: { PATH: bin }, encoding: 'utf8' }).trim()).toBe('none');
    lab = await createLab('bind');
    if (hasIptables) await addForeignRules(lab.node);
    before = await snapshot();
    backend = await startBackend(lab.backend, LAB.backend, S.backendTcp, S.backendUdp, 'backend');
    const proxy = startProxy();
    const line = await proxy.waitForLine(/kube-userspace-proxy started/);
    expect(JSON.parse(line)).toMatchObject({ portal: 'bind' });
  }, 60_000);

  afterAll(async () => {
    for (const p of proxies) p.kill();
    backend?.stop();
    if (lab) {
      await nsExec(lab.node, process.execPath, [join(process.cwd(), 'dist/bundle/main.js'), '--portal', 'bind', '--cleanup']).catch(() => {});
      await lab.destroy();
    }
    await rm(dir, { recursive: true, force: true });
  }, 60_000);

  reachabilityTests(() => lab);

  it('makes exactly the service addresses local, writes no netfilter rule, and reports the mode', async () => {
    expect(await addresses()).toEqual([S.externalIP, S.echoIP, S.goneIP].sort());
    if (hasIptables) expect((await nodeSnapshot(lab!.node)).iptables).toBe(before!.iptables);
    const status = (await nsAdminGet(lab!.node, '/services')) as { portal: string; services: Array<{ name: string; reachable: string[] }> };
    expect(status.portal).toBe('bind');
    expect(status.services.find((s) => s.name === 'default/echo:tcp')?.reachable).toEqual(expect.arrayContaining([`${S.echoIP}:${S.tcpPort}`, `${S.externalIP}:${S.tcpPort}`]));
  });

  it('a Service removed stops being reachable and its address is gone', async () => {
    expect(await nsRequest(lab!.pod, 'tcp', S.goneIP, S.tcpPort, 'still')).toBe('backend:still');
    await writeFile(stateFile, labState(false));
    await waitFor(async () => !(await addresses())?.includes(S.goneIP), 'the address of default/gone to go');
    await expect(nsRequest(lab!.pod, 'tcp', S.goneIP, S.tcpPort, 'gone', 800)).rejects.toThrow();
    await expect(nsRequest(lab!.node, 'tcp', S.goneIP, S.tcpPort, 'gone', 800)).rejects.toThrow();
    expect(await nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'others')).toBe('backend:others');
  });

  it.skipIf(!hasIptables)('a flushed nat table changes nothing', async () => {
    await nsExec(lab!.node, 'iptables', ['-t', 'nat', '-F']);
    expect(await nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'flushed')).toBe('backend:flushed');
    await addForeignRules(lab!.node); // our flush took the lab's own rules; their owner puts them back
    await nsExec(lab!.node, 'iptables', ['-D', 'INPUT', '-i', 'lo', '-m', 'comment', '--comment', 'lab: someone else', '-j', 'ACCEPT']);
  });

  it('a deleted interface, addresses and all, is restored within one sync period', async () => {
    await nsExec(lab!.node, 'ip', ['link', 'del', BIND_INTERFACE]);
    const deletedAt = Date.now();
    await waitFor(async () => (await addresses())?.length === 2, 'the interface to come back', SYNC_PERIOD_MS + 3000);
    expect(Date.now() - deletedAt).toBeLessThan(SYNC_PERIOD_MS + 1000);
    // Sockets bound to the addresses before serve again once the addresses are back.
    expect(await waitFor(() => nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'back', 500), 'the ClusterIP')).toBe('backend:back');
    expect(await nsRequest(lab!.pod, 'udp', S.echoIP, S.udpPort, 'back-udp')).toBe('backend:back-udp');
  });

  it('after SIGKILL, a restart removes the leftovers and programs afresh', async () => {
    const [first] = proxies;
    first!.kill();
    await first!.exited;
    await nsExec(lab!.node, 'ip', ['addr', 'add', `${S.goneIP}/32`, 'dev', BIND_INTERFACE]); // a stale address, as if from an older state
    expect(await addresses()).toEqual([S.externalIP, S.echoIP, S.goneIP].sort());
    const second = startProxy();
    await second.waitForLine(/kube-userspace-proxy started/);
    await waitFor(() => nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'again', 500), 'the restarted proxy');
    expect(await addresses()).toEqual([S.externalIP, S.echoIP].sort());
  });

  it('--cleanup leaves ip route, ip addr (and iptables-save) as they were before start, and twice is fine', async () => {
    for (const p of proxies) p.kill();
    await Promise.all(proxies.map((p) => p.exited));
    expect(await cleanupCli()).toMatchObject({ code: 0 });
    expect(await cleanupCli()).toMatchObject({ code: 0 });
    expect(await addresses()).toBeUndefined();
    expect(await snapshot()).toEqual(before);
  });

  it('the test setup really hid iptables from the proxy', () => {
    expect(dirname(String(env.PATH))).toBe(dir);
  });
});
