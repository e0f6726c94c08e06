import { describe, it, expect } from 'vitest';
import { categorizeEndpoints } from '../src/core/endpoints.js';
import type { EndpointInfo, NodeInfo, ServicePort } from '../src/core/model.js';
import { servicePort } from './helpers/service-port.js';

const NODE: NodeInfo = { name: 'node1', zone: 'zone-a' };

function sp(endpoints: EndpointInfo[], over: Partial<ServicePort> = {}): ServicePort {
  return servicePort('default/web:http', { endpoints, ...over });
}

/** An endpoint at 10.0.0.<n>:8080; ready unless told otherwise. */
function ep(n: number, over: Partial<EndpointInfo> = {}): EndpointInfo {
  const ready = over.ready ?? true;
  return { ip: `10.0.0.${n}`, port: 8080, ready, serving: over.serving ?? ready, terminating: false, ...over };
}
const terminating = (n: number, over: Partial<EndpointInfo> = {}): EndpointInfo => ep(n, { ready: false, serving: true, terminating: true, ...over });

const ips = (eps: Array<{ ip: string }>): string[] => eps.map((e) => e.ip);
const NODE_PORT = { nodePort: 30080 };

describe('categorizeEndpoints: cluster traffic policy', () => {
  it('uses the ready endpoints, as Endpoints in endpoint order (IP, then port)', () => {
    const r = categorizeEndpoints(sp([ep(3), ep(1, { nodeName: 'node2' }), ep(2, { ready: false })]), NODE);
    expect(r.clusterEndpoints).toEqual([
      { ip: '10.0.0.1', port: 8080, addr: '10.0.0.1:8080', nodeName: 'node2' },
      { ip: '10.0.0.3', port: 8080, addr: '10.0.0.3:8080' },
    ]);
    expect(r.useTopology).toBe(false);
  });

  it('falls back to serving-and-terminating endpoints when none is ready', () => {
    const r = categorizeEndpoints(sp([terminating(1), ep(2, { ready: false }), terminating(3, { serving: false }), terminating(4)]), NODE);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1', '10.0.0.4']);
  });

  it('ignores terminating endpoints while any endpoint is ready', () => {
    expect(ips(categorizeEndpoints(sp([terminating(1), ep(2)]), NODE).clusterEndpoints)).toEqual(['10.0.0.2']);
  });

  it('returns nothing for no endpoints, or none usable', () => {
    expect(categorizeEndpoints(sp([]), NODE)).toEqual({ clusterEndpoints: [], externalEndpoints: [], localReadyEndpoints: 0, useTopology: false });
    expect(categorizeEndpoints(sp([ep(1, { ready: false })]), NODE).clusterEndpoints).toEqual([]);
  });

  it('formats IPv6 endpoints as [ip]:port', () => {
    expect(categorizeEndpoints(sp([{ ...ep(1), ip: 'fd00::1' }]), NODE).clusterEndpoints[0]?.addr).toBe('[fd00::1]:8080');
  });
});

describe('categorizeEndpoints: internalTrafficPolicy Local', () => {
  const local = { internalTrafficPolicy: 'Local' as const };

  it('sends cluster traffic only to ready endpoints on this node', () => {
    const r = categorizeEndpoints(sp([ep(1, { nodeName: 'node1' }), ep(2, { nodeName: 'node2' }), ep(3, { nodeName: 'node1', ready: false })], local), NODE);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1']);
  });

  it('falls back to local serving-and-terminating endpoints, never remote ones', () => {
    const r = categorizeEndpoints(sp([terminating(1, { nodeName: 'node1' }), ep(2, { nodeName: 'node2' })], local), NODE);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1']);
  });

  it('has no endpoints when none is on this node, even with ready remote ones (the caller resets connections)', () => {
    const r = categorizeEndpoints(sp([ep(2, { nodeName: 'node2' }), ep(3)], local), NODE);
    expect(r.clusterEndpoints).toEqual([]);
  });

  it('leaves external traffic to all endpoints when the external policy is Cluster', () => {
    const r = categorizeEndpoints(sp([ep(1, { nodeName: 'node1' }), ep(2, { nodeName: 'node2' })], { ...local, ...NODE_PORT }), NODE);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1']);
    expect(ips(r.externalEndpoints)).toEqual(['10.0.0.1', '10.0.0.2']);
  });
});

