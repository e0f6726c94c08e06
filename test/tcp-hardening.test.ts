import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { LoadBalancer } from '../src/core/balancer/load-balancer.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { backlogFromSomaxconn } from '../src/io/net/listen-backlog.js';
import { TcpProxySocket, type TcpProxySocketOptions } from '../src/io/net/tcp-proxy.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { captureLogger, waitUntil } from './helpers/proxy-fixtures.js';

const LO = '127.0.0.1';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function proxyFor(balancer: LoadBalancer, opts: Partial<TcpProxySocketOptions> = {}): Promise<{ proxy: TcpProxySocket; port: number }> {
  const { logger } = captureLogger('warn');
  const proxy = new TcpProxySocket({ name: 'default/web:http', balancer, dialer: new DirectDialer(), logger, ...opts });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  const { port } = await proxy.listen({ host: LO, port: 0 });
  return { proxy, port };
}

describe('the accept backlog', () => {
  const somaxconn = Number(readFileSync('/proc/sys/net/core/somaxconn', 'utf8').trim());

  /** Recv-Q (connections waiting for accept()) and Send-Q (the backlog) of a listening socket, from ss. */
  function listenQueues(port: number): { queued: number; backlog: number } {
    const out = execFileSync('ss', ['-Hltn', `sport = :${port}`], { encoding: 'utf8' }).trim();
    const [, queued, backlog] = out.split(/\s+/);
    return { queued: Number(queued), backlog: Number(backlog) };
  }

  it('is net.core.somaxconn, as the kernel reports it for the listener', async () => {
    const { port } = await proxyFor(new FakeBalancer([]));
    expect(listenQueues(port).backlog).toBe(somaxconn);
  });

  it('holds a burst of 1,000 connections made before the proxy could accept one', async () => {
    if (somaxconn < 1000) return; // this host caps every backlog below the burst
    const { proxy, port } = await proxyFor(new FakeBalancer([]));
    const clients: Socket[] = [];
    cleanups.push(() => clients.forEach((s) => s.destroy()));
    for (let i = 0; i < 1000; i++) clients.push(connect({ port, host: LO }).on('error', () => {}));
    // net.connect() calls connect() on the next tick; a tick queued after theirs runs before the
    // event loop can accept. Loopback handshakes complete within connect(), so every connection
    // is in the accept queue by then, or was dropped for want of room (and would be retried a
    // second later by its SYN's retransmission).
    const { queued } = await new Promise<{ queued: number }>((resolve) => process.nextTick(() => resolve(listenQueues(port))));
    expect(queued).toBe(1000);
    await waitUntil(() => proxy.stats.accepted === 1000, 'every connection to be accepted');
  });

  it('falls back to 4096 when somaxconn cannot be read', () => {
    expect(backlogFromSomaxconn('4096\n')).toBe(4096);
    expect(backlogFromSomaxconn('65535\n')).toBe(65535);
    expect(backlogFromSomaxconn(undefined)).toBe(4096);
    expect(backlogFromSomaxconn('0\n')).toBe(4096);
    expect(backlogFromSomaxconn('junk')).toBe(4096);
  });
});
