import type { ProxyConfig } from './config.js';
import type { ReachPolicy } from './core/reach.js';
import { DirectDialer } from './io/net/direct-dialer.js';
import type { LoadedKubeConfig } from './io/kube/kubeconfig.js';
import type { Logger } from './log.js';
import type { Dialer } from './seams/dialer.js';

/** The dialer `--dialer` names, with what the rest of the proxy must know of it. */
export interface CreatedDialer {
  dialer: Dialer;
  /** What it cannot reach (port-forward: UDP, endpoints without a pod); none for the direct dialer. */
  reach?: ReachPolicy;
  /** Its dial attempts, when not the TCP defaults (a tunnel may have to open first). */
  dialTimeoutsMs?: readonly number[];
  /** Close what it holds open (tunnels). */
  close(): void;
}

/**
 * `--dialer direct` (the default) connects to the endpoint; `--dialer port-forward` reaches its
 * pod through the API server of `cluster`, with the kubeconfig's credentials and TLS.
 * Precondition: `cluster` is given for port-forward (config.ts refuses it with --state).
 * The port-forward modules (and zlib with them) load only when asked for: start-up pays for
 * what it uses.
 */
export async function createDialer(config: ProxyConfig, logger: Logger, cluster: LoadedKubeConfig | undefined): Promise<CreatedDialer> {
  if (config.dialer === 'direct' || cluster === undefined) {
    return { dialer: new DirectDialer({ keepAliveMs: config.tcpKeepAliveMs }), close: () => {} };
  }
  const [{ PORT_FORWARD_DIAL_TIMEOUTS_MS, PortForwardDialer }, { HttpTunnelOpener }] = await Promise.all([
    import('./io/port-forward/port-forward-dialer.js'),
    import('./io/port-forward/tunnel-opener.js'),
  ]);
  const opener = new HttpTunnelOpener({ kc: cluster.kc, logger });
  const dialer = new PortForwardDialer({ opener, logger });
  logger.info({ server: cluster.server }, 'endpoints are reached through the API server (pods/portforward): TCP only, pods only');
  return { dialer, reach: dialer.reach, dialTimeoutsMs: PORT_FORWARD_DIAL_TIMEOUTS_MS, close: () => dialer.close() };
}
