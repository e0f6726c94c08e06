import type { Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { toEndpoint } from '../src/core/model.js';
import { Totals } from '../src/core/stats-ledger.js';
import { renderServicePortMetrics } from '../src/io/http/service-port-metrics.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { UdpProxySocket } from '../src/io/net/udp-proxy.js';
import type { LoadBalancer } from '../src/core/balancer/load-balancer.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { boundUdp, captureLogger, clientOutcome, closedTcpPort, closedUdpPort, connectTo, exchange, tcpBackend, udpAsk, udpEcho, waitUntil, withDeadline } from './helpers/proxy-fixtures.js';

const LO = '127.0.0.1';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function backend(onConn?: (s: Socket) => void): Promise<number> {
  const b = await tcpBackend(LO, onConn);
  cleanups.push(() => b.close());
  return b.port;
}

async function tcpProxy(balancer: LoadBalancer): Promise<{ proxy: TcpProxySocket; port: number }> {
  const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer: new DirectDialer(), logger: captureLogger('warn').logger, dialTimeoutsMs: [250, 250] });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  return { proxy, port: (await proxy.listen({ host: LO, port: 0 })).port };
}

describe('passive health: what a TCP connection reports', () => {
  it('a refused dial as a failure, and an endpoint that answers as fine, once per connection', async () => {
    const refused = toEndpoint({ ip: LO, port: await closedTcpPort() });
    const good = toEndpoint({ ip: LO, port: await backend() });
    const balancer = new FakeBalancer([refused, good]);
    const { proxy, port } = await tcpProxy(balancer);
    const { socket, got } = await connectTo(port);
    for (const chunk of ['a', 'b', 'c']) {
      socket.write(chunk);
      await got.until(got.bytes().length + 1);
    }
    socket.end();
    await withDeadline(got.ended, 5000, 'the end');
    await withDeadline(proxy.drained(), 5000, 'drained');
    expect(balancer.reports).toEqual([`${refused.addr} fail`, `${good.addr} ok`]);
  });

  it('a reset before any byte as a failure (whether the dial or the relay sees it); an orderly close without a byte as fine', async () => {
    const resets = toEndpoint({ ip: LO, port: await backend((s) => s.resetAndDestroy()) });
    const closes = toEndpoint({ ip: LO, port: await backend((s) => s.end()) });
    const resetting = new FakeBalancer([resets]);
    const one = await tcpProxy(resetting);
    expect((await clientOutcome(one.port, LO, 'x')).code).toBe('ECONNRESET');
    await withDeadline(one.proxy.drained(), 5000, 'drained');
    expect(resetting.reports.filter((r) => r === `${resets.addr} fail`).length).toBeGreaterThanOrEqual(1);
    expect(resetting.reports).not.toContain(`${resets.addr} ok`);
    // Reset once the relay runs: the connection, not the dial, sees it.
    const later = toEndpoint({ ip: LO, port: await backend((s) => setTimeout(() => s.resetAndDestroy(), 100)) });
    const resettingLater = new FakeBalancer([later]);
    const three = await tcpProxy(resettingLater);
    const { socket } = await connectTo(three.port);
    socket.resume();
    await withDeadline(new Promise((resolve) => socket.once('error', resolve)), 5000, 'the reset');
    await withDeadline(three.proxy.drained(), 5000, 'drained');
    expect(three.proxy.stats.dialFailures.other + three.proxy.stats.dialFailures.refused).toBe(0);
    expect(resettingLater.reports).toEqual([`${later.addr} fail`]);
    const closing = new FakeBalancer([closes]);
    const two = await tcpProxy(closing);
    expect((await exchange(two.port, 'x')).toString()).toBe('');
    await withDeadline(two.proxy.drained(), 5000, 'drained');
    expect(closing.reports).toEqual([`${closes.addr} ok`]);
  });

  it('sets a refusing endpoint aside after the consecutive failures, counts the ejection, and stops dialing it', async () => {
    const refused = toEndpoint({ ip: LO, port: await closedTcpPort() });
    const good = toEndpoint({ ip: LO, port: await backend() });
    const balancer = new RoundRobinBalancer({ clock: systemClock, random: Math.random, outlier: { consecutiveFailures: 2, baseEjectionMs: 60_000, maxEjectionMs: 60_000, maxEjectionPercent: 100 } });
    balancer.setEndpoints([refused, good]);
    const { proxy, port } = await tcpProxy(balancer);
    for (let i = 0; i < 12; i++) expect((await exchange(port, `${i}`)).toString()).toBe(`${i}`);
    expect(proxy.stats.dialFailures.refused).toBe(2);
    expect(proxy.stats.outlierEjections).toBe(1);
    const aside = balancer.load().find((l) => l.addr === refused.addr);
    expect(aside?.setAsideMs).toBeGreaterThan(50_000);
    await withDeadline(proxy.drained(), 5000, 'drained');
    expect(balancer.load().map((l) => l.active)).toEqual([0, 0]);
  });
});

describe('passive health: what a UDP session reports', () => {
  it('an ICMP refusal as a failure, the first reply as fine', async () => {
    const echo = await udpEcho();
    cleanups.push(() => echo.close());
    const refused = toEndpoint({ ip: LO, port: await closedUdpPort() });
    const good = toEndpoint({ ip: LO, port: echo.port });
    const balancer = new FakeBalancer([refused, good]);
    const proxy = new UdpProxySocket({ name: 'default/dns:dns', balancer, logger: captureLogger('warn').logger });
    cleanups.push(() => proxy.close());
    const { port } = await proxy.listen({ host: LO, port: 0 });
    const client = await boundUdp();
    cleanups.push(() => client.close());
    client.send('lost', port, LO);
    await waitUntil(() => balancer.reports.length === 1, 'the refusal');
    expect((await udpAsk(client, port, LO, 'q1')).msg.toString()).toBe('q1');
    expect((await udpAsk(client, port, LO, 'q2')).msg.toString()).toBe('q2');
    expect(balancer.reports).toEqual([`${refused.addr} fail`, `${good.addr} ok`]);
  });
});

describe('the metrics of these features', () => {
  it('renders ejections, held and expired holds per service port', () => {
    const totals = new Totals();
    totals.outlierEjections = 2;
    totals.held = 3;
    totals.heldTotal = 7;
    totals.holdExpired = 1;
    const text = renderServicePortMetrics([{ labels: { servicePort: 'default/web:http', protocol: 'TCP', scope: 'all' }, totals }]);
    const labels = 'service_port="default/web:http",protocol="TCP",scope="all"';
    expect(text).toContain(`kube_userspace_proxy_outlier_ejections_total{${labels}} 2`);
    expect(text).toContain(`kube_userspace_proxy_held{${labels}} 3`);
    expect(text).toContain(`kube_userspace_proxy_held_total{${labels}} 7`);
    expect(text).toContain(`kube_userspace_proxy_hold_expired_total{${labels}} 1`);
  });
});
