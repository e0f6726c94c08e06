import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer, type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { endpointSlice, list, service } from './helpers/objects.js';
import { freePort, tcpEchoServer, tcpRequest, waitFor } from './helpers/net.js';
import { runCli, type Spawned } from './helpers/cli.js';

/** The CLI as a black box: spawned with a state file, reached through /services, stopped with SIGTERM. */
let dir: string;
const running: Spawned[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-cli-'));
});

afterAll(async () => {
  for (const r of running) r.kill();
  await rm(dir, { recursive: true, force: true });
});

function start(args: string[]): Spawned {
  const r = runCli(args);
  running.push(r);
  return r;
}

describe('bad flags', () => {
  it.each([
    [['--udp-timeout', '10'], /--udp-timeout.*invalid duration "10"/],
    [['--proxy-port-range', '9000-8000'], /--proxy-port-range/],
    [['--portal', 'ipvs'], /--portal: "ipvs" is not one of loopback, bind, iptables/],
    [['--metrics-bind-address', 'localhost'], /--metrics-bind-address/],
    [['--log-level', 'loud'], /--log-level/],
    [['--no-such-flag'], /unknown option '--no-such-flag'/],
    [['--iptables-sync-period', '1s', '--iptables-min-sync-period', '5s'], /--iptables-min-sync-period/],
    // The minimum left at its default is named as such, not as "undefined".
    [['--iptables-sync-period', '500ms'], /^kube-userspace-proxy: --iptables-min-sync-period \(default 1s\) must not exceed --iptables-sync-period \(500ms\)$/],
  ])('%j prints one line naming the flag and exits 2', async (args, re) => {
    const r = start(args);
    expect(await r.exited).toBe(2);
    const lines = r.stderr().trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(re);
    expect(r.stderr()).not.toMatch(/\n\s+at /); // no stack
  });

  it('--help and --version exit 0', async () => {
    const help = start(['--help']);
    expect(await help.exited).toBe(0);
    expect(help.stdout()).toMatch(/--proxy-port-range/);
    // Flags over --config differs from kube-proxy on purpose, and says so where users look.
    expect(help.stdout().replace(/\s+/g, ' ')).toMatch(/--config <file> .*flags given override its values \(kube-proxy would ignore them\)/);
    const version = start(['--version']);
    expect(await version.exited).toBe(0);
    expect(version.stdout().trim()).toMatch(/^\d+\.\d+\.\d+$/);
  });
});

describe('a start-up that fails', () => {
  it('with the health address taken: one line naming the flag and the address, exit 1, nothing left listening', async () => {
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const healthz = `127.0.0.1:${(taken.address() as AddressInfo).port}`;
    const metricsPort = await freePort('127.0.0.1');
    const stateFile = join(dir, 'empty.yaml');
    await writeFile(stateFile, list([]));
    try {
      const r = start(['--state', stateFile, '--metrics-bind-address', `127.0.0.1:${metricsPort}`, '--healthz-bind-address', healthz]);
      expect(await r.exited).toBe(1);
      const lines = r.stderr().trim().split('\n');
      expect(lines).toEqual([`kube-userspace-proxy: --healthz-bind-address ${healthz}: cannot listen: the address is in use by another process`]);
      // The metrics server had started first: it was closed, not left behind (the process exited).
      const again = createServer();
      await new Promise<void>((resolve, reject) => {
        again.once('error', reject);
        again.listen(metricsPort, '127.0.0.1', resolve);
      });
      again.close();
    } finally {
      taken.close();
    }
  });
});

describe('a running proxy', () => {
  it('serves a state file, answers /services, and exits 0 on SIGTERM', async () => {
    const backend = await tcpEchoServer('127.0.30.1', 'cli');
    const port = await freePort('127.96.30.1');
    const stateFile = join(dir, 'state.yaml');
    await writeFile(stateFile, list([
      service({ name: 'web', clusterIP: '10.96.30.1', ports: [{ name: 'http', port }] }),
      endpointSlice({ service: 'web', ports: [{ name: 'http', port: backend.port }], endpoints: [{ ip: '127.0.30.1' }] }),
    ]));
    const r = start(['--state', stateFile, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--iptables-min-sync-period', '0s']);
    const line = await r.waitForLine(/kube-userspace-proxy started/);
    const admin = (JSON.parse(line) as { admin: string }).admin;
    const body = await waitFor(async () => {
      const res = await fetch(`http://${admin}/services`);
      const json = (await res.json()) as { portal: string; services: Array<{ name: string; reachable: string[] }> };
      return json.services.length === 1 ? json : undefined;
    }, '/services to list the Service');
    expect(body.portal).toBe('loopback');
    expect(body.services[0]).toMatchObject({ name: 'default/web:http', reachable: [`127.96.30.1:${port}`] });
    expect(await tcpRequest('127.96.30.1', port, 'hi')).toBe('cli:hi');
    r.child.kill('SIGTERM');
    expect(await r.exited).toBe(0);
    await backend.close();
  });

  it('reports an unreadable state file as one line and keeps running', async () => {
    const stateFile = join(dir, 'broken.yaml');
    await writeFile(stateFile, 'apiVersion: v1\nkind: Service\nmetadata: {name: x\n');
    const r = start(['--state', stateFile, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0']);
    await r.waitForLine(/kube-userspace-proxy started/);
    expect(r.stdout()).toMatch(/broken\.yaml/);
    r.child.kill('SIGTERM');
    expect(await r.exited).toBe(0);
  });
});
