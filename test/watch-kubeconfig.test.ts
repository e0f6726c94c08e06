import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadKubeConfig, type KubeConfigEnv } from '../src/io/kube/kubeconfig.js';
import { createSource } from '../src/create-source.js';
import { ApiSource } from '../src/io/kube/api-source.js';
import { FileSource } from '../src/io/kube/file-source.js';
import { buildConfig } from '../src/config.js';
import { UsageError } from '../src/core/errors.js';
import { silentLogger } from '../src/log.js';

/** Where the API is found: flag, in-cluster, $KUBECONFIG, ~/.kube/config, --master on top. */
let dir: string;
let home: string;
let inCluster: string;

const kubeconfig = (name: string, server: string, extra = ''): string =>
  [
    'apiVersion: v1',
    'kind: Config',
    'clusters:',
    `- name: ${name}`,
    `  cluster: {server: "${server}"${extra}}`,
    'users:',
    `- name: ${name}`,
    `  user: {token: "t-${name}"}`,
    'contexts:',
    `- name: ${name}`,
    `  context: {cluster: ${name}, user: ${name}}`,
    `current-context: ${name}`,
    '',
  ].join('\n');

function env(vars: NodeJS.ProcessEnv, opts: { homeDir?: string } = {}): KubeConfigEnv {
  return { env: vars, homeDir: opts.homeDir ?? home, exists: existsSync, inClusterPrefix: inCluster };
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-kubeconfig-'));
  home = join(dir, 'home');
  await mkdir(join(home, '.kube'), { recursive: true });
  await writeFile(join(home, '.kube', 'config'), kubeconfig('home', 'https://home.invalid:6443'));
  await writeFile(join(dir, 'flag.yaml'), kubeconfig('flag', 'https://flag.invalid:6443'));
  await writeFile(join(dir, 'a.yaml'), kubeconfig('a', 'https://a.invalid:6443'));
  await writeFile(join(dir, 'b.yaml'), kubeconfig('b', 'https://b.invalid:6443'));
  await writeFile(join(dir, 'proxy.yaml'), kubeconfig('proxy', 'http://127.0.0.1:8001'));
  inCluster = join(dir, 'pod');
  const sa = join(inCluster, 'var/run/secrets/kubernetes.io/serviceaccount');
  await mkdir(sa, { recursive: true });
  await writeFile(join(sa, 'token'), 'pod-token');
  await writeFile(join(sa, 'ca.crt'), '');
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('finding the API server', () => {
  it('takes --kubeconfig over everything else', () => {
    const got = loadKubeConfig({ kubeconfig: join(dir, 'flag.yaml') }, env({ KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBECONFIG: join(dir, 'a.yaml') }));
    expect(got.server).toBe('https://flag.invalid:6443');
    expect(got.origin).toBe(join(dir, 'flag.yaml'));
  });

  it('uses the service account in a pod', () => {
    const saved = { host: process.env.KUBERNETES_SERVICE_HOST, port: process.env.KUBERNETES_SERVICE_PORT };
    // client-node's loadFromCluster reads these from process.env itself.
    process.env.KUBERNETES_SERVICE_HOST = '10.96.0.1';
    process.env.KUBERNETES_SERVICE_PORT = '443';
    try {
      const got = loadKubeConfig({}, env({ KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBECONFIG: join(dir, 'a.yaml') }));
      expect(got.origin).toBe('in-cluster');
      expect(got.server).toBe('https://10.96.0.1:443');
    } finally {
      for (const [k, v] of [['KUBERNETES_SERVICE_HOST', saved.host], ['KUBERNETES_SERVICE_PORT', saved.port]] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  it('says so when KUBERNETES_SERVICE_HOST is set but no token is mounted', () => {
    const where = { ...env({ KUBERNETES_SERVICE_HOST: '10.96.0.1' }), inClusterPrefix: join(dir, 'nowhere') };
    expect(() => loadKubeConfig({}, where)).toThrow(/token does not exist/);
  });

  it('then $KUBECONFIG, merging its files with the first one winning', () => {
    const got = loadKubeConfig({}, env({ KUBECONFIG: `${join(dir, 'a.yaml')}:${join(dir, 'b.yaml')}` }));
    expect(got.server).toBe('https://a.invalid:6443');
    expect(got.kc.clusters.map((c) => c.name)).toEqual(['a', 'b']);
  });

  it('then ~/.kube/config', () => {
    expect(loadKubeConfig({}, env({})).server).toBe('https://home.invalid:6443');
  });

  it('lets --master replace the server, and stand alone when nothing else is found', () => {
    expect(loadKubeConfig({ master: 'https://master.invalid:6443/' }, env({})).server).toBe('https://master.invalid:6443');
    const alone = loadKubeConfig({ master: 'http://127.0.0.1:8080' }, env({}, { homeDir: join(dir, 'empty') }));
    expect(alone).toMatchObject({ origin: '--master', server: 'http://127.0.0.1:8080', insecure: true });
  });

  it('accepts a plain-HTTP server (kubectl proxy) and flags it insecure', () => {
    const got = loadKubeConfig({ kubeconfig: join(dir, 'proxy.yaml') }, env({}));
    expect(got.insecure).toBe(true);
    expect(got.kc.getCurrentCluster()?.skipTLSVerify).toBe(true);
  });

  it('fails with one clear line when nothing can be found or a flag is wrong', () => {
    const none = env({}, { homeDir: join(dir, 'empty') });
    expect(() => loadKubeConfig({}, none)).toThrow(UsageError);
    expect(() => loadKubeConfig({}, none)).toThrow(/--kubeconfig FILE .*--state FILE/);
    expect(() => loadKubeConfig({ kubeconfig: join(dir, 'missing.yaml') }, none)).toThrow(/--kubeconfig: cannot load .*missing.yaml: no such file/);
    expect(() => loadKubeConfig({ master: 'ftp://x' }, env({}))).toThrow(/--master: .* must start with https:\/\/ or http:\/\//);
    expect(() => loadKubeConfig({ master: 'not a url' }, env({}))).toThrow(/--master: .* is not a URL/);
  });
});

describe('createSource', () => {
  const deps = { logger: silentLogger(), nodeName: 'node1' };

  it('serves the file with --state, and watches the cluster without it', async () => {
    expect(await createSource(buildConfig({ state: join(dir, 'state.yaml') }), deps)).toBeInstanceOf(FileSource);
    expect(await createSource(buildConfig({ kubeconfig: join(dir, 'flag.yaml') }), { ...deps, kubeConfigEnv: env({}) })).toBeInstanceOf(ApiSource);
  });

  it('refuses --state together with --kubeconfig or --master', async () => {
    await expect(createSource(buildConfig({ state: 'x.yaml', kubeconfig: join(dir, 'flag.yaml') }), deps)).rejects.toThrow(UsageError);
    await expect(createSource(buildConfig({ state: 'x.yaml', master: 'https://m.invalid' }), deps)).rejects.toThrow(/--state serves a file/);
  });
});
