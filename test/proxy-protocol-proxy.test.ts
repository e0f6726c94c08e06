import type { V1EndpointSlice } from '@kubernetes/client-node';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { startProxy } from '../src/app.js';
import { buildConfig } from '../src/config.js';
import { PROXY_PROTOCOL_ANNOTATION } from '../src/core/annotations.js';
import type { LoadBalancer } from '../src/core/balancer/load-balancer.js';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { toEndpoint, type PortalAddress } from '../src/core/model.js';
import type { ProxyUnit } from '../src/core/units.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket, type TcpProxySocketOptions } from '../src/io/net/tcp-proxy.js';
import { UdpReceiveBuffers } from '../src/io/net/udp-receive-buffers.js';
import { proxySocketFactory } from '../src/proxy-sockets.js';
import type { Dialer } from '../src/seams/dialer.js';
import { FailingUpstream } from './helpers/failing-upstream.js';
import type { Portal } from '../src/seams/portal.js';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { loopbackProxier } from './helpers/make-proxier.js';
import { freePort, waitFor } from './helpers/net.js';
import { endpointSlice, service } from './helpers/objects.js';
import { captureLogger, closedTcpPort, connectTo, withDeadline } from './helpers/proxy-fixtures.js';
import { LOOPBACK6_FULL, readHeader, recordingBackend, type RecordingBackend } from './helpers/proxy-header.js';

/**
 * PROXY protocol v2 toward the endpoints, on real loopback sockets: the bytes an endpoint receives
 * (the header, then the client's bytes untouched), on every upstream of a connection, and the
 * annotation from a Service to the socket through the whole proxy.
 */

const LO = '127.0.0.1';
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function backend(host = LO, marker?: string): Promise<RecordingBackend> {
  const b = await recordingBackend(host, marker);
  cleanups.push(() => b.close());
  return b;
}

async function proxyFor(balancer: LoadBalancer, opts: Partial<TcpProxySocketOptions> & { host?: string; nat?: boolean } = {}): Promise<{ proxy: TcpProxySocket; port: number }> {
  const { host = LO, nat, ...rest } = opts;
  const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer: new DirectDialer(), logger: captureLogger('warn').logger, proxyProtocol: true, ...rest });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  const { port } = await proxy.listen({ host, port: 0, ...(nat ? { nat } : {}) });
  return { proxy, port };
}

/** Send `data` and our FIN through the proxy; what the endpoint received, and the client's own port. */
async function through(port: number, data: string, host = LO): Promise<{ clientPort: number; reply: string }> {
  const { socket, got } = await connectTo(port, host);
  cleanups.push(() => socket.destroy());
  const clientPort = socket.localPort as number;
  socket.end(data);
  const reply = (await withDeadline(got.ended, 5000, 'the endpoint\'s answer')).toString();
  return { clientPort, reply };
}

async function ipv6Works(): Promise<boolean> {
  const s = createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.listen(0, '::1', () => resolve());
    });
    return true;
  } catch {
    return false;
  } finally {
    s.close();
  }
}

