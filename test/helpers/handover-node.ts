import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runCli, type Spawned } from './cli.js';
import { nsExec, run, startBackend } from './netns.js';
import { endpointSlice, list, service } from './objects.js';

/**
 * A node for the hand-over tests: a network namespace of the test's own (its name carries the
 * pid) with the loopback up, an echo backend on 127.0.0.1 (replies prefixed `be:`), a state file
 * with one Service (ClusterIP 10.96.0.50: TCP 80 -> 18080, UDP 53 -> 18053; the loopback portal
 * serves it on 127.96.0.50), and every proxy process started through it, so that destroy() kills
 * each by its pid and removes the namespace and the files, also after a failure.
 */
export const HO = {
  clusterIP: '10.96.0.50',
  loopbackIP: '127.96.0.50',
  tcpPort: 80,
  udpPort: 53,
  tcpNodePort: 30180,
  backendTcp: 18080,
  backendUdp: 18053,
} as const;

export interface HandoverNode {
  ns: string;
  dir: string;
  socket: string;
  stateFile: string;
  /**
   * Starts a proxy in the namespace with the common flags, then `extra`. `source` replaces
   * `--state <the state file>` (a kubeconfig, say); `wrap` runs it through a command (prlimit, say).
   */
  proxy(extra?: string[], source?: string[], wrap?: string[]): Spawned;
  destroy(): Promise<void>;
}

export function handoverState(): string {
  return list([
    service({
      name: 'echo',
      clusterIP: HO.clusterIP,
      ports: [
        { name: 'tcp', port: HO.tcpPort, targetPort: HO.backendTcp, nodePort: HO.tcpNodePort },
        { name: 'udp', port: HO.udpPort, protocol: 'UDP', targetPort: HO.backendUdp },
      ],
    }),
    endpointSlice({
      service: 'echo',
      ports: [
        { name: 'tcp', port: HO.backendTcp },
        { name: 'udp', port: HO.backendUdp, protocol: 'UDP' },
      ],
      endpoints: [{ ip: '127.0.0.1' }],
    }),
  ]);
}

export async function createHandoverNode(tag: string, opts: { portal?: string } = {}): Promise<HandoverNode> {
  const ns = `kup-${process.pid}-${tag}`;
  const dir = await mkdtemp(join(tmpdir(), `kup-${tag}-`));
  const procs: Spawned[] = [];
  let backend: Awaited<ReturnType<typeof startBackend>> | undefined;
  const node: HandoverNode = {
    ns,
    dir,
    socket: join(dir, 'handover.sock'),
    stateFile: join(dir, 'state.json'),
    proxy(extra = [], source = ['--state', node.stateFile], wrap = []) {
      const args = ['--portal', opts.portal ?? 'loopback', ...source, '--handover-socket', node.socket, '--shutdown-grace-period', '10m', '--iptables-min-sync-period', '50ms', ...extra];
      const p = runCli(args, { prefix: ['ip', 'netns', 'exec', ns, ...wrap] });
      procs.push(p);
      return p;
    },
    async destroy() {
      for (const p of procs) p.kill();
      await Promise.all(procs.map((p) => p.exited));
      backend?.stop();
      try {
        await run('ip', ['netns', 'del', ns]);
      } catch {
        // already gone
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
  try {
    await run('ip', ['netns', 'add', ns]);
    await nsExec(ns, 'ip', ['link', 'set', 'lo', 'up']);
    // A default route (into a veth pair whose both ends stay in this namespace), so that the node's
    // own packets to a ClusterIP are routed, and the iptables portal's nat OUTPUT rules see them.
    await nsExec(ns, 'ip', ['link', 'add', 'ho0', 'type', 'veth', 'peer', 'name', 'ho1']);
    await nsExec(ns, 'ip', ['addr', 'add', '10.201.0.1/24', 'dev', 'ho0']);
    await nsExec(ns, 'ip', ['link', 'set', 'ho1', 'up']);
    await nsExec(ns, 'ip', ['link', 'set', 'ho0', 'up']);
    await nsExec(ns, 'ip', ['route', 'add', 'default', 'dev', 'ho0']);
    await writeFile(node.stateFile, handoverState());
    backend = await startBackend(ns, '127.0.0.1', HO.backendTcp, HO.backendUdp, 'be');
  } catch (err) {
    await node.destroy();
    throw err;
  }
  return node;
}

/** The pid the proxy logged in its first JSON line (pino's `pid`). */
export function loggedPid(p: Spawned): number | undefined {
  const first = p.stdout().split('\n').find((l) => l.startsWith('{'));
  return first === undefined ? undefined : (JSON.parse(first) as { pid?: number }).pid;
}
