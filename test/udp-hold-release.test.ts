import { afterEach, describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { type Endpoint, toEndpoint } from '../src/core/model.js';
import type { ProxyUnit } from '../src/core/units.js';
import { MAX_HELD_DATAGRAMS, UdpProxySocket } from '../src/io/net/udp-proxy.js';
import { boundUdp, captureLogger, udpEcho, waitUntil } from './helpers/proxy-fixtures.js';

const LO = '127.0.0.1';
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

function unit(holdWhenEmptyMs: number): ProxyUnit {
  return {
    id: 'default/dns:dns',
    servicePort: 'default/dns:dns',
    service: 'default/dns',
    protocol: 'UDP',
    scope: 'all',
    portals: [],
    endpoints: [],
    affinity: { type: 'None', timeoutSeconds: 10800 },
    holdWhenEmptyMs,
  };
}

describe('hold-when-empty (UDP): releasing the queue', () => {
  it('sends every datagram one client queued, in order, when an endpoint appears (not only the first 64)', async () => {
    const balancer = new RoundRobinBalancer({ clock: systemClock, random: Math.random });
    const proxy = new UdpProxySocket({ name: 'default/dns:dns', balancer, logger: captureLogger('warn').logger, holdWhenEmptyMs: 30_000 });
    cleanups.push(() => proxy.close());
    const { port } = await proxy.listen({ host: LO, port: 0 });
    const client = await boundUdp();
    cleanups.push(() => client.close());
    const replies: string[] = [];
    client.on('message', (m) => replies.push(m.toString()));
    // Within the hold's own bounds (MAX_HELD_DATAGRAMS, 1 MiB): every one of them is queued.
    const n = 100;
    expect(n).toBeLessThan(MAX_HELD_DATAGRAMS);
    for (let i = 0; i < n; i++) client.send(`d${i}`, port, LO);
    await waitUntil(() => proxy.stats.held === n, `${n} datagrams queued`);
    const echo = await udpEcho(LO);
    cleanups.push(() => echo.close());
    const eps: Endpoint[] = [toEndpoint({ ip: LO, port: echo.port })];
    balancer.setEndpoints(eps);
    proxy.update({ ...unit(30_000), endpoints: eps });
    // Every queued datagram has gone somewhere: sent on, or dropped.
    await waitUntil(() => proxy.stats.bytesToEndpoint + proxy.stats.udpDatagramsDropped > 0 && replies.length + proxy.stats.udpDatagramsDropped >= n, 'the queue to be sent');
    expect(proxy.stats.udpDatagramsDropped).toBe(0);
    await waitUntil(() => replies.length === n, `${n} replies`);
    expect(replies).toEqual(Array.from({ length: n }, (_, i) => `d${i}`));
  });
});