describe('the header an endpoint receives', () => {
  it('IPv4: signature, PROXY over TCP/IPv4, the client\'s address and port, the address it connected to, then its bytes unchanged', async () => {
    const be = await backend();
    const { port } = await proxyFor(FakeBalancer.of([be.port]));
    const got = be.next();
    const { clientPort, reply } = await through(port, 'ping\n');
    const bytes = await got;
    expect(reply).toBe('done');
    expect(bytes.subarray(0, 16).toString('hex')).toBe('0d0a0d0a000d0a515549540a' + '21' + '11' + '000c');
    expect(bytes.length).toBe(28 + 5);
    expect(readHeader(bytes)).toEqual({ command: 0x21, family: 0x11, source: LO, sourcePort: clientPort, destination: LO, destinationPort: port, rest: Buffer.from('ping\n') });
  });

  it('IPv6 (::1): PROXY over TCP/IPv6', async (t) => {
    if (!(await ipv6Works())) t.skip('::1 cannot be bound here');
    const be = await backend('::1');
    const { port } = await proxyFor(FakeBalancer.of([be.port], { ip: '::1' }), { host: '::1' });
    const got = be.next();
    const { clientPort } = await through(port, 'ping6\n', '::1');
    const bytes = await got;
    expect(bytes.length).toBe(52 + 6);
    expect(readHeader(bytes)).toEqual({ command: 0x21, family: 0x21, source: LOOPBACK6_FULL, sourcePort: clientPort, destination: LOOPBACK6_FULL, destinationPort: port, rest: Buffer.from('ping6\n') });
  });

  it('a connection NATed to a proxy port names the Service portal it came to, when the portals leave no choice', async () => {
    const be = await backend();
    const cluster: PortalAddress = { kind: 'clusterIP', ip: '10.96.0.10', port: 80 };
    const one = await proxyFor(FakeBalancer.of([be.port]), { nat: true, portals: [cluster] });
    let got = be.next();
    const { clientPort } = await through(one.port, 'a');
    expect(readHeader(await got)).toMatchObject({ source: LO, sourcePort: clientPort, destination: '10.96.0.10', destinationPort: 80 });
    // A node port too: the client may have come to either, so the local address it is.
    const two = await proxyFor(FakeBalancer.of([be.port]), { nat: true, portals: [cluster, { kind: 'nodePort', ip: '', port: 30080 }] });
    got = be.next();
    await through(two.port, 'b');
    expect(readHeader(await got)).toMatchObject({ destination: LO, destinationPort: two.port });
  });

  it('sends nothing extra with the annotation off, and a header on the next connection once an update turns it on', async () => {
    const be = await backend();
    const { proxy, port } = await proxyFor(FakeBalancer.of([be.port]), { proxyProtocol: false });
    let got = be.next();
    await through(port, 'plain');
    expect((await got).toString()).toBe('plain');
    const unit: ProxyUnit = { id: 'default/web:http', servicePort: 'default/web:http', service: 'default/web', protocol: 'TCP', scope: 'all', portals: [], endpoints: [], affinity: { type: 'None', timeoutSeconds: 10800 }, proxyProtocol: 'v2' };
    proxy.update(unit);
    got = be.next();
    const { clientPort } = await through(port, 'framed');
    expect(readHeader(await got)).toMatchObject({ sourcePort: clientPort, rest: Buffer.from('framed') });
  });

  it('a connection held for want of endpoints carries the header of its accept when it is dialed', async () => {
    const be = await backend();
    const balancer = new RoundRobinBalancer({ clock: systemClock, random: Math.random });
    const { proxy, port } = await proxyFor(balancer, { holdWhenEmptyMs: 30_000 });
    const { socket, got } = await connectTo(port);
    cleanups.push(() => socket.destroy());
    const clientPort = socket.localPort;
    socket.end('held');
    await waitFor(() => proxy.stats.held === 1, 'the connection to be held');
    const received = be.next();
    const eps = [toEndpoint({ ip: LO, port: be.port })];
    balancer.setEndpoints(eps);
    proxy.update({ id: 'default/web:http', servicePort: 'default/web:http', service: 'default/web', protocol: 'TCP', scope: 'all', portals: [], endpoints: eps, affinity: { type: 'None', timeoutSeconds: 10800 }, holdWhenEmptyMs: 30_000, proxyProtocol: 'v2' });
    expect(readHeader(await received)).toMatchObject({ sourcePort: clientPort, destinationPort: port, rest: Buffer.from('held') });
    expect((await withDeadline(got.ended, 5000, 'the answer')).toString()).toBe('done');
  });
});

