import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import type { CommandRunner } from '../../src/io/portal/command-runner.js';
import { processRunner } from '../../src/io/portal/command-runner.js';
import { expect, it } from 'vitest';
import { waitFor } from './net.js';
import { endpointSlice, list, service } from './objects.js';

/**
 * Network namespaces for the portal tests. Everything happens inside namespaces the test creates
 * (names carry the test's pid) and removes; the host's own namespace is never touched, and every
 * address used is one assigned here.
 */

function probe(cmd: string, args: string[]): boolean {
  try {
    execFileSync(cmd, args, { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** Why namespace tests cannot run here, or undefined when they can. Computed once. */
export const netnsSkipReason: string | undefined = (() => {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'needs root (creates network namespaces); CI runs it as root';
  if (!probe('ip', ['netns', 'list'])) return '`ip netns` is unavailable (install iproute2)';
  return undefined;
})();

/** Why iptables tests cannot run here (besides netnsSkipReason). */
export const iptablesSkipReason: string | undefined = netnsSkipReason ?? (probe('iptables-restore', ['--version']) && probe('iptables-save', ['--version']) ? undefined : 'iptables-restore/iptables-save are not installed (apt-get install iptables)');

/** Say once, on stderr, that a file's namespace tests are skipped and why. */
/** Why the conntrack tests cannot run here (they need the iptables tools too), or undefined. */
export const conntrackSkipReason: string | undefined = iptablesSkipReason ?? (probe('conntrack', ['--version']) ? undefined : 'conntrack is not installed (apt-get install conntrack)');

export function reportSkip(file: string, reason: string | undefined): void {
  if (reason) process.stderr.write(`${file}: namespace tests SKIPPED: ${reason}\n`);
}

export interface ExecResult {
  stdout: string;
  stderr: string;
}

/** Runs `cmd args` inside namespace `ns`; rejects with stderr in the message. */
export function nsExec(ns: string, cmd: string, args: string[], opts: { input?: string; timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const child = execFile('ip', ['netns', 'exec', ns, cmd, ...args], { timeout: opts.timeoutMs ?? 10_000, env: opts.env ?? process.env, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`[${ns}] ${cmd} ${args.join(' ')}: ${stderr.trim() || err.message}`));
      else resolve({ stdout, stderr });
    });
    // A command that does not read its stdin must not fail the test with EPIPE.
    child.stdin?.on('error', () => {});
    child.stdin?.end(opts.input ?? '');
  });
}

/** A CommandRunner whose commands run inside `ns`: the real portals, programming a namespace. */
export function nsRunner(ns: string): CommandRunner {
  return {
    run: (cmd, args, input) => processRunner.run('ip', ['netns', 'exec', ns, cmd, ...args], input),
    runSync: (cmd, args, input) => processRunner.runSync('ip', ['netns', 'exec', ns, cmd, ...args], input),
  };
}

/**
 * The lab: a node with three neighbours, each on its own veth pair.
 *   pod      10.200.1.2  <->  10.200.1.1  node   (pod's default route: the node)
 *   outside  10.200.2.2  <->  10.200.2.1  node   (node's default route: outside; outside routes
 *                                                 the externalIP range 10.200.100.0/24 via node)
 *   backend  10.200.3.2  <->  10.200.3.1  node   (backend's default route: the node)
 * The node does not forward (ip_forward stays 0 in a new namespace), so a pod reaches the
 * backend only through the proxy.
 */
export const LAB = {
  nodePodSide: '10.200.1.1',
  pod: '10.200.1.2',
  nodeOutsideSide: '10.200.2.1',
  outside: '10.200.2.2',
  nodeBackendSide: '10.200.3.1',
  backend: '10.200.3.2',
  externalRange: '10.200.100.0/24',
} as const;

export interface Lab {
  node: string;
  pod: string;
  backend: string;
  outside: string;
  all: string[];
  destroy(): Promise<void>;
}

export async function createLab(tag: string): Promise<Lab> {
  const base = `kup-${process.pid}-${tag}`;
  const lab: Lab = {
    node: `${base}-node`,
    pod: `${base}-pod`,
    backend: `${base}-be`,
    outside: `${base}-out`,
    all: [],
    destroy: async () => {
      for (const ns of lab.all) await deleteNamespace(ns);
    },
  };
  try {
    for (const ns of [lab.node, lab.pod, lab.backend, lab.outside]) {
      await run('ip', ['netns', 'add', ns]);
      lab.all.push(ns);
      await nsExec(ns, 'ip', ['link', 'set', 'lo', 'up']);
    }
    const links: Array<[string, string, string, string]> = [
      // peer namespace, node-side name, node-side address, peer address
      [lab.pod, 'to-pod', LAB.nodePodSide, LAB.pod],
      [lab.outside, 'to-out', LAB.nodeOutsideSide, LAB.outside],
      [lab.backend, 'to-be', LAB.nodeBackendSide, LAB.backend],
    ];
    for (const [peer, name, nodeAddr, peerAddr] of links) {
      // Created inside the node's namespace with the peer end placed straight into the other
      // one: no interface ever appears in the host's namespace.
      await nsExec(lab.node, 'ip', ['link', 'add', name, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', peer]);
      await nsExec(lab.node, 'ip', ['addr', 'add', `${nodeAddr}/24`, 'dev', name]);
      await nsExec(lab.node, 'ip', ['link', 'set', name, 'up']);
      await nsExec(peer, 'ip', ['addr', 'add', `${peerAddr}/24`, 'dev', 'eth0']);
      await nsExec(peer, 'ip', ['link', 'set', 'eth0', 'up']);
    }
    await nsExec(lab.pod, 'ip', ['route', 'add', 'default', 'via', LAB.nodePodSide]);
    await nsExec(lab.backend, 'ip', ['route', 'add', 'default', 'via', LAB.nodeBackendSide]);
    await nsExec(lab.node, 'ip', ['route', 'add', 'default', 'via', LAB.outside]);
    await nsExec(lab.outside, 'ip', ['route', 'add', LAB.externalRange, 'via', LAB.nodeOutsideSide]);
    // IPv6 link-local addresses finish duplicate address detection a moment after the links come
    // up, and their local routes appear only then: wait, so before/after snapshots compare.
    await settleAddresses(lab.node);
  } catch (err) {
    await lab.destroy();
    throw err;
  }
  return lab;
}

async function settleAddresses(ns: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { stdout } = await nsExec(ns, 'ip', ['-6', 'addr', 'show', 'tentative']);
    if (stdout.trim() === '') return;
    if (Date.now() > deadline) throw new Error(`addresses in ${ns} still tentative after ${timeoutMs} ms:\n${stdout}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function deleteNamespace(ns: string): Promise<void> {
  try {
    await run('ip', ['netns', 'del', ns]);
  } catch {
    // already gone
  }
}

/** Runs a command in the test's own namespace (only `ip netns add/del` use it). */
export function run(cmd: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { timeout: 10_000 }, (err, _out, stderr) => (err ? reject(new Error(`${cmd} ${args.join(' ')}: ${stderr.trim() || err.message}`)) : resolve()));
  });
}

/**
 * A backend in `ns`: TCP echo on `tcpPort` and UDP echo on `udpPort`, each reply prefixed with
 * `name:`. Resolves once both listen; `stop()` kills exactly this process.
 */
export async function startBackend(ns: string, host: string, tcpPort: number, udpPort: number, name: string): Promise<{ child: ChildProcess; stop(): void }> {
  const script = `
    const net = require('node:net'), dgram = require('node:dgram');
    const [host, tcpPort, udpPort, name] = process.argv.slice(1);
    const tcp = net.createServer({ allowHalfOpen: true }, (s) => { s.on('error', () => s.destroy()); s.write(name + ':'); s.pipe(s); });
    const udp = dgram.createSocket('udp4');
    udp.on('message', (m, r) => udp.send(Buffer.concat([Buffer.from(name + ':'), m]), r.port, r.address));
    let up = 0; const ready = () => { if (++up === 2) process.stdout.write('ready\\n'); };
    tcp.listen(Number(tcpPort), host, ready); udp.bind(Number(udpPort), host, ready);`;
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', script, host, String(tcpPort), String(udpPort), name], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`backend in ${ns} did not start: ${err}`)), 10_000);
    child.stdout?.on('data', (d: Buffer) => {
      if (d.toString().includes('ready')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`backend in ${ns} exited ${code}: ${err}`));
    });
  });
  return {
    child,
    stop: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
}

const CLIENT = `
  const net = require('node:net'), dgram = require('node:dgram');
  const [proto, host, port, payload, timeout, localPort] = process.argv.slice(1);
  const fail = (m) => { process.stderr.write(m + '\\n'); process.exit(1); };
  setTimeout(() => fail('TIMEOUT'), Number(timeout)).unref();
  if (proto === 'tcp') {
    const s = net.connect({ host, port: Number(port), allowHalfOpen: true, ...(localPort ? { localPort: Number(localPort) } : {}) });
    const chunks = [];
    s.on('connect', () => s.end(payload));
    s.on('data', (d) => chunks.push(d));
    s.on('end', () => { process.stdout.write(Buffer.concat(chunks)); process.exit(0); });
    s.on('error', (e) => fail(e.code || e.message));
  } else {
    const s = dgram.createSocket('udp4');
    s.on('error', (e) => fail(e.code || e.message));
    s.connect(Number(port), host, () => s.send(payload));
    s.on('message', (m) => { process.stdout.write(m); process.exit(0); });
  }`;

/**
 * One request from inside `ns`: TCP (connect, send, half-close, read to the end) or UDP (one
 * datagram on a connected socket, one reply). Resolves with the reply; rejects with the error
 * code (ECONNREFUSED, TIMEOUT, ...) as the message. `localPort` (TCP): connect from that port.
 */
export async function nsRequest(ns: string, proto: 'tcp' | 'udp', host: string, port: number, payload: string, timeoutMs = 1500, localPort?: number): Promise<string> {
  try {
    const args = ['-e', CLIENT, proto, host, String(port), payload, String(timeoutMs), ...(localPort === undefined ? [] : [String(localPort)])];
    const { stdout } = await nsExec(ns, process.execPath, args, { timeoutMs: timeoutMs + 5000 });
    return stdout;
  } catch (err) {
    const m = /: (\S+)\s*$/.exec((err as Error).message);
    throw new Error(m?.[1] ?? (err as Error).message);
  }
}

/** The node's state as `--cleanup` must leave it: rules, routes and addresses, normalized. */
export async function nodeSnapshot(ns: string): Promise<{ iptables: string; ip6tables: string; routes: string; addresses: string }> {
  const save = async (cmd: string): Promise<string> => {
    const { stdout } = await nsExec(ns, cmd, []);
    return stdout
      .split('\n')
      .filter((l) => !l.startsWith('#'))
      .map((l) => l.replace(/\[\d+:\d+\]/, '[0:0]'))
      .join('\n');
  };
  const routes: string[] = [];
  for (const family of ['-4', '-6']) {
    const { stdout } = await nsExec(ns, 'ip', ['-j', family, 'route', 'show', 'table', 'all']);
    for (const r of JSON.parse(stdout || '[]') as Array<Record<string, unknown>>) {
      routes.push([r.type, r.dst, r.dev, r.table, r.protocol, r.gateway].map((x) => String(x ?? '')).join(' '));
    }
  }
  const { stdout: addrJson } = await nsExec(ns, 'ip', ['-j', 'addr', 'show']);
  const addresses: string[] = [];
  for (const link of JSON.parse(addrJson || '[]') as Array<{ ifname: string; addr_info?: Array<{ local: string; prefixlen: number }> }>) {
    addresses.push(`link ${link.ifname}`);
    for (const a of link.addr_info ?? []) addresses.push(`${link.ifname} ${a.local}/${a.prefixlen}`);
  }
  return { iptables: await save('iptables-save'), ip6tables: await save('ip6tables-save'), routes: routes.sort().join('\n'), addresses: addresses.sort().join('\n') };
}

/**
 * The Services the namespace tests serve, all backed by the lab's backend:
 * - default/echo: ClusterIP 10.96.0.10, TCP 80 -> 8080 and UDP 53 -> 8053, node ports 30080
 *   (TCP) and 30053 (UDP), externalIP 10.200.100.10;
 * - default/gone (when `withGone`): ClusterIP 10.96.0.20, TCP 80 -> 8080, removed by the tests.
 */
export const SERVICES = {
  echoIP: '10.96.0.10',
  externalIP: '10.200.100.10',
  goneIP: '10.96.0.20',
  tcpPort: 80,
  udpPort: 53,
  tcpNodePort: 30080,
  udpNodePort: 30053,
  backendTcp: 8080,
  backendUdp: 8053,
} as const;

export function labState(withGone: boolean): string {
  const s = SERVICES;
  const items: unknown[] = [
    service({
      name: 'echo',
      clusterIP: s.echoIP,
      externalIPs: [s.externalIP],
      ports: [
        { name: 'tcp', port: s.tcpPort, targetPort: s.backendTcp, nodePort: s.tcpNodePort },
        { name: 'udp', port: s.udpPort, protocol: 'UDP', targetPort: s.backendUdp, nodePort: s.udpNodePort },
      ],
    }),
    endpointSlice({
      service: 'echo',
      ports: [
        { name: 'tcp', port: s.backendTcp },
        { name: 'udp', port: s.backendUdp, protocol: 'UDP' },
      ],
      endpoints: [{ ip: LAB.backend }],
    }),
  ];
  if (withGone) {
    items.push(
      service({ name: 'gone', clusterIP: s.goneIP, ports: [{ name: 'http', port: s.tcpPort, targetPort: s.backendTcp }] }),
      endpointSlice({ service: 'gone', ports: [{ name: 'http', port: s.backendTcp }], endpoints: [{ ip: LAB.backend }] }),
    );
  }
  return list(items);
}

/** Someone else's rules on the node, which the proxy must leave alone. */
export const FOREIGN_RULES = {
  nat: '-A POSTROUTING -s 10.200.1.0/24 -m comment --comment "lab: someone else" -j MASQUERADE',
  filter: '-A INPUT -i lo -m comment --comment "lab: someone else" -j ACCEPT',
};

export async function addForeignRules(ns: string): Promise<void> {
  await nsExec(ns, 'iptables-restore', ['--noflush'], { input: `*nat\n${FOREIGN_RULES.nat}\nCOMMIT\n*filter\n${FOREIGN_RULES.filter}\nCOMMIT\n` });
}

/** GET a path of the admin server inside `ns` (the proxy's metrics address, 127.0.0.1:10249). */
export async function nsAdminGet(ns: string, path: string): Promise<unknown> {
  const script = `fetch('http://127.0.0.1:10249${path}').then((r) => r.text()).then((t) => process.stdout.write(t), (e) => { process.stderr.write(String(e)); process.exit(1); });`;
  const { stdout } = await nsExec(ns, process.execPath, ['-e', script]);
  return JSON.parse(stdout) as unknown;
}

/** Whether `host:port` can be bound (TCP) inside `ns` right now: 'free', or the error code. */
export async function nsTryBind(ns: string, host: string, port: number): Promise<string> {
  const script = `const s = require('node:net').createServer(); s.on('error', (e) => { process.stdout.write(e.code); process.exit(0); }); s.listen(${port}, '${host}', () => { process.stdout.write('free'); s.close(); });`;
  return (await nsExec(ns, process.execPath, ['-e', script])).stdout;
}

/** Another process holding TCP `host:port` inside `ns` until `stop()` (which kills exactly it). */
export async function nsHoldPort(ns: string, host: string, port: number): Promise<{ stop(): Promise<void> }> {
  const script = `require('node:net').createServer().listen(${port}, '${host}', () => process.stdout.write('held\\n'));`;
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`holder of ${host}:${port} did not start: ${err}`)), 10_000);
    child.stdout?.on('data', () => {
      clearTimeout(timer);
      resolve();
    });
    void exited.then(() => {
      clearTimeout(timer);
      reject(new Error(`holder of ${host}:${port} exited: ${err}`));
    });
  });
  return {
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}

/**
 * What both portal modes must do for pods, the node and outside hosts: the same assertions,
 * registered inside each mode's describe once its lab is up (`getLab` reads it lazily).
 */
export function reachabilityTests(getLab: () => Lab | undefined): void {
  const S = SERVICES;
  const lab = (): Lab => {
    const l = getLab();
    if (!l) throw new Error('the lab was not created');
    return l;
  };

  it('a pod reaches a ClusterIP over TCP and UDP, through the proxy to the backend', async () => {
    expect(await waitFor(() => nsRequest(lab().pod, 'tcp', S.echoIP, S.tcpPort, 'hello'), 'TCP from the pod')).toBe('backend:hello');
    expect(await nsRequest(lab().pod, 'udp', S.echoIP, S.udpPort, 'ping')).toBe('backend:ping');
    // Only through the proxy: the node does not forward, so the backend itself is out of reach.
    await expect(nsRequest(lab().pod, 'tcp', LAB.backend, S.backendTcp, 'direct', 800)).rejects.toThrow();
  });

  it('the node itself reaches the ClusterIP (TCP and UDP) and its own node ports', async () => {
    expect(await nsRequest(lab().node, 'tcp', S.echoIP, S.tcpPort, 'node')).toBe('backend:node');
    expect(await nsRequest(lab().node, 'udp', S.echoIP, S.udpPort, 'node-udp')).toBe('backend:node-udp');
    expect(await nsRequest(lab().node, 'tcp', '127.0.0.1', S.tcpNodePort, 'lo')).toBe('backend:lo');
    // UDP answers must come from the address the client sent to, whichever of the node's it was.
    expect(await nsRequest(lab().node, 'udp', '127.0.0.1', S.udpNodePort, 'lo-udp')).toBe('backend:lo-udp');
    expect(await nsRequest(lab().node, 'udp', LAB.nodePodSide, S.udpNodePort, 'pod-side-udp')).toBe('backend:pod-side-udp');
    expect(await nsRequest(lab().node, 'udp', LAB.nodeOutsideSide, S.udpNodePort, 'outside-side-udp')).toBe('backend:outside-side-udp');
  });

  it('the outside host reaches a NodePort (TCP and UDP) and an externalIP', async () => {
    expect(await nsRequest(lab().outside, 'tcp', LAB.nodeOutsideSide, S.tcpNodePort, 'np')).toBe('backend:np');
    expect(await nsRequest(lab().outside, 'udp', LAB.nodeOutsideSide, S.udpNodePort, 'np-udp')).toBe('backend:np-udp');
    expect(await nsRequest(lab().outside, 'tcp', S.externalIP, S.tcpPort, 'ext')).toBe('backend:ext');
    expect(await nsRequest(lab().outside, 'udp', S.externalIP, S.udpPort, 'ext-udp')).toBe('backend:ext-udp');
  });
}

const UDP_FLOW = `
  const dgram = require('node:dgram');
  const [host, port, localPort, intervalMs, max] = process.argv.slice(1).map((a, i) => (i === 0 ? a : Number(a)));
  let phase = 'before';
  let seq = 0;
  process.stdin.on('data', (d) => { phase = d.toString().trim().split('\\n').pop(); });
  const s = dgram.createSocket('udp4');
  // An ICMP error on the connected socket (nothing listened) is part of the story: keep sending.
  s.on('error', () => {});
  s.on('message', (m) => process.stdout.write(m + '\\n'));
  const tick = () => {
    if (seq >= max) process.exit(0);
    s.send(phase + ':' + ++seq, () => {});
    setTimeout(tick, intervalMs);
  };
  s.bind(localPort, () => s.connect(port, host, tick));`;

/** One client's steady UDP flow, from one fixed source port: what keeps a conntrack entry alive. */
export interface UdpFlow {
  /** Replies seen so far to queries sent in `phase`. */
  replies(phase: string): number;
  /** Queries sent from now on carry `phase` (the backend echoes it back). */
  setPhase(phase: string): void;
  waitForReply(phase: string, timeoutMs: number): Promise<void>;
  stop(): Promise<void>;
}

/**
 * A UDP client in `ns` sending a query to `host:port` from `localPort` every `intervalMs`, at most
 * `max` queries (so at most intervalMs * max ms). Each query is `<phase>:<seq>`; each reply line is
 * counted by its phase, so replies to queries sent after setPhase() are told from earlier ones.
 */
export async function nsUdpFlow(ns: string, host: string, port: number, localPort: number, opts: { intervalMs?: number; max?: number } = {}): Promise<UdpFlow> {
  const intervalMs = opts.intervalMs ?? 50;
  const max = opts.max ?? 400;
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', UDP_FLOW, host, String(port), String(localPort), String(intervalMs), String(max)], { stdio: ['pipe', 'pipe', 'pipe'] });
  child.stdin?.on('error', () => {});
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const counts = new Map<string, number>();
  const waiters: Array<() => void> = [];
  let partial = '';
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  child.stdout?.on('data', (d: Buffer) => {
    const lines = (partial + d.toString()).split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines) {
      const phase = /^[^:]*:([^:]*):/.exec(line)?.[1];
      if (phase !== undefined) counts.set(phase, (counts.get(phase) ?? 0) + 1);
    }
    for (const w of waiters.splice(0)) w();
  });
  const flow: UdpFlow = {
    replies: (phase) => counts.get(phase) ?? 0,
    setPhase: (phase) => {
      child.stdin?.write(`${phase}\n`);
    },
    waitForReply: (phase, timeoutMs) =>
      new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no UDP reply in phase "${phase}" within ${timeoutMs}ms (replies so far: ${JSON.stringify(Object.fromEntries(counts))}) ${err}`)), timeoutMs);
        const check = (): void => {
          if (flow.replies(phase) > 0) {
            clearTimeout(timer);
            resolve();
          } else if (child.exitCode !== null || child.signalCode !== null) {
            clearTimeout(timer);
            reject(new Error(`the UDP flow ended before a reply in phase "${phase}" ${err}`));
          } else waiters.push(check);
        };
        check();
      }),
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
  return flow;
}
