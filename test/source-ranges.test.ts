import { connect } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { toEndpoint } from '../src/core/model.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { UdpProxySocket } from '../src/io/net/udp-proxy.js';
import { localUnitSet } from './helpers/local-unit-set.js';
import type { ProxyUnit } from '../src/core/units.js';
import { freePort } from './helpers/net.js';
import { boundUdp, captureLogger, tcpBackend, udpAsk, udpEcho, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * spec.loadBalancerSourceRanges where the proxy listens on the load balancer's own address (bind
 * portal): a client from inside the ranges is served, one from outside is refused, on real
 * loopback sockets, each client bound to its own source address in 127/8. (The iptables portal
 * redirects only the ranges: test/rules-iptables.test.ts, against real iptables.)
 */

const LISTEN = '127.0.77.1';
const INSIDE = '127.0.77.9';
const OUTSIDE = '127.0.78.9';
const RANGES = ['127.0.77.0/24', 'fd00:77::/64'];

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** What a TCP client from `from` gets: the echo of what it sent, or how it ended. */
function tcpFrom(from: string, port: number, host = LISTEN): Promise<string> {
  return withDeadline(new Promise<string>((resolve) => {
    const s = connect({ host, port, localAddress: from });
    let got = '';
    s.on('data', (d: Buffer) => {
      got += d.toString();
      if (got === 'hi') {
        s.destroy();
        resolve('echo');
      }
    });
    s.once('connect', () => s.write('hi'));
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
    s.once('close', () => resolve(got === 'hi' ? 'echo' : 'closed'));
  }), 5000, `a TCP answer to ${from}`);
}

describe('load-balancer source ranges on the portal\'s own address', () => {
  it('TCP: serves a client inside the ranges, resets one outside and counts it', async () => {
    const echo = await tcpBackend();
    cleanups.push(() => echo.close());
    const balancer = new RoundRobinBalancer({ clock: systemClock, random: Math.random });
    balancer.setEndpoints([toEndpoint({ ip: '127.0.0.1', port: echo.port })]);
    const proxy = new TcpProxySocket({ name: 'default/web:https', balancer, dialer: new DirectDialer(), logger: captureLogger('warn').logger });
    cleanups.push(async () => {
      proxy.destroyAll();
      await proxy.close();
    });
    const { port } = await proxy.listen({ host: LISTEN, port: 0, sources: RANGES });
    expect(await tcpFrom(INSIDE, port)).toBe('echo');
    expect(await tcpFrom(OUTSIDE, port)).toBe('ECONNRESET');
    expect(proxy.stats.sourceRejects).toBe(1);
    expect(proxy.stats.accepted).toBe(1);
  });

  it('UDP: answers a client inside the ranges, drops what one outside sends and counts it', async () => {
    const echo = await udpEcho('127.0.0.1', 'be');
    cleanups.push(() => echo.close());
    const balancer = new RoundRobinBalancer({ clock: systemClock, random: Math.random });
    balancer.setEndpoints([toEndpoint({ ip: '127.0.0.1', port: echo.port })]);
    const proxy = new UdpProxySocket({ name: 'default/dns:dns', balancer, logger: captureLogger('warn').logger });
    cleanups.push(() => proxy.close());
    const { port } = await proxy.listen({ host: LISTEN, port: 0, sources: RANGES });
    const inside = await boundUdp(INSIDE);
    const outside = await boundUdp(OUTSIDE);
    cleanups.push(() => {
      inside.close();
      outside.close();
    });
    expect((await udpAsk(inside, port, LISTEN, 'q')).msg.toString()).toBe('be:q');
    await expect(udpAsk(outside, port, LISTEN, 'q', 300)).rejects.toThrow(/timed out/);
    expect(proxy.stats.sourceRejects).toBe(1);
    // Dropped before any session: the echo saw the inside client's datagram only.
    expect(echo.sizes).toHaveLength(1);
  });

  it('the unit set hands a listener on a load balancer\'s own address its ranges; another portal\'s listener takes every client', async () => {
    const echo = await tcpBackend();
    cleanups.push(() => echo.close());
    const logger = captureLogger('warn').logger;
    const units = localUnitSet({ logger });
    cleanups.push(() => units.shutdown(0));
    const port = await freePort(LISTEN);
    const extPort = await freePort('127.0.77.2');
    const lbPortal = { kind: 'loadBalancer' as const, ip: LISTEN, port, sourceRanges: RANGES };
    const extPortal = { kind: 'externalIP' as const, ip: '127.0.77.2', port: extPort };
    // Ranges of the other family only: as with kube-proxy, every source.
    const v6Port = await freePort('127.0.77.3');
    const v6OnlyPortal = { kind: 'loadBalancer' as const, ip: '127.0.77.3', port: v6Port, sourceRanges: ['fd00:77::/64'] };
    const unit: ProxyUnit = { id: 'default/web:https', servicePort: 'default/web:https', service: 'default/web', protocol: 'TCP', scope: 'all', portals: [lbPortal, extPortal, v6OnlyPortal], endpoints: [toEndpoint({ ip: '127.0.0.1', port: echo.port })], affinity: { type: 'None', timeoutSeconds: 0 } };
    await units.apply({ close: [], recreate: [], update: [], open: [{ unit, listen: [{ host: LISTEN, port, portals: [lbPortal] }, { host: '127.0.77.2', port: extPort, portals: [extPortal] }, { host: '127.0.77.3', port: v6Port, portals: [v6OnlyPortal] }] }] });
    expect(await tcpFrom(OUTSIDE, v6Port, '127.0.77.3')).toBe('echo');
    expect(await tcpFrom(INSIDE, port)).toBe('echo');
    expect(await tcpFrom(OUTSIDE, port)).toBe('ECONNRESET');
    // The other portal's address serves everyone: the ranges are the load balancer's only.
    expect(await tcpFrom(OUTSIDE, extPort, '127.0.77.2')).toBe('echo');
  });
});

