import type { EndpointInfo, Protocol } from './model.js';

/**
 * What the dialer in use can reach. The direct dialer reaches every endpoint of every TCP and UDP
 * port (no policy). The port-forward dialer reaches TCP ports of pods only: a UDP port, or an
 * endpoint without a pod behind it (a selector-less Service's), cannot be carried through the API
 * server. The plan leaves those out of the balancers and reports why, in /services and once in the
 * log, rather than letting connections fail on them.
 */
export interface ReachPolicy {
  /** Why a service port of this protocol is not served, or undefined. */
  protocol(protocol: Protocol): string | undefined;
  /** Why this endpoint is left out, or undefined. */
  endpoint(ep: EndpointInfo): string | undefined;
}
