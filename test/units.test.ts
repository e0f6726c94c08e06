import { describe, expect, it } from 'vitest';
import { toEndpoint, type ServicePort } from '../src/core/model.js';
import { diffUnits, planUnits } from '../src/core/units.js';
import { servicePort } from './helpers/service-port.js';

function sp(over: Partial<ServicePort> = {}): ServicePort {
  return servicePort('default/web:http', { clusterIPs: ['10.96.0.80', 'fd00::80'], ...over });
}

const a = toEndpoint({ ip: '10.0.0.1', port: 8080 });
const b = toEndpoint({ ip: '10.0.0.2', port: 8080, nodeName: 'n1' });

describe('planUnits', () => {
  it('serves every ClusterIP, externalIP, LB IP and node port from one unit when the policies agree', () => {
    const units = planUnits(sp({ nodePort: 30080, externalIPs: ['192.0.2.10'], loadBalancerIPs: ['198.51.100.7'] }), { clusterEndpoints: [a, b], externalEndpoints: [a, b] });
    expect(units).toHaveLength(1);
    expect(units[0]!.scope).toBe('all');
    expect(units[0]!.portals.map((p) => `${p.kind} ${p.ip} ${p.port}`)).toEqual([
      'clusterIP 10.96.0.80 80',
      'clusterIP fd00::80 80',
      'externalIP 192.0.2.10 80',
      'loadBalancer 198.51.100.7 80',
      'nodePort  30080',
    ]);
  });

  it('splits external traffic into its own unit when the policies differ', () => {
    const units = planUnits(sp({ nodePort: 30080, externalTrafficPolicy: 'Local' }), { clusterEndpoints: [a, b], externalEndpoints: [b] });
    expect(units.map((u) => [u.id, u.scope, u.endpoints.map((e) => e.addr)])).toEqual([
      ['default/web:http', 'cluster', ['10.0.0.1:8080', '10.0.0.2:8080']],
      ['default/web:http (external)', 'external', ['10.0.0.2:8080']],
    ]);
  });

  it('keeps one unit when a Local external policy has no external portal to apply to', () => {
    expect(planUnits(sp({ externalTrafficPolicy: 'Local' }), { clusterEndpoints: [a], externalEndpoints: [] })).toHaveLength(1);
  });
});

describe('diffUnits', () => {
  const [u1] = planUnits(sp(), { clusterEndpoints: [a], externalEndpoints: [a] });
  it('updates in place when only endpoints change', () => {
    const [u2] = planUnits(sp(), { clusterEndpoints: [a, b], externalEndpoints: [a, b] });
    const d = diffUnits([u1!], [u2!]);
    expect(d.update).toHaveLength(1);
    expect(d.open.length + d.close.length + d.recreate.length).toBe(0);
  });

  it('recreates when the port or protocol changes', () => {
    const [p] = planUnits(sp({ port: 81 }), { clusterEndpoints: [a], externalEndpoints: [a] });
    const [q] = planUnits(sp({ protocol: 'UDP' }), { clusterEndpoints: [a], externalEndpoints: [a] });
    expect(diffUnits([u1!], [p!]).recreate).toHaveLength(1);
    expect(diffUnits([u1!], [q!]).recreate).toHaveLength(1);
  });

  it('recreates when a load balancer\'s source ranges change: its portal\'s rules change with them', () => {
    const lb = (ranges?: string[]): ServicePort => sp({ loadBalancerIPs: ['198.51.100.7'], ...(ranges ? { loadBalancerSourceRanges: ranges } : {}) });
    const [open] = planUnits(lb(), { clusterEndpoints: [a], externalEndpoints: [a] });
    const [narrow] = planUnits(lb(['203.0.113.0/24']), { clusterEndpoints: [a], externalEndpoints: [a] });
    const [narrower] = planUnits(lb(['203.0.113.0/25']), { clusterEndpoints: [a], externalEndpoints: [a] });
    expect(narrow!.portals.find((p) => p.kind === 'loadBalancer')).toEqual({ kind: 'loadBalancer', ip: '198.51.100.7', port: 80, sourceRanges: ['203.0.113.0/24'] });
    expect(narrow!.portals.find((p) => p.kind === 'clusterIP')?.sourceRanges).toBeUndefined();
    expect(diffUnits([open!], [narrow!]).recreate).toHaveLength(1);
    expect(diffUnits([narrow!], [narrower!]).recreate).toHaveLength(1);
  });

  it('opens new and closes removed units', () => {
    const [other] = planUnits(sp({ key: 'default/web:metrics' }), { clusterEndpoints: [], externalEndpoints: [] });
    const d = diffUnits([u1!], [other!]);
    expect(d.open.map((u) => u.id)).toEqual(['default/web:metrics']);
    expect(d.close.map((u) => u.id)).toEqual(['default/web:http']);
  });
});
