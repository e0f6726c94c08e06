import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, type Spawned } from './helpers/cli.js';
import { endpointSlice, list, service } from './helpers/objects.js';
import { freePort, waitFor } from './helpers/net.js';
import { connectTo, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * SIGTERM and SIGKILL, with the CLI as a black box: a connection in the middle of a transfer
 * finishes within the grace period; one that outlives it is cut; the process exits 0 either way;
 * a proxy killed with SIGKILL starts again cleanly on the same addresses.
 */

const SVC = '127.96.60.1'; // loopback portal address of ClusterIP 10.96.60.1
let dir: string;
let stateFile: string;
let port: number;
let backend: StagedBackend;
const running: Spawned[] = [];

/** A backend that sends `part1` at once and the rest only when the test says so. */
interface StagedBackend {
  server: Server;
  port: number;
  /** Resolves with each connection the backend accepts, once `part1` is written. */
  nextConnection(): Promise<Socket>;
  close(): Promise<void>;
}

async function stagedBackend(host: string): Promise<StagedBackend> {
  const sockets = new Set<Socket>();
  const waiting: Array<(s: Socket) => void> = [];
  const ready: Socket[] = [];
  const server = createServer((s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    s.write('part1;');
    const w = waiting.shift();
    if (w) w(s);
    else ready.push(s);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, resolve);
  });
  return {
    server,
    port: (server.address() as AddressInfo).port,
    nextConnection: () => withDeadline(new Promise<Socket>((resolve) => {
      const s = ready.shift();
      if (s) resolve(s);
      else waiting.push(resolve);
    }), 10_000, 'the backend to get a connection'),
    close: () => new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    }),
  };
}

function start(extra: string[] = []): Spawned {
  const r = runCli(['--state', stateFile, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--iptables-min-sync-period', '0s', ...extra]);
  running.push(r);
  return r;
}

/** Waits until the proxy listens for the Service (read from /services: no probe connection reaches the backend). */
async function serving(r: Spawned): Promise<void> {
  const line = await r.waitForLine(/kube-userspace-proxy started/);
  const admin = (JSON.parse(line) as { admin: string }).admin;
  await waitFor(async () => {
    const body = (await (await fetch(`http://${admin}/services`)).json()) as { services: Array<{ reachable: string[] }> };
    return body.services[0]?.reachable.includes(`${SVC}:${port}`);
  }, 'the Service to be served');
}

/** Resolves once a fresh connection to the Service is refused: the proxy stopped accepting. */
function refusedNow(): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: SVC, port });
    s.once('connect', () => {
      s.destroy();
      resolve(false);
    });
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
  });
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-shutdown-'));
  stateFile = join(dir, 'state.json');
  backend = await stagedBackend('127.0.60.1');
  port = await freePort(SVC);
  await writeFile(stateFile, list([
    service({ name: 'stream', clusterIP: '10.96.60.1', ports: [{ name: 'tcp', port }] }),
    endpointSlice({ service: 'stream', ports: [{ name: 'tcp', port: backend.port }], endpoints: [{ ip: '127.0.60.1' }] }),
  ]));
});

afterAll(async () => {
  for (const r of running) r.kill();
  await backend?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('SIGTERM', () => {
  it('stops accepting, lets a connection in mid-transfer finish within the grace period, and exits 0', async () => {
    const r = start(['--shutdown-grace-period', '60s']);
    await serving(r);
    const { socket, got } = await connectTo(port, SVC);
    const upstream = await backend.nextConnection();
    await got.until('part1;'.length);

    r.child.kill('SIGTERM');
    await r.waitForLine(/shutting down/);
    await waitFor(() => refusedNow(), 'new connections to be refused');

    // The established connection still carries bytes both ways, then ends cleanly.
    socket.write('more');
    upstream.end('part2');
    socket.end();
    const all = await withDeadline(got.ended, 10_000, 'the transfer to finish');
    expect(all.toString()).toBe('part1;part2');
    socket.destroy();
    expect(await withDeadline(r.exited, 20_000, 'the proxy to exit')).toBe(0);
    expect(r.stdout()).toMatch(/"cut":0/);
  });

  it('cuts what is still open when the grace period ends, and still exits 0', async () => {
    const r = start(['--shutdown-grace-period', '100ms']);
    await serving(r);
    const { socket, got } = await connectTo(port, SVC);
    await got.until('part1;'.length);
    r.child.kill('SIGTERM');
    expect(await withDeadline(r.exited, 20_000, 'the proxy to exit')).toBe(0);
    // The client sees its connection end (reset) without the rest of the transfer.
    await withDeadline(got.ended.then(() => 'end', (err: NodeJS.ErrnoException) => err.code ?? 'error'), 5000, 'the connection to be cut');
    expect(got.bytes().toString()).toBe('part1;');
    expect(r.stdout()).toMatch(/"cut":1/);
    socket.destroy();
  });
});

describe('a second signal, and SIGHUP', () => {
  for (const [first, second] of [['SIGTERM', 'SIGTERM'], ['SIGINT', 'SIGINT'], ['SIGHUP', 'SIGTERM']] as const) {
    it(`${second} after ${first} ends the grace period at once, cuts what is open, removes the hosts-file block and exits 0`, async () => {
      const hosts = join(dir, `hosts-${first}-${second}`);
      await writeFile(hosts, '127.0.0.1 localhost\n');
      const r = start(['--shutdown-grace-period', '60s', '--hosts-file', hosts]);
      await serving(r);
      await waitFor(async () => (await readFile(hosts, 'utf8')).includes('stream.default'), 'the hosts-file block');
      const { socket, got } = await connectTo(port, SVC);
      await got.until('part1;'.length);
      r.child.kill(first);
      await r.waitForLine(/shutting down/);
      r.child.kill(second);
      // Well inside the 60 s grace period: the second signal ended it, and the shutdown went on.
      expect(await withDeadline(r.exited, 10_000, 'the proxy to exit')).toBe(0);
      await r.waitForLine(/signalled again: the grace period ends now/);
      expect(r.stdout()).toMatch(/"cut":1/);
      expect(await readFile(hosts, 'utf8')).toBe('127.0.0.1 localhost\n');
      socket.destroy();
    });
  }
});

describe('SIGKILL', () => {
  it('a proxy killed with SIGKILL starts again cleanly and serves', async () => {
    const first = start();
    await serving(first);
    first.child.kill('SIGKILL');
    expect(await first.exited).toBe('SIGKILL');
    const second = start();
    await serving(second);
    second.child.kill('SIGTERM');
    expect(await withDeadline(second.exited, 20_000, 'the proxy to exit')).toBe(0);
  });
});
