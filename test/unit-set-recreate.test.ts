import { describe, expect, it } from 'vitest';
import { roundRobinFactory } from '../src/core/balancer/round-robin.js';
import type { BalancerFactory, LoadBalancer } from '../src/core/balancer/load-balancer.js';
import { toEndpoint } from '../src/core/model.js';
import { diffUnits, type ProxyUnit } from '../src/core/units.js';
import { silentLogger } from '../src/log.js';
import { localUnitSet } from './helpers/local-unit-set.js';

/**
 * A unit made anew (its portals changed: the load balancer's ingress IP assigned, an externalIP
 * added, a node port changed) gets new sockets but keeps its balancer.
 */
describe('a portal change (e.g. the LB ingress IP gets assigned) under ClientIP affinity', () => {
  it('keeps its balancer: sticky clients stay on their endpoints, as upstream\'s userspace proxy kept them', async () => {
    const logger = silentLogger();
    const made: LoadBalancer[] = [];
    const factory: BalancerFactory = (deps) => {
      const b = roundRobinFactory(deps);
      made.push(b);
      return b;
    };
    const units = localUnitSet({ logger, balancerFactory: factory });
    const endpoints = [1, 2, 3, 4].map((i) => toEndpoint({ ip: `10.1.0.${i}`, port: 80 }));
    const before: ProxyUnit = { id: 'default/web:http', servicePort: 'default/web:http', service: 'default/web', protocol: 'TCP', scope: 'all', portals: [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }], endpoints, affinity: { type: 'ClientIP', timeoutSeconds: 10800 } };
    const after: ProxyUnit = { ...before, portals: [...before.portals, { kind: 'loadBalancer', ip: '203.0.113.7', port: 80 }] };
    const listen = [{ host: '127.0.0.1', port: 0, proxyPort: true, portals: [] }];
    try {
      await units.apply({ close: [], recreate: [], open: [{ unit: before, listen }], update: [] });
      const clients = Array.from({ length: 40 }, (_, i) => `192.168.7.${i + 1}`);
      const first = new Map(clients.map((c) => [c, made[0]!.nextEndpoint(c, false)!.addr]));
      expect(diffUnits([before], [after]).recreate).toHaveLength(1);
      await units.apply({ close: [], recreate: [{ unit: after, listen }], open: [], update: [] });
      expect(made).toHaveLength(1);
      const lb = made[0]!;
      expect(clients.filter((c) => lb.nextEndpoint(c, false)!.addr !== first.get(c))).toEqual([]);
    } finally {
      await units.shutdown(0);
    }
  });
});
