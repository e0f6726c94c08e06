import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { toEndpoint } from '../src/core/model.js';
import { planService } from '../src/core/plan.js';
import { translateService } from '../src/core/translate.js';
import { validateEndpointSlice } from '../src/core/validate.js';
import { PortForwardDialer } from '../src/io/port-forward/port-forward-dialer.js';
import { captureLogger } from './helpers/proxy-fixtures.js';
import { endpointSlice, service } from './helpers/objects.js';

/** What the port-forward dialer needs from the plan: each endpoint's pod, and what it cannot reach. */

const node = { name: 'laptop' };
const reach = new PortForwardDialer({ opener: { open: () => Promise.reject(new Error('unused')) }, logger: captureLogger('warn').logger }).reach;

function web(): V1Service {
  return service({ name: 'web', ports: [{ name: 'http', port: 80, targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }] });
}

function slice(endpoints: Array<{ ip: string; pod?: string }>): V1EndpointSlice {
  return endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }], endpoints }) as unknown as V1EndpointSlice;
}

describe('the pod behind an endpoint', () => {
  it("is the slice endpoint's targetRef of kind Pod, in the slice's namespace when the ref names none", () => {
    const s = slice([{ ip: '10.244.0.5', pod: 'web-0' }, { ip: '10.244.0.6' }]);
    const eps = s.endpoints ?? [];
    (eps[1] as { targetRef?: object }).targetRef = { kind: 'Node', name: 'node-1' };
    const extra = { addresses: ['10.244.0.7'], conditions: { ready: true }, targetRef: { kind: 'Pod', name: 'web-2' } };
    s.endpoints = [...eps, extra];
    const http = translateService(web(), [s]).ports[0];
    expect(http?.endpoints.map((e) => [e.ip, e.targetPod])).toEqual([
      ['10.244.0.5', { namespace: 'default', name: 'web-0' }],
      ['10.244.0.6', undefined],
      ['10.244.0.7', { namespace: 'default', name: 'web-2' }],
    ]);
  });

  it('is checked: a targetRef whose name is not a string is one problem naming the field', () => {
    const s = slice([{ ip: '10.244.0.5', pod: 'web-0' }]);
    ((s.endpoints ?? [])[0] as { targetRef: { name: unknown } }).targetRef.name = 42;
    expect(validateEndpointSlice(s)).toEqual([expect.objectContaining({ field: 'endpoints[0].targetRef.name', message: 'must be a string, got 42' })]);
  });

  it('moves the balancer to the new pod when a pod IP is reused by another pod', () => {
    const b = new RoundRobinBalancer({ clock: { now: () => 0 }, random: () => 0.5 });
    b.setEndpoints([toEndpoint({ ip: '10.244.0.5', port: 80, targetPod: { namespace: 'default', name: 'web-0' } })]);
    b.setEndpoints([toEndpoint({ ip: '10.244.0.5', port: 80, targetPod: { namespace: 'default', name: 'web-7' } })]);
    expect(b.nextEndpoint('', false)?.targetPod?.name).toBe('web-7');
  });
});

describe('the plan with the port-forward dialer', () => {
  it('leaves endpoints without a pod out of the balancer, and lists them with why', () => {
    const plan = planService('default/web', web(), [slice([{ ip: '10.244.0.5', pod: 'web-0' }, { ip: '192.0.2.9' }])], node, reach);
    const http = plan.units.find((u) => u.id === 'default/web:http');
    expect(http?.endpoints.map((e) => e.addr)).toEqual(['10.244.0.5:8080']);
    expect(http?.unreachable).toEqual([{ endpoint: '192.0.2.9:8080', reason: expect.stringMatching(/^no pod behind it/) }]);
    expect(plan.notices).toContain(`port "http": endpoint 192.0.2.9:8080 left out: ${reach.endpoint({ ip: '', port: 0, ready: true, serving: true, terminating: false }) ?? ''}`);
  });

  it('lists a UDP port as not served, with why, and opens nothing for it', () => {
    const plan = planService('default/web', web(), [slice([{ ip: '10.244.0.5', pod: 'web-0' }])], node, reach);
    expect(plan.units.map((u) => u.id)).toEqual(['default/web:http']);
    expect(plan.notServed).toEqual([{ servicePort: 'default/web:dns', protocol: 'UDP', reason: 'UDP is not carried by port-forward (TCP only)' }]);
    expect(plan.notices).toContain('UDP port "dns" is not served: UDP is not carried by port-forward (TCP only)');
  });

  it('changes nothing without a reach policy (the direct dialer)', () => {
    const plan = planService('default/web', web(), [slice([{ ip: '10.244.0.5', pod: 'web-0' }, { ip: '192.0.2.9' }])], node);
    expect(plan.units.map((u) => [u.id, u.endpoints.length, u.unreachable])).toEqual([['default/web:http', 2, undefined], ['default/web:dns', 2, undefined]]);
    expect(plan.notServed).toBeUndefined();
  });
});
