import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, type Spawned } from './helpers/cli.js';
import { waitFor } from './helpers/net.js';
import { LAB, SERVICES as S, conntrackSkipReason, createLab, labState, nsAdminGet, nsExec, nsRequest, nsUdpFlow, reportSkip, startBackend, type Lab, type UdpFlow } from './helpers/netns.js';

/**
 * `--portal iptables` across restarts, with flows under way: a UDP client that keeps sending keeps
 * its conntrack entry alive, and the entry keeps its packets going to the proxy port it was NATed
 * to when it was created. A restart must bind the same proxy ports again, or delete the entries
 * that point elsewhere. Everything runs in the lab's namespaces (see helpers/netns.ts).
 */
reportSkip('portal-netns-conntrack.test.ts', conntrackSkipReason);


/**
 * A TCP connection from `localPort` in `ns`, established and answered; `abort()` resets it (the
 * socket is gone at once, its port free) and resolves when the process has exited.
 */
async function nsHeldConnection(ns: string, host: string, port: number, localPort: number): Promise<{ abort(): Promise<void> }> {
  const script = `
    const s = require('node:net').connect({ host: process.argv[1], port: Number(process.argv[2]), localPort: Number(process.argv[3]) });
    let got = '';
    s.on('connect', () => s.write('held'));
    s.on('data', (d) => { got += d; if (got.includes('held')) process.stdout.write('up\\n'); });
    s.on('error', (e) => { process.stderr.write(String(e)); process.exit(1); });
    process.stdin.on('data', () => { s.resetAndDestroy(); setImmediate(() => process.exit(0)); });
    setTimeout(() => process.exit(2), 30000).unref();`;
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', script, host, String(port), String(localPort)], { stdio: ['pipe', 'pipe', 'pipe'] });
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no connection from port ${localPort}: ${err}`)), 10_000);
    child.stdout?.on('data', () => {
      clearTimeout(timer);
      resolve();
    });
    void exited.then(() => {
      clearTimeout(timer);
      reject(new Error(`the connection from port ${localPort} ended: ${err}`));
    });
  });
  return {
    abort: async () => {
      child.stdin?.write('abort\n');
      await exited;
    },
  };
}

interface Status {
  services: Array<{ name: string; proxyPort: number | null; errors: string[] }>;
}

describe.skipIf(conntrackSkipReason !== undefined)(`--portal iptables restarts under ongoing flows${conntrackSkipReason ? ` [skipped: ${conntrackSkipReason}]` : ''}`, () => {
  let lab: Lab | undefined;
  let dir: string;
  let stateFile: string;
  let backend: Awaited<ReturnType<typeof startBackend>> | undefined;
  const proxies: Spawned[] = [];
  const flows: UdpFlow[] = [];

  function startProxy(extra: string[] = []): Spawned {
    const args = ['--portal', 'iptables', '--state', stateFile, '--iptables-min-sync-period', '50ms', '--log-level', 'info', ...extra];
    const proxy = runCli(args, { prefix: ['ip', 'netns', 'exec', lab!.node] });
    proxies.push(proxy);
    return proxy;
  }

  async function proxyPorts(): Promise<Record<string, number | null>> {
    const status = (await nsAdminGet(lab!.node, '/services')) as Status;
    return Object.fromEntries(status.services.map((s) => [s.name, s.proxyPort]));
  }

  async function started(extra: string[] = []): Promise<Spawned> {
    const proxy = startProxy(extra);
    await proxy.waitForLine(/kube-userspace-proxy started/);
    return proxy;
  }

  async function sigkill(proxy: Spawned): Promise<void> {
    proxy.kill();
    await proxy.exited;
  }

  /** A flow from the pod to the ClusterIP and one from the outside host to the node port, replying. */
  async function startFlows(podPort: number, outsidePort: number): Promise<[UdpFlow, UdpFlow]> {
    const pod = await nsUdpFlow(lab!.pod, S.echoIP, S.udpPort, podPort);
    flows.push(pod);
    const outside = await nsUdpFlow(lab!.outside, LAB.nodeOutsideSide, S.udpNodePort, outsidePort);
    flows.push(outside);
    await pod.waitForReply('before', 5000);
    await outside.waitForReply('before', 5000);
    return [pod, outside];
  }

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-netns-ct-'));
    stateFile = join(dir, 'state.json');
    await writeFile(stateFile, labState(false));
    lab = await createLab('ct');
    backend = await startBackend(lab.backend, LAB.backend, S.backendTcp, S.backendUdp, 'backend');
  }, 60_000);

  afterAll(async () => {
    await Promise.all(flows.map((f) => f.stop()));
    for (const p of proxies) p.kill();
    backend?.stop();
    if (lab) {
      await nsExec(lab.node, process.execPath, [join(process.cwd(), 'dist/bundle/main.js'), '--portal', 'iptables', '--cleanup']).catch(() => {});
      await lab.destroy();
    }
    await rm(dir, { recursive: true, force: true });
  }, 60_000);

  it('after SIGKILL, a restart binds the same proxy ports again and ongoing UDP flows get replies again', async () => {
    const first = await started();
    const [pod, outside] = await startFlows(40053, 40054);
    const before = await proxyPorts();
    expect(before['default/echo:udp']).toBeGreaterThan(0);

    await sigkill(first);
    pod.setPhase('after');
    outside.setPhase('after');
    const second = await started();
    await pod.waitForReply('after', 10_000);
    await outside.waitForReply('after', 10_000);
    expect(second.stdout()).toContain('found the proxy ports of the previous run');
    expect(await proxyPorts()).toEqual(before);
    await Promise.all([pod.stop(), outside.stop()]);
  }, 60_000);

  it('when the proxy port cannot be kept, the stale conntrack entries are deleted and the flows move to the new port', async () => {
    const [pod, outside] = await startFlows(40055, 40056);
    const before = await proxyPorts();
    // A range that holds none of the running ports: the next run must bind others.
    const range = await otherRange();

    for (const p of proxies) await sigkill(p);
    pod.setPhase('after');
    outside.setPhase('after');
    const third = await started(['--proxy-port-range', range]);
    await pod.waitForReply('after', 10_000);
    await outside.waitForReply('after', 10_000);
    const after = await proxyPorts();
    expect(after['default/echo:udp']).not.toBe(before['default/echo:udp']);
    await waitFor(async () => third.stdout().includes('deleted stale conntrack entries'), 'the deletion to be logged');
    const logged = third.stdout().split('\n').filter((l) => l.includes('deleted stale conntrack entries')).map((l) => JSON.parse(l) as { portal: string; staleTarget: string });
    expect(logged.map((l) => l.portal)).toEqual(expect.arrayContaining([`${S.echoIP}:${S.udpPort}`, `${LAB.nodeOutsideSide}:${S.udpNodePort}`]));
    for (const l of logged) expect(l.staleTarget).toMatch(new RegExp(`:${before['default/echo:udp']}$`));
    await Promise.all([pod.stop(), outside.stop()]);
  }, 60_000);

  /** A port range of two that holds none of the running proxy ports. */
  async function otherRange(): Promise<string> {
    const taken = Object.values(await proxyPorts());
    let base = 41000;
    while (taken.some((p) => p !== null && p >= base && p <= base + 1)) base += 1000;
    return `${base}-${base + 1}`;
  }

  it('a TCP SYN from a reused client port is not sent to the dead proxy port by an entry the old run left', async () => {
    const held = await nsHeldConnection(lab!.pod, S.echoIP, S.tcpPort, 40080);
    const oldPort = (await proxyPorts())['default/echo:tcp'];
    const range = await otherRange();
    // The client's resets get lost from here on: when it drops the connection, and when it answers
    // the dying proxy's FIN. The node's conntrack still holds the connection as established or
    // closing, an entry a new SYN cannot reopen (only closed ones can be).
    await nsExec(lab!.pod, 'iptables', ['-I', 'OUTPUT', '-p', 'tcp', '--sport', '40080', '--tcp-flags', 'RST', 'RST', '-j', 'DROP']);
    await held.abort();
    for (const p of proxies) await sigkill(p);
    const next = await started(['--proxy-port-range', range]);
    await waitFor(async () => (await proxyPorts())['default/echo:tcp'] !== null, 'the TCP proxy port');

    expect(await nsRequest(lab!.pod, 'tcp', S.echoIP, S.tcpPort, 'again', 3000, 40080)).toBe('backend:again');
    const logged = next.stdout().split('\n').filter((l) => l.includes('deleted stale conntrack entries')).map((l) => JSON.parse(l) as { protocol: string; portal: string; staleTarget: string });
    expect(logged).toContainEqual(expect.objectContaining({ protocol: 'TCP', portal: `${S.echoIP}:${S.tcpPort}`, staleTarget: `${LAB.nodePodSide}:${oldPort}` }));
  }, 60_000);
});
