import type { V1Node } from '@kubernetes/client-node';
import type { ProxyConfig } from './config.js';
import { UsageError } from './core/errors.js';
import type { EarlyStateRead } from './io/kube/state-file-read.js';
import type { Logger } from './log.js';
import { HttpKubeApi } from './io/kube/api-client.js';
import { ApiSource } from './io/kube/api-source.js';
import { FileSource } from './io/kube/file-source.js';
import type { KubeConfigEnv, LoadedKubeConfig } from './io/kube/kubeconfig.js';
import { errnoCode } from './core/errors.js';
import type { Source } from './seams/source.js';

export type { Source } from './seams/source.js';

export interface CreateSourceDeps {
  logger: Logger;
  /** This node's name: `--hostname-override`, else the hostname. */
  nodeName: string;
  /** This Node as the API shows it (API source only); undefined once deleted. */
  onNode?: (node: V1Node | undefined) => void;
  /** The API client, when the source is a cluster: for what else talks to it (Events). */
  onApi?: (api: HttpKubeApi) => void;
  /** Tests only: where kubeconfig files and the in-cluster token are looked for. */
  kubeConfigEnv?: KubeConfigEnv;
  /** The cluster as loadCluster found it, when the caller needed it first (the port-forward dialer). */
  cluster?: LoadedKubeConfig;
  /** The `--state` file's read begun as the process started; taken for that same path only. */
  earlyStateRead?: EarlyStateRead;
}

/**
 * `--state FILE` serves a file; otherwise the cluster is watched, found through --kubeconfig,
 * in-cluster credentials, $KUBECONFIG or ~/.kube/config (kubeconfig.ts), with --master on top.
 * Throws UsageError when no cluster can be found or the flags contradict each other.
 *
 * The Kubernetes client (2,500 generated modules) is loaded only for a cluster: --state never
 * pays for it.
 */
export async function createSource(config: ProxyConfig, deps: CreateSourceDeps): Promise<Source> {
  // Taken here whatever the source, so that a read begun for nothing is let go of.
  const early = deps.earlyStateRead?.take(config.stateFile);
  if (config.stateFile) {
    if (config.kubeconfig || config.master) {
      throw new UsageError('--state serves a file instead of a cluster: drop --kubeconfig/--master, or drop --state');
    }
    return new FileSource({ path: config.stateFile, logger: deps.logger.child({ component: 'file-source' }), ...(early ? { earlyRead: early } : {}) });
  }
  const loaded = deps.cluster ?? (await loadCluster(config, deps));
  const api = new HttpKubeApi(loaded.kc);
  deps.onApi?.(api);
  return new ApiSource({
    api,
    nodeName: deps.nodeName,
    logger: deps.logger,
    ...(config.namespaces.length > 0 ? { namespaces: config.namespaces } : {}),
    ...(deps.onNode ? { onNode: deps.onNode } : {}),
  });
}

/**
 * The cluster: --kubeconfig, in-cluster credentials, $KUBECONFIG or ~/.kube/config, with --master
 * on top (kubeconfig.ts). Throws UsageError when none can be found. Precondition: not --state.
 */
export async function loadCluster(config: ProxyConfig, deps: Pick<CreateSourceDeps, 'logger' | 'kubeConfigEnv'>): Promise<LoadedKubeConfig> {
  const { loadKubeConfig } = await loadKubeConfigModule();
  const flags = { ...(config.kubeconfig ? { kubeconfig: config.kubeconfig } : {}), ...(config.master ? { master: config.master } : {}) };
  const loaded = loadKubeConfig(flags, deps.kubeConfigEnv);
  if (loaded.insecure) deps.logger.warn({ server: loaded.server }, 'the API server is reached over plain HTTP: nothing authenticates it');
  deps.logger.info({ server: loaded.server, kubeconfig: loaded.origin }, 'Kubernetes API');
  return loaded;
}

async function loadKubeConfigModule(): Promise<typeof import('./io/kube/kubeconfig.js')> {
  try {
    return await import('./io/kube/kubeconfig.js');
  } catch (err) {
    // Node 20's module loader held hundreds of descriptors while the client's modules loaded; 24's
    // closes each file as it goes, so only a limit already used up by something else gets here.
    if (errnoCode(err) === 'EMFILE') {
      throw new UsageError(`out of open files while loading the Kubernetes client: raise the open-file limit (ulimit -n, or LimitNOFILE= under systemd) (${err instanceof Error ? err.message.split('\n')[0] : String(err)})`, { cause: err });
    }
    throw err;
  }
}