describe('categorizeEndpoints: externalTrafficPolicy', () => {
  const eps = [ep(1, { nodeName: 'node1' }), ep(2, { nodeName: 'node2' }), terminating(3, { nodeName: 'node1' })];

  it('Cluster: external traffic goes where cluster traffic goes', () => {
    const r = categorizeEndpoints(sp(eps, NODE_PORT), NODE);
    expect(ips(r.externalEndpoints)).toEqual(['10.0.0.1', '10.0.0.2']);
    expect(r.externalEndpoints).toEqual(r.clusterEndpoints);
  });

  it('Local: external traffic only to local endpoints, cluster traffic still everywhere', () => {
    for (const over of [NODE_PORT, { externalIPs: ['192.0.2.1'] }, { loadBalancerIPs: ['203.0.113.1'] }]) {
      const r = categorizeEndpoints(sp(eps, { ...over, externalTrafficPolicy: 'Local' }), NODE);
      expect(ips(r.externalEndpoints)).toEqual(['10.0.0.1']);
      expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1', '10.0.0.2']);
    }
  });

  it('Local: falls back to local serving-and-terminating endpoints, and is empty with only remote ones', () => {
    const fallback = categorizeEndpoints(sp([terminating(1, { nodeName: 'node1' }), ep(2, { nodeName: 'node2' })], { ...NODE_PORT, externalTrafficPolicy: 'Local' }), NODE);
    expect(ips(fallback.externalEndpoints)).toEqual(['10.0.0.1']);
    expect(ips(fallback.clusterEndpoints)).toEqual(['10.0.0.2']);
    const none = categorizeEndpoints(sp([ep(2, { nodeName: 'node2' })], { ...NODE_PORT, externalTrafficPolicy: 'Local' }), NODE);
    expect(none.externalEndpoints).toEqual([]);
  });

  it('has no external endpoints for a port with no external portal', () => {
    expect(categorizeEndpoints(sp(eps), NODE).externalEndpoints).toEqual([]);
  });

  it('Local both ways: everything local', () => {
    const r = categorizeEndpoints(sp(eps, { ...NODE_PORT, externalTrafficPolicy: 'Local', internalTrafficPolicy: 'Local' }), NODE);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1']);
    expect(ips(r.externalEndpoints)).toEqual(['10.0.0.1']);
  });
});

describe('categorizeEndpoints: localReadyEndpoints', () => {
  it('counts ready endpoints on this node, not terminating or remote ones', () => {
    const r = categorizeEndpoints(sp([ep(1, { nodeName: 'node1' }), ep(2, { nodeName: 'node1' }), terminating(3, { nodeName: 'node1' }), ep(4, { nodeName: 'node2' })]), NODE);
    expect(r.localReadyEndpoints).toBe(2);
  });

  it('treats nothing as local when the node has no name', () => {
    expect(categorizeEndpoints(sp([ep(1, { nodeName: '' })]), { name: '' }).localReadyEndpoints).toBe(0);
  });
});

