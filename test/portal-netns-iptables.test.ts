import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseIptablesSave, planJumps, planRemoval } from '../src/core/rules/iptables-save.js';
import { runCli, type Spawned } from './helpers/cli.js';
import { waitFor } from './helpers/net.js';
import {
  FOREIGN_RULES,
  LAB,
  SERVICES as S,
  addForeignRules,
  createLab,
  iptablesSkipReason,
  labState,
  nodeSnapshot,
  nsAdminGet,
  nsExec,
  nsHoldPort,
  nsRequest,
  nsTryBind,
  reachabilityTests,
  reportSkip,
  startBackend,
  type Lab,
} from './helpers/netns.js';

/**
 * `--portal iptables` on a real (namespaced) node: the built CLI runs inside the node's namespace,
 * clients run in the pod's, the node's and the outside host's. See helpers/netns.ts for the lab.
 */
reportSkip('portal-netns-iptables.test.ts', iptablesSkipReason);

const SYNC_PERIOD_MS = 2000;

describe.skipIf(iptablesSkipReason !== undefined)(`--portal iptables in network namespaces${iptablesSkipReason ? ` [skipped: ${iptablesSkipReason}]` : ''}`, () => {
  let lab: Lab | undefined;
  let dir: string;
  let stateFile: string;
  let before: Awaited<ReturnType<typeof nodeSnapshot>>;
  let backend: Awaited<ReturnType<typeof startBackend>> | undefined;
  const proxies: Spawned[] = [];

  function startProxy(): Spawned {
    const args = ['--portal', 'iptables', '--state', stateFile, '--iptables-sync-period', `${SYNC_PERIOD_MS}ms`, '--iptables-min-sync-period', '50ms', '--log-level', 'info'];
    const proxy = runCli(args, { prefix: ['ip', 'netns', 'exec', lab!.node] });
    proxies.push(proxy);
    return proxy;
  }

  /** `--cleanup`, with `--portal iptables` or, as kube-proxy's, with no mode named. */
  async function cleanupCli(portal: string[] = ['--portal', 'iptables']): Promise<{ code: number | string; stderr: string }> {
    const r = runCli([...portal, '--cleanup'], { prefix: ['ip', 'netns', 'exec', lab!.node] });
    proxies.push(r);
    return { code: await r.exited, stderr: r.stderr() };
  }

  async function saved(): Promise<string> {
    return (await nsExec(lab!.node, 'iptables-save', [])).stdout;
  }

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-netns-ipt-'));
    stateFile = join(dir, 'state.json');
    await writeFile(stateFile, labState(true));
    lab = await createLab('ipt');
    await addForeignRules(lab.node);
    before = await nodeSnapshot(lab.node);
    backend = await startBackend(lab.backend, LAB.backend, S.backendTcp, S.backendUdp, 'backend');
    const proxy = startProxy();
    const line = await proxy.waitForLine(/kube-userspace-proxy started/);
    expect(JSON.parse(line)).toMatchObject({ portal: 'iptables' });
  }, 60_000);

  afterAll(async () => {
    for (const p of proxies) p.kill();
    backend?.stop();
    if (lab) {
      await nsExec(lab.node, process.execPath, [join(process.cwd(), 'dist/bundle/main.js'), '--portal', 'iptables', '--cleanup']).catch(() => {});
      await lab.destroy();
    }
    await rm(dir, { recursive: true, force: true });
  }, 60_000);

  reachabilityTests(() => lab);

  it('reports the portal mode and proxy ports in /services', async () => {
    const status = (await nsAdminGet(lab!.node, '/services')) as { portal: string; services: Array<{ name: string; proxyPort: number | null; errors: string[] }> };
    expect(status.portal).toBe('iptables');
    const echo = status.services.find((s) => s.name === 'default/echo:tcp');
    expect(echo?.proxyPort).toBeGreaterThan(0);
    expect(echo?.errors).toEqual([]);
  });

  it('holds each node port open, so no other process can take it', async () => {
    expect(await nsTryBind(lab!.node, '0.0.0.0', S.tcpNodePort)).toBe('EADDRINUSE');
  });

  it('a proxy port answers portal traffic only: straight to node-address:proxy-port is refused', async () => {
    const rules = await saved();
    const proxyPort = Number(/--comment "default\/echo:tcp" -m tcp --dport 80 -j REDIRECT --to-ports (\d+)/.exec(rules)?.[1]);
    expect(proxyPort).toBeGreaterThan(0);
    await expect(nsRequest(lab!.outside, 'tcp', LAB.nodeOutsideSide, proxyPort, 'sneak')).rejects.toThrow('ECONNREFUSED');
    await expect(nsRequest(lab!.pod, 'tcp', LAB.nodePodSide, proxyPort, 'sneak')).rejects.toThrow('ECONNREFUSED');
    await expect(nsRequest(lab!.node, 'tcp', '127.0.0.1', proxyPort, 'sneak')).rejects.toThrow('ECONNREFUSED');
    const udpPort = Number(/--comment "default\/echo:udp" -m udp --dport 53 -j REDIRECT --to-ports (\d+)/.exec(rules)?.[1]);
    await expect(nsRequest(lab!.outside, 'udp', LAB.nodeOutsideSide, udpPort, 'sneak', 800)).rejects.toThrow();
    // The same port through its portal still works.
    expect(await nsRequest(lab!.outside, 'tcp', LAB.nodeOutsideSide, S.tcpNodePort, 'portal')).toBe('backend:portal');
  });

  it("writes our chains with the namespace/name:port comment and leaves others' rules alone", async () => {
    const rules = await saved();
    expect(planJumps(parseIptablesSave(rules))).toEqual({ nat: [], filter: [] });
    const nat = rules.split('\n').filter((l) => / -j (REDIRECT|DNAT) /.test(l));
    expect(nat.length).toBeGreaterThan(0);
    for (const line of nat) expect(line).toMatch(/--comment "default\/(echo|gone):/);
    expect(rules).toContain(FOREIGN_RULES.nat);
    expect(rules).toContain(FOREIGN_RULES.filter);
  });

  it('a Service removed stops being reachable and its rules are gone', async () => {
    expect(await nsRequest(lab!.pod, 'tcp', S.goneIP, S.tcpPort, 'still')).toBe('backend:still');
    await writeFile(stateFile, labState(false));
    await waitFor(async () => !(await saved()).includes('default/gone'), 'the rules of default/gone to go');
    await expect(nsRequest(lab!.pod, 'tcp', S.goneIP, S.tcpPort, 'gone', 800)).rejects.toThrow();
    await expect(nsRequest(lab!.node, 'tcp', S.goneIP, S.tcpPort, 'gone', 800)).rejects.toThrow();
    expect(await nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'others')).toBe('backend:others');
  });

  it('a flushed nat table is restored within one sync period', async () => {
    await nsExec(lab!.node, 'iptables', ['-t', 'nat', '-F']);
    const flushedAt = Date.now();
    await waitFor(async () => {
      const dump = parseIptablesSave(await saved());
      const jumps = planJumps(dump);
      return jumps.nat.length === 0 && dump.get('nat')!.rules.some((r) => r.chain === 'KUBE-PORTALS-CONTAINER');
    }, 'chains and jumps to come back', SYNC_PERIOD_MS + 3000);
    expect(Date.now() - flushedAt).toBeLessThan(SYNC_PERIOD_MS + 1000);
    expect(await nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'back')).toBe('backend:back');
    // Our flush took the lab's own nat rule too; its owner puts it back.
    await nsExec(lab!.node, 'iptables-restore', ['--noflush'], { input: `*nat\n${FOREIGN_RULES.nat}\nCOMMIT\n` });
  });

  it('after SIGKILL, a restart replaces the leftovers, binding the same proxy ports', async () => {
    const [first] = proxies;
    first!.kill();
    await first!.exited;
    const left = await saved();
    expect(planRemoval(parseIptablesSave(left))).not.toBe(''); // SIGKILL left our rules behind
    const oldPort = /--comment "default\/echo:tcp" -m tcp --dport 80 -j REDIRECT --to-ports (\d+)/.exec(left)?.[1];

    const second = startProxy();
    await second.waitForLine(/kube-userspace-proxy started/);
    await waitFor(() => nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'again', 500), 'the restarted proxy');
    const rules = await saved();
    expect(planJumps(parseIptablesSave(rules))).toEqual({ nat: [], filter: [] });
    // Exactly the rules of the Services now served (echo: 2 ports), none of the dead process's.
    expect(rules.split('\n').filter((l) => /^-A KUBE-UP-PC-\S+ .* -j REDIRECT /.test(l))).toHaveLength(4);
    expect(rules.split('\n').filter((l) => /^-A KUBE-UP-NC-\S+ .* -j REDIRECT /.test(l))).toHaveLength(2);
    const newPort = /--comment "default\/echo:tcp" -m tcp --dport 80 -j REDIRECT --to-ports (\d+)/.exec(rules)?.[1];
    // The same proxy port again: conntrack entries of flows under way still point at it.
    expect(newPort).toBe(oldPort);
  });

  it('a node port taken by another process is one clear error for that service port; the others keep working', async () => {
    for (const p of proxies) p.kill();
    await Promise.all(proxies.map((p) => p.exited));
    const holder = await nsHoldPort(lab!.node, '0.0.0.0', S.tcpNodePort);
    try {
      const proxy = startProxy();
      await proxy.waitForLine(/kube-userspace-proxy started/);
      const status = (await nsAdminGet(lab!.node, '/services')) as { services: Array<{ name: string; errors: string[] }> };
      const errors = Object.fromEntries(status.services.map((s) => [s.name, s.errors]));
      expect(errors['default/echo:tcp']).toEqual([`cannot listen on 0.0.0.0:${S.tcpNodePort}: the address is in use by another process`]);
      expect(errors['default/echo:udp']).toEqual([]);
      expect(proxy.stdout()).toContain(`cannot listen on 0.0.0.0:${S.tcpNodePort}`);
      expect(await nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'cluster')).toBe('backend:cluster');
      expect(await nsRequest(lab!.outside, 'udp', LAB.nodeOutsideSide, S.udpNodePort, 'np-udp')).toBe('backend:np-udp');
    } finally {
      await holder.stop();
    }
    // Retried on every sync: once the port is free, the error clears.
    await waitFor(async () => {
      const status = (await nsAdminGet(lab!.node, '/services')) as { services: Array<{ name: string; errors: string[] }> };
      return status.services.find((s) => s.name === 'default/echo:tcp')?.errors.length === 0;
    }, 'the node port to be held again', SYNC_PERIOD_MS + 3000);
    expect(await nsTryBind(lab!.node, '0.0.0.0', S.tcpNodePort)).toBe('EADDRINUSE');
  });

  it('--cleanup leaves iptables-save, ip route and ip addr as they were before start, and twice is fine', async () => {
    for (const p of proxies) p.kill();
    await Promise.all(proxies.map((p) => p.exited));
    // No --portal: as kube-proxy's, --cleanup removes what any mode installed (run as root).
    const once = await cleanupCli([]);
    expect(once).toMatchObject({ code: 0 });
    expect(await nodeSnapshot(lab!.node)).toEqual(before);
    const twice = await cleanupCli();
    expect(twice).toMatchObject({ code: 0 });
    expect(await nodeSnapshot(lab!.node)).toEqual(before);
  });
});
