import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { sockets } from '../bench/lib/proc.js';
import { listenAddresses } from '../bench/start-floor.js';
import { loopbackAddressFor } from '../src/core/loopback-address.js';
import { withDeadline } from './helpers/proxy-fixtures.js';
import { portFree } from './helpers/net.js';

/**
 * bench/start-floor.ts, the bare start-up the bench runs in the proxy's place to show what reading
 * a state file and listening on its ports costs on Node alone: it must listen where the proxy's
 * loopback portal listens, on nothing else, say so in the lines the harness times, and leave
 * nothing behind, or its figures mean nothing.
 */

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

const FLOOR = fileURLToPath(new URL('../dist/bench/start-floor.js', import.meta.url));

function service(name: string, clusterIP: string, ports: Array<{ port: number; protocol?: string; nodePort?: number }>, type = 'ClusterIP'): object {
  return { apiVersion: 'v1', kind: 'Service', metadata: { namespace: 'default', name }, spec: { type, clusterIP, clusterIPs: [clusterIP], ports } };
}

/** Whether a TCP connection to host:port is accepted (the floor closes it at once). */
function accepts(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host, port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

describe('start-up floor', () => {
  it('takes every TCP port of every Service where the loopback portal listens for it', () => {
    const items = [
      service('web', '10.96.0.10', [{ port: 80 }, { port: 443, protocol: 'TCP' }, { port: 53, protocol: 'UDP' }]),
      service('headless', 'None', [{ port: 80 }]),
      service('six', 'fd00::10', [{ port: 80 }]),
      // Its twin, 127.0.0.10, is reserved (127.0.0.0/16 is never handed out): a hashed address.
      service('low', '10.0.0.10', [{ port: 80 }]),
      service('np', '10.96.0.11', [{ port: 8080, nodePort: 30080 }, { port: 53, protocol: 'UDP', nodePort: 30053 }], 'NodePort'),
      { kind: 'EndpointSlice', endpoints: [] },
    ];
    const none = (): boolean => false;
    expect(listenAddresses(items)).toEqual([
      { host: '127.96.0.10', port: 80 },
      { host: '127.96.0.10', port: 443 },
      { host: loopbackAddressFor('default/six', ['fd00::10'], none), port: 80 },
      { host: loopbackAddressFor('default/low', ['10.0.0.10'], none), port: 80 },
      { host: '127.96.0.11', port: 8080 },
      { host: '127.0.0.1', port: 30080 },
    ]);
    expect(loopbackAddressFor('default/six', ['fd00::10'], none)).toMatch(/^127\.(1[3-9]\d|12[89]|2\d\d)\./);
  });

  it('listens on the state file ports, logs the lines the harness times, and frees the ports on SIGTERM', async () => {
    // Addresses of this run's own, off the bench's lanes and floor-relay.test.ts's (127.200-249.*.*:18080).
    const b = 150 + (process.pid % 50);
    const c = 2 + Math.floor(Math.random() * 250);
    const port = 18080;
    const hosts = [`127.${b}.${c}.1`, `127.${b}.${c}.2`];
    const dir = mkdtempSync(join(tmpdir(), 'start-floor-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const state = join(dir, 'state.json');
    const items = [service('a', `10.${b}.${c}.1`, [{ port }]), service('b', `10.${b}.${c}.2`, [{ port }, { port, protocol: 'UDP' }])];
    writeFileSync(state, JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));

    const floor = spawn(process.execPath, [FLOOR, '--state', state, '--portal', 'loopback'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    floor.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    floor.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((resolve) => {
      floor.once('exit', resolve);
      floor.once('error', () => resolve(null));
    });
    cleanups.push(async () => {
      if (floor.exitCode === null && floor.signalCode === null) floor.kill('SIGKILL');
      await exited;
    });
    const synced = new Promise<void>((resolve) => {
      const check = (): void => {
        if (stdout.includes('"msg":"synced proxy rules"')) resolve();
      };
      floor.stdout.on('data', check);
    });
    await withDeadline(Promise.race([synced, exited.then((code) => Promise.reject(new Error(`the start floor exited (${code}): ${stderr}`)))]), 10_000, 'the start floor to log its sync');

    const lines = stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { msg: string; time: string; units?: number; listenErrors?: number });
    expect(lines.map((l) => l.msg)).toEqual(['loaded state file', 'synced proxy rules']);
    for (const l of lines) expect(Number.isNaN(Date.parse(l.time))).toBe(false);
    expect(lines[1]).toMatchObject({ units: 2, listenErrors: 0 });
    for (const host of hosts) expect(await accepts(host, port)).toBe(true);
    // And nothing else on this run's addresses: the UDP port is not the row's, and no other socket listens.
    expect(sockets('tcp').filter((t) => t.state === '0A' && t.host.startsWith(`127.${b}.${c}.`)).map((t) => `${t.host}:${t.port}`).sort()).toEqual(hosts.map((h) => `${h}:${port}`));

    floor.kill('SIGTERM');
    expect(await withDeadline(exited, 5000, 'the start floor to exit on SIGTERM')).toBe(0);
    for (const host of hosts) expect(await portFree(host, port)).toBe(true);
  });
});