describe('a retry to the next endpoint', () => {
  it('after a refused dial: the endpoint that answers gets one header', async () => {
    const be = await backend();
    const dead = await closedTcpPort();
    const balancer = FakeBalancer.of([dead, be.port]);
    const { port } = await proxyFor(balancer);
    const got = be.next();
    const { clientPort } = await through(port, 'retry');
    const bytes = await got;
    expect(balancer.calls.map((c) => c.picked)).toEqual([`${LO}:${dead}`, `${LO}:${be.port}`]);
    const header = readHeader(bytes);
    expect(header).toMatchObject({ sourcePort: clientPort, destinationPort: port, rest: Buffer.from('retry') });
  });

  it('after an upstream failed early with the header and bytes it took: the next gets a fresh header, then the bytes, once', async () => {
    const be = await backend();
    const failed: FailingUpstream[] = [];
    const dialer: Dialer = {
      dial: async (req) => {
        if (req.endpoint.port !== 1) return new DirectDialer().dial(req);
        const u = new FailingUpstream(28 + 5);
        failed.push(u);
        return u;
      },
    };
    const balancer = FakeBalancer.of([1, be.port]);
    const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer, logger: captureLogger('warn').logger, proxyProtocol: true });
    cleanups.push(async () => {
      proxy.destroyAll();
      await proxy.close();
    });
    const { port } = await proxy.listen({ host: LO, port: 0 });
    const got = be.next();
    const { clientPort } = await through(port, 'hello');
    const bytes = await got;
    // The failed upstream was sent the header first, then the client's bytes.
    expect(failed).toHaveLength(1);
    const first = Buffer.concat((failed[0] as FailingUpstream).written);
    expect(readHeader(first)).toMatchObject({ sourcePort: clientPort, rest: Buffer.from('hello') });
    // The next one: its own header and the bytes, not the first header replayed as the client's.
    expect(bytes.length).toBe(28 + 5);
    expect(readHeader(bytes)).toMatchObject({ source: LO, sourcePort: clientPort, destination: LO, destinationPort: port, rest: Buffer.from('hello') });
  });
});

describe('a unit behind a NAT portal (proxy ports, as the iptables portal asks for)', () => {
  it('the proxy port is bound as NATed: the header names the Service\'s address, not the proxy port', async () => {
    const be = await backend();
    const { logger } = captureLogger('warn');
    // The iptables portal's listen specs without its rules: a proxy port per unit (whose traffic
    // the rules would NAT there), nothing to program.
    const portal: Portal = {
      mode: 'iptables',
      start: async () => undefined,
      listenSpecs: (unit) => [{ host: LO, port: 0, proxyPort: true, portals: unit.portals }],
      sync: async () => ({ errors: [] }),
      cleanup: async () => undefined,
    };
    const settings = { udpIdleTimeoutMs: 30_000, maxUdpSessions: 100, tcpKeepAliveMs: 0, tcpIdleTimeoutMs: 0, holdMaxPerServicePort: 10, holdMaxPerNode: 10 };
    const { proxier } = loopbackProxier(logger, proxySocketFactory(settings, logger, new UdpReceiveBuffers({ logger })), portal);
    cleanups.push(() => proxier.shutdown(0));
    const svc = service({ name: 'web', clusterIP: '10.96.0.10', ports: [{ name: 'http', port: 80 }] }) as { metadata: Record<string, unknown> };
    svc.metadata.annotations = { [PROXY_PROTOCOL_ANNOTATION]: 'v2' };
    proxier.sink.upsertService(svc);
    proxier.sink.upsertEndpointSlice(endpointSlice({ service: 'web', ports: [{ name: 'http', port: be.port }], endpoints: [{ ip: LO }] }) as unknown as V1EndpointSlice);
    await proxier.setSynced();
    const proxyPort = proxier.status()[0]?.proxyPort as number;
    expect(proxyPort).toBeGreaterThan(0);
    const got = be.next();
    const { clientPort } = await through(proxyPort, 'natted');
    expect(readHeader(await got)).toEqual({ command: 0x21, family: 0x11, source: LO, sourcePort: clientPort, destination: '10.96.0.10', destinationPort: 80, rest: Buffer.from('natted') });
  });
});

