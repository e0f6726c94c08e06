import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import { HOLD_WHEN_EMPTY_ANNOTATION, LOAD_BALANCER_ANNOTATION, PROXY_PROTOCOL_ANNOTATION, serviceAnnotations } from '../src/core/annotations.js';
import { planService } from '../src/core/plan.js';
import { translateService } from '../src/core/translate.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { LoopbackPortal } from '../src/io/portal/loopback-portal.js';
import { loopbackProxier } from './helpers/make-proxier.js';
import { endpointSlice, service } from './helpers/objects.js';
import { captureLogger, connectTo, waitUntil, withDeadline, tcpBackend } from './helpers/proxy-fixtures.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

function web(annotations: Record<string, unknown> = {}, rv = '1'): V1Service {
  const svc = service({ name: 'web', clusterIP: '10.96.0.10', ports: [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' }], resourceVersion: rv }) as { metadata: Record<string, unknown> };
  svc.metadata.annotations = { 'unrelated.example.com/x': 'y', ...annotations };
  return svc;
}

describe('annotations under kube-userspace-proxy.io/', () => {
  it('parses least-connections and a hold, and gives every port of the Service the same', () => {
    const { ports, notices } = translateService(web({ [LOAD_BALANCER_ANNOTATION]: 'least-connections', [HOLD_WHEN_EMPTY_ANNOTATION]: '1m30s' }), []);
    expect(notices).toEqual([]);
    expect(ports.map((p) => [p.key, p.loadBalancer, p.holdWhenEmptyMs])).toEqual([
      ['default/web:http', 'least-connections', 90_000],
      ['default/web:dns', 'least-connections', 90_000],
    ]);
    const plan = planService('default/web', web({ [LOAD_BALANCER_ANNOTATION]: 'least-connections', [HOLD_WHEN_EMPTY_ANNOTATION]: '30s' }), [], { name: 'n' });
    expect(plan.units.map((u) => [u.loadBalancer, u.holdWhenEmptyMs])).toEqual([['least-connections', 30_000], ['least-connections', 30_000]]);
  });

  it('parses proxy-protocol v2 for the TCP ports only: UDP is relayed as ever', () => {
    const { ports, notices } = translateService(web({ [PROXY_PROTOCOL_ANNOTATION]: ' v2 ' }), []);
    expect(notices).toEqual([]);
    expect(ports.map((p) => [p.key, p.proxyProtocol])).toEqual([
      ['default/web:http', 'v2'],
      ['default/web:dns', undefined],
    ]);
    const plan = planService('default/web', web({ [PROXY_PROTOCOL_ANNOTATION]: 'v2' }), [], { name: 'n' });
    expect(plan.units.map((u) => [u.protocol, u.proxyProtocol])).toEqual([['TCP', 'v2'], ['UDP', undefined]]);
  });

  it('says so once when the Service has no TCP port for the PROXY header to go on', () => {
    const dns = service({ name: 'dns', clusterIP: '10.96.0.53', ports: [{ name: 'dns', port: 53, protocol: 'UDP' }] }) as { metadata: Record<string, unknown> };
    dns.metadata.annotations = { [PROXY_PROTOCOL_ANNOTATION]: 'v2' };
    const { ports, notices } = translateService(dns, []);
    expect(ports.map((p) => p.proxyProtocol)).toEqual([undefined]);
    expect(notices).toEqual([`${PROXY_PROTOCOL_ANNOTATION}: the Service has no TCP port; a PROXY header goes in front of TCP connections only, so it has no effect here`]);
  });

  it('leaves the model as before when absent, round-robin or zero', () => {
    for (const a of [{}, { [LOAD_BALANCER_ANNOTATION]: 'round-robin', [HOLD_WHEN_EMPTY_ANNOTATION]: '0s' }]) {
      const { ports, notices } = translateService(web(a), []);
      expect(notices).toEqual([]);
      expect(ports[0]).not.toHaveProperty('loadBalancer');
      expect(ports[0]).not.toHaveProperty('holdWhenEmptyMs');
    }
  });

  it.each([
    [{ [LOAD_BALANCER_ANNOTATION]: 'fewest' }, `metadata.annotations["${LOAD_BALANCER_ANNOTATION}"]: "fewest" is not one of round-robin, least-connections; served round-robin`],
    [{ [HOLD_WHEN_EMPTY_ANNOTATION]: '30' }, `metadata.annotations["${HOLD_WHEN_EMPTY_ANNOTATION}"]: "30" is not a duration (a Go duration such as 30s or 2m); connections are not held`],
    [{ [HOLD_WHEN_EMPTY_ANNOTATION]: '1h' }, `metadata.annotations["${HOLD_WHEN_EMPTY_ANNOTATION}"]: "1h" is longer than the most a connection may be held (5m); connections are not held`],
    [{ [HOLD_WHEN_EMPTY_ANNOTATION]: 30 }, `metadata.annotations["${HOLD_WHEN_EMPTY_ANNOTATION}"]: must be a string; ignored`],
    [{ 'kube-userspace-proxy.io/hold-when-emtpy': '30s' }, 'metadata.annotations["kube-userspace-proxy.io/hold-when-emtpy"]: unknown annotation; known under kube-userspace-proxy.io/: load-balancer, hold-when-empty, proxy-protocol'],
    [{ [PROXY_PROTOCOL_ANNOTATION]: 'v1' }, `metadata.annotations["${PROXY_PROTOCOL_ANNOTATION}"]: "v1" is not one of v2; no PROXY protocol header is sent`],
    [{ [PROXY_PROTOCOL_ANNOTATION]: 'true' }, `metadata.annotations["${PROXY_PROTOCOL_ANNOTATION}"]: "true" is not one of v2; no PROXY protocol header is sent`],
  ])('reports a bad value once, naming the annotation, and serves as if absent: %j', (annotations, notice) => {
    const { ports, notices } = translateService(web(annotations), []);
    expect(notices).toEqual([notice]);
    expect(ports).toHaveLength(2);
    expect(ports[0]).not.toHaveProperty('loadBalancer');
    expect(ports[0]).not.toHaveProperty('holdWhenEmptyMs');
    expect(ports[0]).not.toHaveProperty('proxyProtocol');
    expect(serviceAnnotations(web(annotations)).notices).toEqual([notice]);
  });

  it('logs a bad value once with the Service, however often the Service is synced', async () => {
    const { logger, records } = captureLogger('warn');
    const { proxier } = loopbackProxier(logger, (unit, balancer, stats) => new TcpProxySocket({ name: unit.id, balancer, dialer: new DirectDialer(), logger, stats }));
    cleanups.push(() => proxier.shutdown(0));
    proxier.sink.upsertService(web({ [LOAD_BALANCER_ANNOTATION]: 'fewest' }, '1'));
    await proxier.setSynced();
    proxier.sink.upsertService(web({ [LOAD_BALANCER_ANNOTATION]: 'fewest' }, '2'));
    await proxier.syncNow();
    const lines = records.filter((r) => r.msg.includes(LOAD_BALANCER_ANNOTATION));
    expect(lines.map((r) => r.msg)).toEqual([`Service default/web: metadata.annotations["${LOAD_BALANCER_ANNOTATION}"]: "fewest" is not one of round-robin, least-connections; served round-robin`]);
  });
});

describe('a changed annotation reaches the running unit', () => {
  it('switches the balancer and the hold without recreating the socket, and a held connection goes on when the slice comes', async () => {
    const backend = await tcpBackend();
    cleanups.push(() => backend.close());
    const portal = new LoopbackPortal();
    const { logger } = captureLogger('warn');
    const made: TcpProxySocket[] = [];
    const { proxier } = loopbackProxier(logger, (unit, balancer, stats) => {
      const s = new TcpProxySocket({ name: unit.id, balancer, dialer: new DirectDialer(), logger, stats, ...(unit.holdWhenEmptyMs ? { holdWhenEmptyMs: unit.holdWhenEmptyMs } : {}) });
      made.push(s);
      return s;
    }, portal);
    cleanups.push(() => proxier.shutdown(0));
    const tcpOnly = (annotations: Record<string, string>, rv: string): V1Service => {
      const svc = web(annotations, rv) as unknown as { spec: { ports: unknown[] } };
      svc.spec.ports = svc.spec.ports.slice(0, 1);
      return svc as unknown as V1Service;
    };
    proxier.sink.upsertService(tcpOnly({}, '1'));
    await proxier.setSynced();
    const status = () => proxier.status()[0];
    expect(status()).toMatchObject({ loadBalancer: 'round-robin', held: 0, setAside: [] });
    expect(status()).not.toHaveProperty('holdWhenEmpty');

    proxier.sink.upsertService(tcpOnly({ [LOAD_BALANCER_ANNOTATION]: 'least-connections', [HOLD_WHEN_EMPTY_ANNOTATION]: '30s' }, '2'));
    await waitUntil(() => status()?.holdWhenEmpty === '30s', 'the annotation to reach the unit');
    expect(status()?.loadBalancer).toBe('least-connections');
    expect(made).toHaveLength(1);

    const host = portal.addressOf('default/web') as string;
    const { socket, got } = await connectTo(80, host);
    cleanups.push(() => socket.destroy());
    socket.write('held');
    await waitUntil(() => status()?.held === 1, '/services to show the held connection');
    proxier.sink.upsertEndpointSlice(endpointSlice({ service: 'web', ports: [{ name: 'http', port: backend.port }], endpoints: [{ ip: '127.0.0.1' }] }) as unknown as V1EndpointSlice);
    await got.until(4);
    expect(got.bytes().toString()).toBe('held');
    socket.end();
    await withDeadline(got.ended, 5000, 'the end');
    expect(status()?.held).toBe(0);
  });
});
