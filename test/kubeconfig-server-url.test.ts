import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadKubeConfig, type KubeConfigEnv } from '../src/io/kube/kubeconfig.js';
import { HttpKubeApi } from '../src/io/kube/api-client.js';
import { UsageError } from '../src/core/errors.js';

/**
 * A kubeconfig whose cluster server is not an http(s) URL (`127.0.0.1:6443`, a scheme left out
 * by hand) was loaded without a word; every request then threw a TypeError ("Invalid URL",
 * "Protocol "localhost:" not supported") that the reflectors took for an API outage and retried
 * forever: the first lists never came and nothing was ever served, with no line saying why.
 * --master is checked; the file's server must be too, in one line naming the file and field.
 */

let dir: string;
const kubeconfig = (server: string): string =>
  ['apiVersion: v1', 'kind: Config', 'clusters:', '- name: c', `  cluster: {server: "${server}"}`, 'users:', '- name: u', '  user: {token: t}', 'contexts:', '- name: x', '  context: {cluster: c, user: u}', 'current-context: x', ''].join('\n');
const env = (): KubeConfigEnv => ({ env: {}, homeDir: join(dir, 'nohome'), exists: existsSync, inClusterPrefix: join(dir, 'nopod') });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-kc-url-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('a kubeconfig cluster server that is not an http(s) URL', () => {
  for (const server of ['127.0.0.1:6443', 'localhost:6443', '[::1]:6443', 'ftp://127.0.0.1:6443']) {
    it(`is refused at load with one line naming the file and field: ${server}`, async () => {
      const file = join(dir, `kc-${server.replace(/[^a-z0-9]/gi, '_')}.yaml`);
      await writeFile(file, kubeconfig(server));
      let loaded: ReturnType<typeof loadKubeConfig> | undefined;
      let error: unknown;
      try {
        loaded = loadKubeConfig({ kubeconfig: file }, env());
      } catch (err) {
        error = err;
      }
      if (loaded) {
        // What it used to lead to: no API error, a TypeError on every request.
        const got = await new HttpKubeApi(loaded.kc).get('/api/v1/services', {}, new AbortController().signal).catch((e: unknown) => e);
        expect.fail(`loaded, and a request then fails with ${String(got)}`);
      }
      expect(error).toBeInstanceOf(UsageError);
      expect((error as Error).message).toContain(file);
      expect((error as Error).message).toMatch(/cluster\.server/);
      expect((error as Error).message).toContain(server);
    });
  }

  it('is fine when --master replaces it', async () => {
    const file = join(dir, 'kc-master.yaml');
    await writeFile(file, kubeconfig('127.0.0.1:6443'));
    expect(loadKubeConfig({ kubeconfig: file, master: 'https://127.0.0.1:6443' }, env()).server).toBe('https://127.0.0.1:6443');
  });
});
