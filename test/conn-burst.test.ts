import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseNetstat } from '../bench/lib/parse.js';
import { runCli, type Spawned } from './helpers/cli.js';
import { waitFor } from './helpers/net.js';
import { netnsSkipReason, nsExec, reportSkip, run, startBackend } from './helpers/netns.js';
import { endpointSlice, list, service } from './helpers/objects.js';

/**
 * A burst of 1,000 new connections to a Service, made while the proxy cannot accept (stopped
 * with SIGSTOP, as a proxy busy with a 10,000-Service sync is for a moment), is held in the
 * listening socket's accept queue and served once the proxy goes on: no SYN is dropped, so none
 * waits a second to be sent again. The proxy is the CLI, in a network namespace of the test's
 * own, so the kernel's TcpExt counters are this test's alone.
 */

reportSkip('conn-burst.test.ts', netnsSkipReason);

const NS = `kup-${process.pid}-burst`;
const CLUSTER_IP = '10.96.0.10';
/** Where --portal loopback serves CLUSTER_IP. */
const SERVICE_HOST = '127.96.0.10';
const PORT = 8080;
const BACKEND = '127.0.0.2';
const BACKEND_PORT = 9090;
const BURST = 1000;

/** Opens `n` connections to host:port in one loop, writes `x` on each, prints `answered N` once every echo is back (or after 30 s). */
const CLIENT = `
  const net = require('node:net');
  const [host, port, n] = [process.argv[1], Number(process.argv[2]), Number(process.argv[3])];
  let answered = 0;
  for (let i = 0; i < n; i++) {
    const s = net.connect({ host, port });
    let got = '';
    s.on('connect', () => s.write('x'));
    s.on('data', (d) => {
      got += d;
      if (!got.endsWith('x')) return;
      s.destroy();
      if (++answered === n) { console.log('answered ' + answered); process.exit(0); }
    });
    s.on('error', () => {});
  }
  console.log('issued');
  setTimeout(() => { console.log('answered ' + answered); process.exit(1); }, 30000).unref();
  setInterval(() => {}, 1000);
`;

describe.skipIf(netnsSkipReason !== undefined)(`a burst of ${BURST} connections${netnsSkipReason ? ` [skipped: ${netnsSkipReason}]` : ''}`, () => {
  let dir: string;
  let made = false;
  let proxy: Spawned | undefined;
  let backend: Awaited<ReturnType<typeof startBackend>> | undefined;
  let client: ChildProcess | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-burst-'));
    const stateFile = join(dir, 'state.json');
    await writeFile(stateFile, list([
      service({ name: 'web', clusterIP: CLUSTER_IP, ports: [{ name: 'http', port: PORT, targetPort: BACKEND_PORT }] }),
      endpointSlice({ service: 'web', ports: [{ name: 'http', port: BACKEND_PORT }], endpoints: [{ ip: BACKEND }] }),
    ]));
    await run('ip', ['netns', 'add', NS]);
    made = true;
    await nsExec(NS, 'ip', ['link', 'set', 'lo', 'up']);
    backend = await startBackend(NS, BACKEND, BACKEND_PORT, BACKEND_PORT, 'be');
    proxy = runCli(['--state', stateFile, '--portal', 'loopback'], { prefix: ['ip', 'netns', 'exec', NS] });
    await proxy.waitForLine(/kube-userspace-proxy started/);
  }, 60_000);

  afterAll(async () => {
    client?.kill('SIGKILL');
    if (proxy?.child.pid !== undefined) proxy.child.kill('SIGCONT');
    proxy?.kill();
    backend?.stop();
    if (made) await run('ip', ['netns', 'del', NS]).catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  }, 30_000);

  async function counters(): Promise<Record<string, number>> {
    return parseNetstat((await nsExec(NS, 'cat', ['/proc/net/netstat'])).stdout);
  }

  /** Connections waiting in the proxy's accept queue for the Service (Recv-Q of the listener). */
  async function queued(): Promise<number> {
    const { stdout } = await nsExec(NS, 'ss', ['-Hltn', `src ${SERVICE_HOST}:${PORT}`]);
    const [, recvQ] = stdout.trim().split(/\s+/);
    return Number(recvQ);
  }

  function state(pid: number): string {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
  }

  it('is queued whole while the proxy cannot accept, and served without a SYN sent twice', async () => {
    const pid = proxy?.child.pid as number;
    const before = await counters();
    proxy?.child.kill('SIGSTOP');
    await waitFor(() => state(pid) === 'T', 'the proxy to stop');

    const c = spawn('ip', ['netns', 'exec', NS, process.execPath, '-e', CLIENT, SERVICE_HOST, String(PORT), String(BURST)], { stdio: ['ignore', 'pipe', 'pipe'] });
    client = c;
    let out = '';
    c.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => c.on('exit', resolve));
    await waitFor(() => out.includes('issued'), 'the client to make its connect() calls');
    // Either every connection is in the queue, or the queue overflowed: both are seen, neither waited for blindly.
    await waitFor(async () => (await queued()) === BURST || ((await counters())['TcpExt.ListenOverflows'] ?? 0) > (before['TcpExt.ListenOverflows'] ?? 0), 'the burst to be queued (or to overflow)', 20_000);
    const held = await queued();

    proxy?.child.kill('SIGCONT');
    expect(await exited, out).toBe(0);
    const after = await counters();
    const delta = (k: string): number => (after[k] ?? 0) - (before[k] ?? 0);
    expect({ held, answered: /answered (\d+)/.exec(out)?.[1] }).toEqual({ held: BURST, answered: String(BURST) });
    expect({ overflows: delta('TcpExt.ListenOverflows'), drops: delta('TcpExt.ListenDrops'), synRetransmits: delta('TcpExt.TCPSynRetrans') }).toEqual({ overflows: 0, drops: 0, synRetransmits: 0 });
  }, 60_000);
});
