import { createServer, request, type Server } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { ServiceHealthServer, healthCheckHosts, serviceHealthBody } from '../src/io/http/service-health.js';
import { freePort } from './helpers/net.js';
import { captureLogger, clientOutcome } from './helpers/proxy-fixtures.js';

/** kube-proxy's healthCheckNodePort servers: one per Service, reconciled from the proxier's view. */

const servers: ServiceHealthServer[] = [];
const others: Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
  for (const o of others.splice(0)) await new Promise<void>((resolve) => o.close(() => resolve()));
});

function make(opts: { healthy?: () => boolean } = {}): { hs: ServiceHealthServer; records: ReturnType<typeof captureLogger>['records'] } {
  const { logger, records } = captureLogger('info');
  const hs = new ServiceHealthServer({ hosts: ['127.0.0.1'], logger, ...(opts.healthy ? { proxyHealthy: opts.healthy } : {}) });
  servers.push(hs);
  return { hs, records };
}

function ask(port: number, opts: { path?: string; method?: string } = {}): Promise<{ status: number; body: string; headers: Record<string, string | string[] | undefined> }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: opts.path ?? '/', method: opts.method ?? 'GET', timeout: 3000 }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
    });
    req.on('timeout', () => req.destroy(new Error('no answer')));
    req.on('error', reject);
    req.end();
  });
}

describe('the health check node port servers', () => {
  it('answer kube-proxy\'s body, byte for byte', () => {
    // kube-proxy: strings.Trim(dedent.Dedent(`{ "service": {...}, "localEndpoints": %d, "serviceProxyHealthy": %v }`), "\n")
    expect(serviceHealthBody('default/lb', 2, true)).toBe('{\n\t"service": {\n\t\t"namespace": "default",\n\t\t"name": "lb"\n\t},\n\t"localEndpoints": 2,\n\t"serviceProxyHealthy": true\n}');
  });

  it('say 200 with local endpoints and 503 without, on any path, with the endpoint weight header', async () => {
    const { hs } = make();
    const port = await freePort();
    await hs.sync([{ service: 'shop/lb', healthCheckNodePort: port, localEndpoints: 2 }]);
    const ok = await ask(port, { path: '/healthz' });
    expect(ok.status).toBe(200);
    expect(ok.headers['content-type']).toBe('application/json');
    expect(ok.headers['x-content-type-options']).toBe('nosniff');
    expect(ok.headers['x-load-balancing-endpoint-weight']).toBe('2');
    expect(JSON.parse(ok.body)).toEqual({ service: { namespace: 'shop', name: 'lb' }, localEndpoints: 2, serviceProxyHealthy: true });
    expect((await ask(port, { path: '/anything', method: 'POST' })).status).toBe(200);

    await hs.sync([{ service: 'shop/lb', healthCheckNodePort: port, localEndpoints: 0 }]);
    const none = await ask(port);
    expect(none.status).toBe(503);
    expect(none.headers['x-load-balancing-endpoint-weight']).toBe('0');
    expect(JSON.parse(none.body)).toMatchObject({ localEndpoints: 0, serviceProxyHealthy: true });
  });

  it('say 503 while the proxy itself is unhealthy, whatever the endpoints', async () => {
    let healthy = false;
    const { hs } = make({ healthy: () => healthy });
    const port = await freePort();
    await hs.sync([{ service: 'default/lb', healthCheckNodePort: port, localEndpoints: 3 }]);
    const res = await ask(port);
    expect(res.status).toBe(503);
    expect(JSON.parse(res.body)).toMatchObject({ localEndpoints: 3, serviceProxyHealthy: false });
    healthy = true;
    expect((await ask(port)).status).toBe(200);
  });

  it('update counts in place, move a Service whose port changes, and close the ports of Services that left', async () => {
    const { hs } = make();
    const [p1, p2, p3] = [await freePort(), await freePort(), await freePort()];
    await hs.sync([
      { service: 'default/a', healthCheckNodePort: p1, localEndpoints: 1 },
      { service: 'default/b', healthCheckNodePort: p2, localEndpoints: 1 },
    ]);
    expect(hs.serving().map((s) => [s.service, s.addresses])).toEqual([
      ['default/a', [`127.0.0.1:${p1}`]],
      ['default/b', [`127.0.0.1:${p2}`]],
    ]);
    await hs.sync([
      { service: 'default/a', healthCheckNodePort: p1, localEndpoints: 4 },
      { service: 'default/b', healthCheckNodePort: p3, localEndpoints: 1 },
    ]);
    expect(JSON.parse((await ask(p1)).body)).toMatchObject({ localEndpoints: 4 });
    expect((await ask(p3)).status).toBe(200);
    expect((await clientOutcome(p2, '127.0.0.1')).code).toBe('ECONNREFUSED');
    await hs.sync([{ service: 'default/b', healthCheckNodePort: p3, localEndpoints: 1 }]);
    expect((await clientOutcome(p1, '127.0.0.1')).code).toBe('ECONNREFUSED');
    await hs.sync([]);
    expect(hs.serving()).toEqual([]);
    expect((await clientOutcome(p3, '127.0.0.1')).code).toBe('ECONNREFUSED');
  });

  it('report a port it cannot bind once, and bind it at a later sync once it is free', async () => {
    const { hs, records } = make();
    const port = await freePort();
    const squatter = createServer();
    others.push(squatter);
    await new Promise<void>((resolve) => squatter.listen(port, '127.0.0.1', resolve));
    const want = [{ service: 'default/lb', healthCheckNodePort: port, localEndpoints: 1 }];
    await hs.sync(want);
    await hs.sync(want);
    const errors = records.filter((r) => r.level === 50);
    expect(errors).toHaveLength(1);
    expect(errors[0]?.msg).toBe(`default/lb: cannot serve its health check node port ${port}: the port is in use by another process; retrying at the next sync`);
    expect(hs.serving()).toEqual([]);
    others.pop();
    await new Promise<void>((resolve) => squatter.close(() => resolve()));
    await hs.sync(want);
    expect((await ask(port)).status).toBe(200);
  });
});

describe('where the health check node ports listen', () => {
  const node = (ipv6: boolean) => ({
    addresses: () => [
      { ip: '127.0.0.1', family: 4 as const, iface: 'lo', internal: true },
      { ip: '192.0.2.7', family: 4 as const, iface: 'eth0', internal: false },
      { ip: '2001:db8::7', family: 6 as const, iface: 'eth0', internal: false },
    ],
    defaultRouteInterface: () => 'eth0',
    ipv6Enabled: () => ipv6,
  });

  it('follows the portal and --nodeport-addresses, as kube-proxy', () => {
    expect(healthCheckHosts('loopback', ['192.0.2.0/24'], node(true))).toEqual(['127.0.0.1']);
    expect(healthCheckHosts('iptables', [], node(true))).toEqual(['::']);
    expect(healthCheckHosts('bind', [], node(false))).toEqual(['0.0.0.0']);
    expect(healthCheckHosts('iptables', ['192.0.2.0/24', '2001:db8::/64'], node(true))).toEqual(['192.0.2.7', '2001:db8::7']);
    // No address matches: every address, as kube-proxy falls back.
    expect(healthCheckHosts('iptables', ['198.51.100.0/24'], node(true))).toEqual(['::']);
  });
});
