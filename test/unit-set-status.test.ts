import { describe, expect, it } from 'vitest';
import type { RandomSource } from '../src/core/clock.js';
import { toEndpoint } from '../src/core/model.js';
import type { ProxyUnit } from '../src/core/units.js';
import { silentLogger } from '../src/log.js';
import { localUnitSet } from './helpers/local-unit-set.js';

/** Math.random, counting its draws: a balancer draws when it shuffles a list into its slots. */
function countingRandom(): RandomSource & { calls: number } {
  const f = Object.assign(() => {
    f.calls++;
    return Math.random();
  }, { calls: 0 });
  return f;
}

describe('unit set status (GET /services)', () => {
  it("lists a port's endpoints without making its balancer's first list into slots (that waits for the first use)", async () => {
    const logger = silentLogger();
    const random = countingRandom();
    const units = localUnitSet({ logger, random });
    // Endpoints nothing connects to: the test only reads what the unit set says of them.
    const endpoints = [toEndpoint({ ip: '127.0.0.1', port: 9 }), toEndpoint({ ip: '127.0.0.2', port: 9 }), toEndpoint({ ip: '127.0.0.1', port: 9 })];
    const unit: ProxyUnit = { id: 'default/web:http', servicePort: 'default/web:http', service: 'default/web', protocol: 'TCP', scope: 'all', portals: [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }], endpoints, affinity: { type: 'None', timeoutSeconds: 0 } };
    try {
      await units.apply({ close: [], recreate: [], open: [{ unit, listen: [{ host: '127.0.0.1', port: 0, proxyPort: true, portals: [] }] }], update: [] });
      const [status] = units.status();
      expect(status?.endpoints).toEqual(['127.0.0.1:9', '127.0.0.2:9']);
      expect(status?.setAside).toEqual([]);
      expect(random.calls).toBe(0);
      // A reader that needs the balancer's own list (a pick would too) makes it: the shuffle draws.
      expect(units.endpoints(unit.id)?.map((e) => e.addr).sort()).toEqual(['127.0.0.1:9', '127.0.0.2:9']);
      expect(random.calls).toBeGreaterThan(0);
    } finally {
      await units.shutdown(0);
    }
  });
});
