import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, type Spawned } from './helpers/cli.js';
import { waitFor } from './helpers/net.js';
import { LAB, SERVICES as S, createLab, iptablesSkipReason, labState, netnsSkipReason, nsAdminGet, nsExec, nsRequest, reportSkip, startBackend, type Lab } from './helpers/netns.js';

/**
 * `--workers 2` on a real (namespaced) node, with each portal that sends node traffic to the
 * proxy: iptables (REDIRECT to one proxy port per service port, which both workers listen on) and
 * bind (the Service addresses made local, which both workers listen on). The kernel spreads the
 * connections over the workers.
 */
reportSkip('workers-netns.test.ts', iptablesSkipReason ?? netnsSkipReason);

interface Figures {
  worker: number;
  pid: number;
  state: string;
  connectionsAccepted: number;
  udpDatagrams: number;
}

/** `count` TCP requests from inside `ns`, one connection each: the replies, in order. */
async function manyRequests(ns: string, host: string, port: number, count: number): Promise<string[]> {
  const script = `
    const net = require('node:net');
    const [host, port, count] = process.argv.slice(1);
    setTimeout(() => { process.stderr.write('TIMEOUT'); process.exit(1); }, 20000).unref();
    (async () => {
      const out = [];
      for (let i = 0; i < Number(count); i++) {
        out.push(await new Promise((resolve, reject) => {
          const chunks = [];
          const s = net.connect({ host, port: Number(port), allowHalfOpen: true });
          s.on('connect', () => s.end('x' + i));
          s.on('data', (d) => chunks.push(d));
          s.on('end', () => { s.destroy(); resolve(Buffer.concat(chunks).toString()); });
          s.on('error', reject);
        }));
      }
      process.stdout.write(JSON.stringify(out));
    })().catch((e) => { process.stderr.write(String(e)); process.exit(1); });`;
  const { stdout } = await nsExec(ns, process.execPath, ['-e', script, host, String(port), String(count)], { timeoutMs: 30_000 });
  return JSON.parse(stdout) as string[];
}

const PORTALS = [
  { portal: 'iptables', skip: iptablesSkipReason },
  { portal: 'bind', skip: netnsSkipReason },
] as const;

describe.each(PORTALS)('--workers 2 --portal $portal in network namespaces', ({ portal, skip }) => {
  if (skip !== undefined) {
    it.skip(`[skipped: ${skip}]`, () => undefined);
    return;
  }
  let lab: Lab | undefined;
  let dir: string;
  let backend: Awaited<ReturnType<typeof startBackend>> | undefined;
  let proxy: Spawned | undefined;

  const workers = async (): Promise<Figures[]> => ((await nsAdminGet(lab!.node, '/workers')) as { workers: Figures[] }).workers;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-netns-workers-'));
    const stateFile = join(dir, 'state.json');
    await writeFile(stateFile, labState(false));
    lab = await createLab(`w${portal}`);
    backend = await startBackend(lab.backend, LAB.backend, S.backendTcp, S.backendUdp, 'backend');
    proxy = runCli(['--portal', portal, '--workers', '2', '--state', stateFile, '--iptables-min-sync-period', '50ms'], { prefix: ['ip', 'netns', 'exec', lab.node] });
    const line = await proxy.waitForLine(/kube-userspace-proxy started/);
    expect(JSON.parse(line)).toMatchObject({ portal, workers: 2 });
    await waitFor(async () => (await workers()).every((w) => w.state === 'ready'), 'both workers to serve');
  }, 60_000);

  afterAll(async () => {
    if (proxy) {
      proxy.child.kill('SIGTERM');
      await proxy.exited;
    }
    backend?.stop();
    if (lab) {
      await nsExec(lab.node, process.execPath, [join(process.cwd(), 'dist/bundle/main.js'), '--portal', portal, '--cleanup']).catch(() => {});
      await lab.destroy();
    }
    await rm(dir, { recursive: true, force: true });
  }, 60_000);

  it('portal traffic from a pod reaches both workers, listening on one socket address each', async () => {
    const status = (await nsAdminGet(lab!.node, '/services')) as { services: Array<{ name: string; proxyPort: number | null; errors: string[] }> };
    const tcp = status.services.find((s) => s.name === 'default/echo:tcp');
    expect(tcp?.errors).toEqual([]);
    // Where the portal sends the ClusterIP's traffic: one proxy port (iptables), or the ClusterIP itself (bind).
    let filter = `src ${S.echoIP}:${S.tcpPort}`;
    if (portal === 'iptables') {
      const rules = (await nsExec(lab!.node, 'iptables-save', ['-t', 'nat'])).stdout;
      const redirected = Number(/--comment "default\/echo:tcp" -m tcp --dport 80 -j REDIRECT --to-ports (\d+)/.exec(rules)?.[1]);
      expect(redirected).toBe(tcp?.proxyPort);
      filter = `sport = :${redirected}`;
    }
    // Both workers listen there.
    const listeners = (await nsExec(lab!.node, 'ss', ['-Hltnp', filter])).stdout.trim().split('\n');
    const pids = new Set(listeners.map((l) => /pid=(\d+)/.exec(l)?.[1]));
    expect(pids).toEqual(new Set((await workers()).map((w) => String(w.pid))));

    const before = await workers();
    const replies = await manyRequests(lab!.pod, S.echoIP, S.tcpPort, 30);
    expect(replies.every((r, i) => r === `backend:x${i}`)).toBe(true);
    const after = await workers();
    expect(after.every((w, i) => w.connectionsAccepted > (before[i]?.connectionsAccepted ?? 0))).toBe(true);
  });

  it('UDP through the portal, and node ports from outside, are served too', async () => {
    expect(await nsRequest(lab!.pod, 'udp', S.echoIP, S.udpPort, 'ping')).toBe('backend:ping');
    expect(await nsRequest(lab!.outside, 'tcp', LAB.nodeOutsideSide, S.tcpNodePort, 'np')).toBe('backend:np');
    expect(await nsRequest(lab!.outside, 'udp', LAB.nodeOutsideSide, S.udpNodePort, 'np-udp')).toBe('backend:np-udp');
  });
});
