import { describe, expect, it } from 'vitest';
import { familyHints, unitFamilies } from '../src/core/rules/families.js';
import { planUnits } from '../src/core/units.js';
import { servicePort } from './helpers/service-port.js';

describe('the node port families of a dual-stack Service', () => {
  const base = { clusterIPs: ['10.96.0.10', 'fd00::a'], nodePort: 30080, loadBalancerIPs: ['203.0.113.7'] };
  const famOfNodePortUnit = (etp: 'Cluster' | 'Local'): readonly number[] => {
    const units = planUnits(servicePort('default/web:http', { ...base, externalTrafficPolicy: etp }), { clusterEndpoints: [], externalEndpoints: [] });
    const hints = familyHints(units);
    const u = units.find((x) => x.portals.some((p) => p.kind === 'nodePort'))!;
    return unitFamilies(u, hints);
  };
  it('eTP Cluster serves the node port in both families', () => {
    expect(famOfNodePortUnit('Cluster')).toEqual([4, 6]);
  });
  it('eTP Local with an IPv4-only load-balancer IP serves the node port in both families too', () => {
    expect(famOfNodePortUnit('Local')).toEqual([4, 6]);
  });
});
