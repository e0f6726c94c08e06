import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { KubeConfig, type Cluster } from '@kubernetes/client-node';
import { UsageError } from '../../core/errors.js';

/**
 * Where the API server and credentials come from, in this order:
 *   1. `--kubeconfig FILE`, when given (an explicit flag is never overruled);
 *   2. the pod's service account, when KUBERNETES_SERVICE_HOST is set (in-cluster);
 *   3. `$KUBECONFIG` (a list of files, merged as kubectl does);
 *   4. `~/.kube/config`.
 * `--master URL` then replaces the server address; with nothing else found it stands alone.
 * This is client-go's BuildConfigFromFlags order, which kube-proxy uses, and what `--help` says.
 */

export interface KubeConfigFlags {
  kubeconfig?: string;
  master?: string;
}

/** What the loader may look at; tests pass their own. */
export interface KubeConfigEnv {
  env: NodeJS.ProcessEnv;
  homeDir: string;
  exists: (path: string) => boolean;
  /** The service account directory of a pod (client-node's loadFromCluster reads it under this prefix). */
  inClusterPrefix: string;
}

export interface LoadedKubeConfig {
  kc: KubeConfig;
  /** Where it came from: `in-cluster`, a file path, `$KUBECONFIG`, or `--master`. */
  origin: string;
  /** The API server's address. */
  server: string;
  /** Set when the server is plain HTTP: worth one warning line at start. */
  insecure: boolean;
}

const SERVICE_ACCOUNT_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

const systemEnv = (): KubeConfigEnv => ({ env: process.env, homeDir: homedir(), exists: existsSync, inClusterPrefix: '' });

export function loadKubeConfig(flags: KubeConfigFlags, where: KubeConfigEnv = systemEnv()): LoadedKubeConfig {
  const kc = new KubeConfig();
  const origin = loadBase(kc, flags, where);
  if (flags.master) overrideServer(kc, flags.master);
  const cluster = kc.getCurrentCluster();
  if (!cluster) {
    throw new UsageError(`${origin}: no current context with a cluster (set current-context, or pass --master)`);
  }
  // Checked as --master is: a server that is no http(s) URL (`127.0.0.1:6443`, the scheme left
  // out) would fail every request with a TypeError, retried forever as if the API were down.
  if (!flags.master && !isHttpUrl(cluster.server)) {
    throw new UsageError(`${origin}: clusters["${cluster.name}"].cluster.server: "${cluster.server}" is not an https:// or http:// URL (e.g. https://10.0.0.1:6443)`);
  }
  const insecure = cluster.server.startsWith('http:');
  // client-node refuses plain HTTP unless TLS checks are off, but there is no TLS to check: a
  // server the user names as http:// (kubectl proxy, --master http://...) is taken as given.
  if (insecure && !cluster.skipTLSVerify) replaceCluster(kc, cluster, { ...cluster, skipTLSVerify: true });
  return { kc, origin, server: cluster.server, insecure };
}

function isHttpUrl(text: string): boolean {
  try {
    const url = new URL(text);
    return url.protocol === 'https:' || url.protocol === 'http:';
  } catch {
    return false;
  }
}

function loadBase(kc: KubeConfig, flags: KubeConfigFlags, where: KubeConfigEnv): string {
  if (flags.kubeconfig) {
    loadFile(kc, flags.kubeconfig, '--kubeconfig');
    return flags.kubeconfig;
  }
  if (where.env.KUBERNETES_SERVICE_HOST) {
    const token = `${where.inClusterPrefix}${SERVICE_ACCOUNT_TOKEN}`;
    if (!where.exists(token)) {
      throw new UsageError(`KUBERNETES_SERVICE_HOST is set but ${token} does not exist: mount the service account token, or pass --kubeconfig`);
    }
    kc.loadFromCluster(where.inClusterPrefix);
    return 'in-cluster';
  }
  const list = (where.env.KUBECONFIG ?? '').split(':').filter(Boolean);
  if (list.length > 0) {
    const [first, ...rest] = list as [string, ...string[]];
    loadFile(kc, first, '$KUBECONFIG');
    for (const file of rest) {
      const more = new KubeConfig();
      loadFile(more, file, '$KUBECONFIG');
      mergeFirstWins(kc, more);
    }
    return list.join(':');
  }
  const home = join(where.homeDir, '.kube', 'config');
  if (where.exists(home)) {
    loadFile(kc, home, '~/.kube/config');
    return home;
  }
  if (flags.master) {
    kc.loadFromClusterAndUser({ name: 'master', server: flags.master, skipTLSVerify: false }, { name: 'anonymous' });
    return '--master';
  }
  throw new UsageError('no Kubernetes API to watch: pass --kubeconfig FILE (or --master URL), set $KUBECONFIG, create ~/.kube/config, run in a pod, or serve a file with --state FILE');
}

/** kubectl's rule: the first file to name a cluster, user or context (or set current-context) wins. */
function mergeFirstWins(kc: KubeConfig, more: KubeConfig): void {
  const add = <T extends { name: string }>(have: readonly T[], extra: readonly T[]): T[] => {
    const names = new Set(have.map((x) => x.name));
    return [...have, ...extra.filter((x) => !names.has(x.name))];
  };
  kc.loadFromOptions({
    clusters: add(kc.clusters, more.clusters),
    users: add(kc.users, more.users),
    contexts: add(kc.contexts, more.contexts),
    currentContext: kc.currentContext || more.currentContext,
  });
}

function loadFile(kc: KubeConfig, path: string, what: string): void {
  try {
    kc.loadFromFile(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const reason = code === 'ENOENT' ? 'no such file' : code ? code : (err as Error).message.split('\n')[0];
    throw new UsageError(`${what}: cannot load ${path}: ${reason}`, { cause: err });
  }
}

function overrideServer(kc: KubeConfig, master: string): void {
  let url: URL;
  try {
    url = new URL(master);
  } catch (err) {
    throw new UsageError(`--master: "${master}" is not a URL (e.g. https://10.0.0.1:6443)`, { cause: err });
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') {
    throw new UsageError(`--master: "${master}" must start with https:// or http://`);
  }
  const cluster = kc.getCurrentCluster();
  if (cluster) replaceCluster(kc, cluster, { ...cluster, server: master.replace(/\/+$/, '') });
}

/** KubeConfig's clusters are read-only objects: rebuild the config around a changed one. */
function replaceCluster(kc: KubeConfig, old: Cluster, next: Cluster): void {
  kc.loadFromOptions({
    clusters: kc.clusters.map((c) => (c === old ? next : c)),
    contexts: kc.contexts,
    users: kc.users,
    currentContext: kc.currentContext,
  });
}
