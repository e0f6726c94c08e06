import type { V1Node } from '@kubernetes/client-node';
import type { ProxyConfig } from '../../config.js';
import { UsageError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { HttpKubeApi } from './api-client.js';
import { ApiSource } from './api-source.js';
import { FileSource } from './file-source.js';
import { loadKubeConfig, type KubeConfigEnv } from './kubeconfig.js';
import type { Source } from './source.js';

export type { Source } from './source.js';

export interface CreateSourceDeps {
  logger: Logger;
  /** This node's name: `--hostname-override`, else the hostname. */
  nodeName: string;
  /** This Node as the API shows it (API source only); undefined once deleted. */
  onNode?: (node: V1Node | undefined) => void;
  /** Tests only: where kubeconfig files and the in-cluster token are looked for. */
  kubeConfigEnv?: KubeConfigEnv;
}

/**
 * `--state FILE` serves a file; otherwise the cluster is watched, found through --kubeconfig,
 * in-cluster credentials, $KUBECONFIG or ~/.kube/config (kubeconfig.ts), with --master on top.
 * Throws UsageError when no cluster can be found or the flags contradict each other.
 */
export function createSource(config: ProxyConfig, deps: CreateSourceDeps): Source {
  if (config.stateFile) {
    if (config.kubeconfig || config.master) {
      throw new UsageError('--state serves a file instead of a cluster: drop --kubeconfig/--master, or drop --state');
    }
    return new FileSource({ path: config.stateFile, logger: deps.logger.child({ component: 'file-source' }) });
  }
  const flags = { ...(config.kubeconfig ? { kubeconfig: config.kubeconfig } : {}), ...(config.master ? { master: config.master } : {}) };
  const loaded = loadKubeConfig(flags, deps.kubeConfigEnv);
  if (loaded.insecure) deps.logger.warn({ server: loaded.server }, 'the API server is reached over plain HTTP: nothing authenticates it');
  deps.logger.info({ server: loaded.server, kubeconfig: loaded.origin }, 'Kubernetes API');
  return new ApiSource({
    api: new HttpKubeApi(loaded.kc),
    nodeName: deps.nodeName,
    logger: deps.logger,
    ...(deps.onNode ? { onNode: deps.onNode } : {}),
  });
}
