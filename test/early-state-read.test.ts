import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { startProxy, type RunningProxy } from '../src/app.js';
import { buildConfig } from '../src/config.js';
import { EarlyStateRead } from '../src/io/kube/state-file-read.js';
import { createLogger } from '../src/log.js';
import { list, service } from './helpers/objects.js';
import { freePort, waitFor } from './helpers/net.js';
import { earlyReadOf } from './helpers/early-read.js';
import { runCli, type Spawned } from './helpers/cli.js';

/**
 * The early read of the state file reaches the file source: from the command line through main.ts
 * (the binary, as a black box), and through startProxy and createSource, where the proxy serves
 * what the early read holds, here made different from the file so that the file's own content
 * would show. Its own checks are in file-source.test.ts.
 */
const proxies: RunningProxy[] = [];
const dirs: string[] = [];
const running: Spawned[] = [];

afterEach(async () => {
  for (const r of running.splice(0)) {
    r.kill();
    await r.exited;
  }
  await Promise.all(proxies.splice(0).map((p) => p.stop(0)));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

async function start(early: (path: string, text: string) => EarlyStateRead): Promise<string[]> {
  const dir = await mkdtemp(join(tmpdir(), 'kup-early-read-'));
  dirs.push(dir);
  const path = join(dir, 'state.json');
  const port = await freePort('127.96.9.9');
  const state = (name: string): string => list([service({ name, clusterIP: '10.96.9.9', ports: [{ name: 'tcp', port }] })]);
  await writeFile(path, state('from-file'));
  const config = buildConfig({ state: path, portal: 'loopback', metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', logLevel: 'silent' });
  const proxy = await startProxy(config, createLogger('silent'), { earlyStateRead: early(path, state('from-early-read')) });
  proxies.push(proxy);
  const names = async (): Promise<string[]> => {
    const res = await fetch(`http://${proxy.adminAddress}/services`);
    return ((await res.json()) as { services: Array<{ name: string }> }).services.map((s) => s.name);
  };
  await waitFor(async () => (await names()).length > 0, 'the first sync');
  return names();
}

describe('the early state read through startProxy', () => {
  it('is what the proxy serves first when it was of the state file', async () => {
    const names = await start((path, text) => new EarlyStateRead(path, Promise.resolve(earlyReadOf(path, text))));
    expect(names.some((n) => n.includes('from-early-read'))).toBe(true);
    expect(names.some((n) => n.includes('from-file'))).toBe(false);
  });

  it('is left aside for another path, and the file is read', async () => {
    const names = await start((path, text) => new EarlyStateRead(`${path}.other`, Promise.resolve(earlyReadOf(path, text))));
    expect(names.some((n) => n.includes('from-file'))).toBe(true);
    expect(names.some((n) => n.includes('from-early-read'))).toBe(false);
  });
});

describe('the early state read from the command line', () => {
  it('is begun by the binary for its --state file and is what the file source loads first', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kup-early-read-cli-'));
    dirs.push(dir);
    const path = join(dir, 'state.json');
    const port = await freePort('127.96.9.10');
    await writeFile(path, list([service({ name: 'web', clusterIP: '10.96.9.10', ports: [{ name: 'tcp', port }] })]));
    const r = runCli(['--state', path, '--portal', 'loopback', '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--shutdown-grace-period', '0s']);
    running.push(r);
    const line = JSON.parse(await r.waitForLine(/"msg":"loaded state file"/)) as Record<string, unknown>;
    expect(line).toMatchObject({ file: path, services: 1, earlyRead: true });
  });
});
