import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { PlanTotals, planService } from '../src/core/plan.js';
import { endpointSlice, service } from './helpers/objects.js';

const NODE = { name: 'node-a' };

/** A LoadBalancer-style Service with externalTrafficPolicy Local: it gets a health check node port. */
function lbLocal(ports: Array<{ name: string; port: number; nodePort: number }>): V1Service {
  const svc = service({ name: 'web', clusterIP: '10.96.0.10', ports, externalTrafficPolicy: 'Local' }) as { spec: Record<string, unknown> };
  svc.spec.type = 'LoadBalancer';
  svc.spec.healthCheckNodePort = 32000;
  return svc;
}

describe('planService', () => {
  it('counts the distinct local ready endpoint IPs over all ports for the health check, as kube-proxy', () => {
    const svc = lbLocal([{ name: 'http', port: 80, nodePort: 30080 }, { name: 'https', port: 443, nodePort: 30443 }]);
    const slices = [
      // http: two local pods; https: a third local pod and one of the two again; a remote and an unready one.
      endpointSlice({ service: 'web', name: 'web-http', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.0.0.1', nodeName: 'node-a' }, { ip: '10.0.0.2', nodeName: 'node-a' }, { ip: '10.0.9.9', nodeName: 'node-b' }] }),
      endpointSlice({ service: 'web', name: 'web-https', ports: [{ name: 'https', port: 8443 }], endpoints: [{ ip: '10.0.0.3', nodeName: 'node-a' }, { ip: '10.0.0.1', nodeName: 'node-a' }, { ip: '10.0.0.4', nodeName: 'node-a', ready: false }] }),
    ] as unknown as V1EndpointSlice[];
    const plan = planService('default/web', svc, slices, NODE);
    // Distinct IPs 10.0.0.1, .2, .3: three (the largest per-port count would say two).
    expect(plan.health).toEqual({ service: 'default/web', healthCheckNodePort: 32000, localEndpoints: 3 });
    expect(plan.units.map((u) => u.id)).toEqual(['default/web:http', 'default/web:http (external)', 'default/web:https', 'default/web:https (external)']);
  });

  it('plans nothing for an absent Service, and says why a skipped one is skipped', () => {
    expect(planService('default/gone', undefined, [], NODE)).toEqual({ units: [], noLocal: { internal: 0, external: 0 }, notices: [] });
    const headless = service({ name: 'db', ports: [{ name: 'pg', port: 5432 }] }) as { spec: Record<string, unknown> };
    headless.spec.clusterIP = 'None';
    headless.spec.clusterIPs = ['None'];
    expect(planService('default/db', headless as unknown as V1Service, [], NODE).skipped).toMatch(/headless/);
  });
});

describe('PlanTotals', () => {
  it('keeps node-wide sums per Service, replacing a Service\'s share when it is planned again', () => {
    const totals = new PlanTotals();
    const plan = (internal: number, external: number, hc?: number) => ({ units: [], notices: [], noLocal: { internal, external }, ...(hc ? { health: { service: 'x', healthCheckNodePort: hc, localEndpoints: 0 } } : {}) });
    totals.set('default/a', plan(1, 1, 32000));
    totals.set('default/b', plan(0, 2));
    expect(totals.noLocalEndpoints()).toEqual({ internal: 1, external: 3 });
    expect(totals.serviceHealth()).toHaveLength(1);
    totals.set('default/a', plan(0, 0));
    expect(totals.noLocalEndpoints()).toEqual({ internal: 0, external: 2 });
    expect(totals.serviceHealth()).toEqual([]);
    totals.set('default/b', undefined);
    expect(totals.noLocalEndpoints()).toEqual({ internal: 0, external: 0 });
  });
});
