import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A Service with three endpoints, one of them blackholed, inside a network namespace this process
 * creates (its name carries the pid) and removes: the measured setting of passive health, shared
 * by its bench (bench/outlier-latency.ts) and its test (test/passive-health-netns.test.ts).
 *
 * The endpoints are three addresses on the namespace's loopback, served by one backend process
 * that names the address a connection reached. Blackholed means an iptables DROP of the SYNs to
 * that address, in the namespace's INPUT chain: a dial hangs until its timeout, as it does to a
 * node that vanished. The proxy runs in the namespace too (the built CLI, --portal loopback), and
 * is reached on its node port at 127.0.0.1.
 */

export const ENDPOINTS = ['10.203.0.1', '10.203.0.2', '10.203.0.3'] as const;
export const BLACKHOLED = '10.203.0.3';
export const BACKEND_PORT = 8080;
export const NODE_PORT = 30080;
const SERVICE_IP = '10.96.203.1';

export interface BlackholeLab {
  ns: string;
  stateFile: string;
  /** Drop, or stop dropping, the SYNs to BLACKHOLED. */
  blackhole(on: boolean): Promise<void>;
  destroy(): Promise<void>;
}

export function nsExec(ns: string, cmd: string, args: string[], opts: { input?: string; timeoutMs?: number } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile('ip', ['netns', 'exec', ns, cmd, ...args], { timeout: opts.timeoutMs ?? 10_000, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`[${ns}] ${cmd} ${args.join(' ')}: ${stderr.trim() || err.message}`));
      else resolve(stdout);
    });
    child.stdin?.on('error', () => {});
    child.stdin?.end(opts.input ?? '');
  });
}

function run(cmd: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { timeout: 10_000 }, (err, _out, stderr) => (err ? reject(new Error(`${cmd} ${args.join(' ')}: ${stderr.trim() || err.message}`)) : resolve()));
  });
}

const BACKEND = `
  const net = require('node:net');
  net.createServer({ allowHalfOpen: true }, (s) => { s.on('error', () => s.destroy()); s.write(s.localAddress + ':'); s.pipe(s); })
    .listen(${BACKEND_PORT}, '0.0.0.0', () => process.stdout.write('ready\\n'));`;

function state(): string {
  const items = [
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: 'web', namespace: 'default' },
      spec: { type: 'NodePort', clusterIP: SERVICE_IP, clusterIPs: [SERVICE_IP], ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: BACKEND_PORT, nodePort: NODE_PORT }] },
    },
    {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: { name: 'web-abcde', namespace: 'default', labels: { 'kubernetes.io/service-name': 'web' } },
      addressType: 'IPv4',
      ports: [{ name: 'http', protocol: 'TCP', port: BACKEND_PORT }],
      endpoints: ENDPOINTS.map((ip) => ({ addresses: [ip], conditions: { ready: true } })),
    },
  ];
  return JSON.stringify({ apiVersion: 'v1', kind: 'List', items });
}

export async function createBlackholeLab(tag: string): Promise<BlackholeLab> {
  const ns = `kup-${process.pid}-${tag}`;
  const dir = await mkdtemp(join(tmpdir(), `kup-${tag}-`));
  const stateFile = join(dir, 'state.json');
  let backend: ChildProcess | undefined;
  let created = false;
  const destroy = async (): Promise<void> => {
    if (backend && backend.exitCode === null && backend.signalCode === null) backend.kill('SIGKILL');
    if (created) await run('ip', ['netns', 'del', ns]).catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await writeFile(stateFile, state());
    await run('ip', ['netns', 'add', ns]);
    created = true;
    await nsExec(ns, 'ip', ['link', 'set', 'lo', 'up']);
    for (const ip of ENDPOINTS) await nsExec(ns, 'ip', ['addr', 'add', `${ip}/32`, 'dev', 'lo']);
    backend = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', BACKEND], { stdio: ['ignore', 'pipe', 'pipe'] });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the backend in ${ns} did not start`)), 10_000);
      backend?.stdout?.once('data', () => {
        clearTimeout(timer);
        resolve();
      });
      backend?.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`the backend in ${ns} exited ${code}`));
      });
    });
  } catch (err) {
    await destroy();
    throw err;
  }
  const rule = ['INPUT', '-d', BLACKHOLED, '-p', 'tcp', '--syn', '-j', 'DROP'];
  let blackholed = false;
  return {
    ns,
    stateFile,
    async blackhole(on) {
      if (on === blackholed) return;
      await nsExec(ns, 'iptables', [on ? '-A' : '-D', ...rule]);
      blackholed = on;
    },
    destroy,
  };
}

/**
 * `n` new connections to the node port, one after another, from inside the namespace: for each,
 * the endpoint that served it and the time from connect() to the first byte of the reply (which
 * includes every dial the proxy made for it). Bounded: each connection gives up after 10 s.
 */
const CLIENT = `
  const net = require('node:net');
  const [port, n] = process.argv.slice(1).map(Number);
  const out = [];
  const one = () => new Promise((resolve) => {
    const t0 = process.hrtime.bigint();
    const s = net.connect(port, '127.0.0.1');
    let first = 0n, reply = '';
    s.setTimeout(10000, () => s.destroy(new Error('timeout')));
    s.on('data', (d) => { if (first === 0n) first = process.hrtime.bigint(); reply += d; });
    s.on('error', (e) => resolve({ ms: -1, served: 'error:' + (e.code || e.message) }));
    s.on('end', () => resolve({ ms: Number(first - t0) / 1e6, served: reply.split(':')[0] }));
    s.end('x');
  });
  (async () => { for (let i = 0; i < n; i++) out.push(await one()); process.stdout.write(JSON.stringify(out)); })();`;

export interface ConnectionSample {
  /** -1 when the connection failed. */
  ms: number;
  /** The endpoint's address, or `error:<code>`. */
  served: string;
}

export async function nsConnections(ns: string, n: number): Promise<ConnectionSample[]> {
  const stdout = await nsExec(ns, process.execPath, ['-e', CLIENT, String(NODE_PORT), String(n)], { timeoutMs: n * 11_000 + 5000 });
  return JSON.parse(stdout) as ConnectionSample[];
}

/** GET a path of the proxy's admin server inside `ns` (127.0.0.1:10249), as text. */
export async function nsAdmin(ns: string, path: string): Promise<string> {
  const script = `fetch('http://127.0.0.1:10249${path}').then((r) => r.text()).then((t) => process.stdout.write(t), (e) => { process.stderr.write(String(e)); process.exit(1); });`;
  return nsExec(ns, process.execPath, ['-e', script]);
}

/** The value of one sample line of a Prometheus text page (the first whose name and labels start so). */
export function metricValue(text: string, prefix: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(prefix));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}