describe('categorizeEndpoints: topology hints', () => {
  const zoned = (n: number, zone: string, over: Partial<EndpointInfo> = {}): EndpointInfo => ep(n, { zone, zoneHints: [zone], ...over });

  it('PreferSameZone: every ready endpoint hinted and one for this zone -> only this zone\'s', () => {
    const r = categorizeEndpoints(sp([zoned(1, 'zone-a'), zoned(2, 'zone-b'), zoned(3, 'zone-a')]), NODE);
    expect(r.useTopology).toBe(true);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1', '10.0.0.3']);
  });

  it('honours a hint naming several zones', () => {
    const r = categorizeEndpoints(sp([zoned(1, 'zone-b', { zoneHints: ['zone-b', 'zone-a'] }), zoned(2, 'zone-b')]), NODE);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1']);
  });

  it('ignores hints when one ready endpoint lacks them', () => {
    const r = categorizeEndpoints(sp([zoned(1, 'zone-a'), zoned(2, 'zone-b'), ep(3)]), NODE);
    expect(r.useTopology).toBe(false);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1', '10.0.0.2', '10.0.0.3']);
  });

  it('does not let an unready endpoint without hints turn hints off', () => {
    const r = categorizeEndpoints(sp([zoned(1, 'zone-a'), zoned(2, 'zone-b'), ep(3, { ready: false })]), NODE);
    expect(r.useTopology).toBe(true);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1']);
  });

  it('ignores hints when none names this node\'s zone', () => {
    const r = categorizeEndpoints(sp([zoned(1, 'zone-b'), zoned(2, 'zone-c')]), NODE);
    expect(r.useTopology).toBe(false);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1', '10.0.0.2']);
  });

  it('ignores zone hints when the node has no zone label', () => {
    const r = categorizeEndpoints(sp([zoned(1, 'zone-a'), zoned(2, 'zone-b')]), { name: 'node1' });
    expect(r.useTopology).toBe(false);
    expect(ips(r.clusterEndpoints)).toHaveLength(2);
  });

  it('PreferSameNode: every ready endpoint has a node hint and one names this node -> only those', () => {
    const eps = [
      zoned(1, 'zone-a', { nodeName: 'node1', nodeHints: ['node1'] }),
      zoned(2, 'zone-a', { nodeName: 'node3', nodeHints: ['node3'] }),
      zoned(3, 'zone-b', { nodeName: 'node2', nodeHints: ['node2'] }),
    ];
    const r = categorizeEndpoints(sp(eps, { trafficDistribution: 'PreferSameNode' }), NODE);
    expect(r.useTopology).toBe(true);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1']);
  });

  it('falls back from node hints to zone hints when no node hint names this node', () => {
    const eps = [
      zoned(1, 'zone-a', { nodeHints: ['node3'] }),
      zoned(2, 'zone-b', { nodeHints: ['node2'] }),
    ];
    const r = categorizeEndpoints(sp(eps), NODE);
    expect(r.useTopology).toBe(true);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1']);
  });

  it('falls back from node hints to zone hints when one ready endpoint lacks a node hint', () => {
    const eps = [zoned(1, 'zone-a', { nodeHints: ['node1'] }), zoned(2, 'zone-a'), zoned(3, 'zone-b', { nodeHints: ['node2'] })];
    const r = categorizeEndpoints(sp(eps), NODE);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1', '10.0.0.2']);
  });

  it('without ready endpoints uses no topology and falls back to every serving-terminating one', () => {
    const r = categorizeEndpoints(sp([terminating(1, { zoneHints: ['zone-b'] }), terminating(2, { zoneHints: ['zone-a'] })]), NODE);
    expect(r.useTopology).toBe(false);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1', '10.0.0.2']);
  });

  it('reads no hints from spec.trafficDistribution alone: kube-proxy follows the hints the controller writes', () => {
    const r = categorizeEndpoints(sp([ep(1, { zone: 'zone-a' }), ep(2, { zone: 'zone-b' })], { trafficDistribution: 'PreferClose' }), NODE);
    expect(r.useTopology).toBe(false);
    expect(ips(r.clusterEndpoints)).toHaveLength(2);
  });

  it('applies topology to external Cluster traffic too, but never to Local policies', () => {
    const eps = [zoned(1, 'zone-a', { nodeName: 'node2' }), zoned(2, 'zone-b', { nodeName: 'node1' })];
    const cluster = categorizeEndpoints(sp(eps, NODE_PORT), NODE);
    expect(ips(cluster.externalEndpoints)).toEqual(['10.0.0.1']);
    const local = categorizeEndpoints(sp(eps, { ...NODE_PORT, externalTrafficPolicy: 'Local' }), NODE);
    expect(ips(local.externalEndpoints)).toEqual(['10.0.0.2']);
    expect(ips(local.clusterEndpoints)).toEqual(['10.0.0.1']);
  });

  it('computes no topology when only Local policies are in use', () => {
    const eps = [zoned(1, 'zone-a', { nodeName: 'node1' }), zoned(2, 'zone-b', { nodeName: 'node1' })];
    const r = categorizeEndpoints(sp(eps, { internalTrafficPolicy: 'Local' }), NODE);
    expect(r.useTopology).toBe(false);
    expect(ips(r.clusterEndpoints)).toEqual(['10.0.0.1', '10.0.0.2']);
  });
});
