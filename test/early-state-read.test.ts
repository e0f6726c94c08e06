import { statSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { startProxy, type RunningProxy } from '../src/app.js';
import { buildConfig } from '../src/config.js';
import { EarlyStateRead, type StateFileRead } from '../src/io/kube/state-file-read.js';
import { createLogger } from '../src/log.js';
import { list, service } from './helpers/objects.js';
import { freePort, waitFor } from './helpers/net.js';

/**
 * The early read of the state file reaches the file source through startProxy and createSource
 * (main.ts begins it; its own checks are in file-source.test.ts): the proxy serves what the early
 * read holds, here made different from the file so that the file's own content would show.
 */
const proxies: RunningProxy[] = [];
const dirs: string[] = [];

afterEach(async () => {
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

/** A read of `path` holding `text`, as if made well after the file's last change. */
function readOf(path: string, text: string): Promise<StateFileRead> {
  const buf = Buffer.allocUnsafeSlow(Buffer.byteLength(text));
  buf.write(text);
  return Promise.resolve({ buf, stat: statSync(path, { bigint: true }), openedAtMs: Date.now() + 60_000 });
}

describe('the early state read through startProxy', () => {
  it('is what the proxy serves first when it was of the state file', async () => {
    const names = await start((path, text) => new EarlyStateRead(path, readOf(path, text)));
    expect(names.some((n) => n.includes('from-early-read'))).toBe(true);
    expect(names.some((n) => n.includes('from-file'))).toBe(false);
  });

  it('is left aside for another path, and the file is read', async () => {
    const names = await start((path, text) => new EarlyStateRead(`${path}.other`, readOf(path, text)));
    expect(names.some((n) => n.includes('from-file'))).toBe(true);
    expect(names.some((n) => n.includes('from-early-read'))).toBe(false);
  });
});