describe('the annotation through the whole proxy (loopback portal)', () => {
  /** The loopback portal's address for ClusterIP 10.96.9.9. */
  const HOST = '127.96.9.9';

  async function cluster(): Promise<{ api: FakeApiServer; kubeconfig: string }> {
    const api = await FakeApiServer.start();
    cleanups.push(() => api.close());
    const dir = mkdtempSync(join(tmpdir(), 'kup-pp-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const kubeconfig = join(dir, 'kubeconfig');
    writeFileSync(kubeconfig, api.kubeconfigYaml());
    return { api, kubeconfig };
  }

  function web(port: number, value: string, rv: string): Record<string, unknown> {
    const svc = service({ name: 'web', clusterIP: '10.96.9.9', ports: [{ name: 'http', port }, { name: 'dns', port: 53, protocol: 'UDP' }], resourceVersion: rv }) as { metadata: Record<string, unknown> };
    svc.metadata.annotations = { [PROXY_PROTOCOL_ANNOTATION]: value };
    return svc;
  }

  it('a bad value: one warning naming the Service and the annotation, and the Service is served without a header; v2 then turns it on', async () => {
    const { api, kubeconfig } = await cluster();
    const be = await backend('127.0.22.1');
    const port = await freePort(HOST);
    api.apply('services', web(port, 'v1', '1'));
    api.apply('endpointslices', endpointSlice({ service: 'web', ports: [{ name: 'http', port: be.port }], endpoints: [{ ip: '127.0.22.1' }] }));
    const { logger, records } = captureLogger('info');
    const proxy = await startProxy(buildConfig({ kubeconfig, hostnameOverride: 'node-a', metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', iptablesMinSyncPeriod: '0s' }), logger);
    cleanups.push(() => proxy.stop(100));
    const status = (): Record<string, unknown> | undefined => proxy.proxier.status().find((u) => u.name === 'default/web:http') as Record<string, unknown> | undefined;
    await waitFor(() => (status()?.endpoints as string[] | undefined)?.length === 1, 'the endpoint');

    let got = be.next();
    await through(port, 'plain', HOST);
    expect((await got).toString()).toBe('plain');
    proxy.proxier.resync();
    await proxy.proxier.syncNow();
    const said = records.filter((r) => r.msg.includes(PROXY_PROTOCOL_ANNOTATION));
    expect(said.map((r) => [r.level, r.msg])).toEqual([[40, `Service default/web: metadata.annotations["${PROXY_PROTOCOL_ANNOTATION}"]: "v1" is not one of v2; no PROXY protocol header is sent`]]);
    expect(status()).not.toHaveProperty('proxyProtocol');

    api.apply('services', web(port, 'v2', '2'));
    await waitFor(() => status()?.proxyProtocol === 'v2', 'the annotation to reach the unit');
    // TCP only: the UDP port of the same Service is relayed as ever.
    expect(proxy.proxier.status().find((u) => u.name === 'default/web:dns')).not.toHaveProperty('proxyProtocol');
    got = be.next();
    const { clientPort } = await through(port, 'framed', HOST);
    // The loopback portal: the Service's address as the client saw it is its 127/8 address.
    expect(readHeader(await got)).toEqual({ command: 0x21, family: 0x11, source: LO, sourcePort: clientPort, destination: HOST, destinationPort: port, rest: Buffer.from('framed') });
  });

  it('--dialer port-forward: the header goes through the tunnel to the pod', async () => {
    const { api, kubeconfig } = await cluster();
    const pod = await backend(LO, 'END\n');
    api.portForward.addPod('default', 'web-0', { 8080: pod.port });
    const port = await freePort(HOST);
    const svc = web(port, 'v2', '1');
    (svc as { spec: { ports: Array<Record<string, unknown>> } }).spec.ports = [{ name: 'http', port, targetPort: 8080, protocol: 'TCP' }];
    api.apply('services', svc);
    api.apply('endpointslices', endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.244.0.10', pod: 'web-0' }] }));
    const proxy = await startProxy(buildConfig({ kubeconfig, dialer: 'port-forward', hostnameOverride: 'laptop', metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', iptablesMinSyncPeriod: '0s' }), captureLogger('warn').logger);
    cleanups.push(() => proxy.stop(100));
    await waitFor(() => proxy.proxier.status().find((u) => u.name === 'default/web:http')?.endpoints.length === 1, 'the endpoint');
    const got = pod.next();
    // A marker ends the pod's read: the kubelet does not pass the client's FIN on.
    const { clientPort, reply } = await through(port, 'tunnelled END\n', HOST);
    expect(reply).toBe('done');
    expect(readHeader(await got)).toEqual({ command: 0x21, family: 0x11, source: LO, sourcePort: clientPort, destination: HOST, destinationPort: port, rest: Buffer.from('tunnelled END\n') });
  });
});
