import type { ServicePort } from '../../src/core/model.js';
import { planUnits, type ProxyUnit } from '../../src/core/units.js';

/**
 * A translated ServicePort for unit tests of what comes after translation: `key` is
 * `namespace/name:port`; everything else takes a ClusterIP Service's defaults unless overridden.
 */
export function servicePort(key: string, over: Partial<ServicePort> = {}): ServicePort {
  const [ns = 'default', rest = ''] = key.split('/');
  const [name = '', port = ''] = rest.split(':');
  return {
    name: { namespace: ns, name, port },
    key,
    protocol: 'TCP',
    port: 80,
    clusterIPs: ['10.96.0.10'],
    nodePort: 0,
    externalIPs: [],
    loadBalancerIPs: [],
    affinity: { type: 'None', timeoutSeconds: 10800 },
    internalTrafficPolicy: 'Cluster',
    externalTrafficPolicy: 'Cluster',
    healthCheckNodePort: 0,
    endpoints: [],
    ...over,
  };
}

/** The units of these service ports, with no endpoints (for portal tests). */
export function unitsOf(...ports: ServicePort[]): ProxyUnit[] {
  return ports.flatMap((p) => planUnits(p, { clusterEndpoints: [], externalEndpoints: [] }));
}
