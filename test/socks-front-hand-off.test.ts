import { execFile } from 'node:child_process';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startProxy, type RunningProxy } from '../src/app.js';
import { buildConfig } from '../src/config.js';
import { roundRobinFactory } from '../src/core/balancer/round-robin.js';
import { systemClock } from '../src/core/clock.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { silentLogger } from '../src/log.js';
import type { LocalUnitSet } from '../src/proxier/unit-set.js';
import { freePort } from './helpers/net.js';
import { endpointSlice, list, service } from './helpers/objects.js';

/**
 * The front without the loopback portal's listeners: as on macOS without root, where no
 * 127.96.x.y address can be bound. On Linux every 127/8 address binds, so another socket holds the
 * Service's loopback address and port before the proxy starts (EADDRINUSE: the unit runs with its
 * listener failing, as /services says). The front hands each client to the unit's TCP proxy
 * socket itself, so curl still reaches the Service, round-robin over its two backends; a dial
 * that fails after the SOCKS reply is retried on the next endpoint; ClientIP affinity sees the
 * client's own address. The front's ordinary paths are in socks-front.test.ts.
 */

function curl(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile('curl', ['-sS', '--max-time', '10', ...args], (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1;
      resolve({ code, stdout, stderr });
    });
  });
}

async function httpBackend(host: string, name: string, port: number): Promise<HttpServer> {
  const server = createHttpServer((req, res) => res.end(`${name} ${req.url}\n`));
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  return server;
}

let dir: string;
let stateFile: string;
let servicePort: number;
let backendPort: number;
/** Holds 127.96.58.10:servicePort, and counts what reaches it (nothing should). */
let holder: Server;
const reachedHolder: Socket[] = [];
const closers: Array<() => unknown> = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-socks-hand-off-'));
  stateFile = join(dir, 'state.json');
  servicePort = await freePort('127.96.58.10');
  backendPort = await freePort('127.0.58.1');
  for (const [host, name] of [['127.0.58.1', 'a'], ['127.0.58.2', 'b']] as const) {
    const server = await httpBackend(host, name, backendPort);
    closers.push(() => {
      server.closeAllConnections();
      return new Promise((r) => server.close(r));
    });
  }
  holder = createServer((s) => {
    reachedHolder.push(s);
    s.destroy();
  });
  await new Promise<void>((resolve, reject) => {
    holder.once('error', reject);
    holder.listen(servicePort, '127.96.58.10', resolve);
  });
  closers.push(() => new Promise((r) => holder.close(r)));
  const port = { name: 'http', port: servicePort };
  const slicePort = [{ name: 'http', port: backendPort }];
  const tmp = `${stateFile}.tmp`;
  await writeFile(tmp, list([
    service({ name: 'web', clusterIP: '10.96.58.10', ports: [port, { name: 'dns', port: servicePort, protocol: 'UDP' }] }),
    endpointSlice({ service: 'web', ports: slicePort, endpoints: [{ ip: '127.0.58.1' }, { ip: '127.0.58.2' }] }),
    // 127.0.58.3 has nothing on the backend port: its dials are refused.
    service({ name: 'flaky', clusterIP: '10.96.58.11', ports: [port] }),
    endpointSlice({ service: 'flaky', ports: slicePort, endpoints: [{ ip: '127.0.58.3' }, { ip: '127.0.58.1' }] }),
    service({ name: 'sticky', clusterIP: '10.96.58.12', ports: [port], sessionAffinity: 'ClientIP' }),
    endpointSlice({ service: 'sticky', ports: slicePort, endpoints: [{ ip: '127.0.58.1' }, { ip: '127.0.58.2' }] }),
  ]));
  await rename(tmp, stateFile);
});

afterAll(async () => {
  for (const c of closers) await c();
  await rm(dir, { recursive: true, force: true });
});

describe('the SOCKS/CONNECT front where the loopback portal cannot listen', () => {
  let proxy: RunningProxy;
  let front: string;

  beforeAll(async () => {
    const config = buildConfig({ state: stateFile, portal: 'loopback', metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', iptablesMinSyncPeriod: '0s', logLevel: 'silent', socksBindAddress: '127.0.0.1:0' });
    proxy = await startProxy(config, silentLogger());
    front = proxy.names.socksAddress!;
  });

  afterAll(() => proxy.stop(100));

  it('reaches a Service whose listener failed (address in use), round-robin over its two backends', async () => {
    const web = proxy.units.status().find((u) => u.name === 'default/web:http');
    expect(web?.errors.join()).toContain('in use by another process');
    expect(web?.reachable).toEqual([]);
    const answers: string[] = [];
    for (let i = 0; i < 4; i++) {
      const args = i % 2 === 0 ? ['--socks5-hostname', front] : ['-p', '-x', `http://${front}`];
      const r = await curl([...args, `http://web.default:${servicePort}/x`]);
      expect(r.code, r.stderr).toBe(0);
      answers.push(r.stdout);
    }
    expect(new Set(answers)).toEqual(new Set(['a /x\n', 'b /x\n']));
    expect(answers[0]).not.toBe(answers[1]);
    // Through the Service port's own socket: its stats, and never the address's holder.
    const stats = proxy.units.stats().find((s) => s.unit.id === 'default/web:http')!.stats;
    expect(stats.accepted).toBe(4);
    expect(reachedHolder).toHaveLength(0);
  });

  it('retries a refused dial on the next endpoint although the SOCKS reply was already sent', async () => {
    for (let i = 0; i < 4; i++) {
      const r = await curl(['--socks5-hostname', front, `http://flaky.default:${servicePort}/`]);
      expect(r, `connection ${i}`).toMatchObject({ code: 0, stdout: 'a /\n' });
    }
    const stats = proxy.units.stats().find((s) => s.unit.id === 'default/flaky:http')!.stats;
    // At least one connection was dialed to the refusing endpoint first, and none gave up.
    expect(stats.dialAttempts).toBeGreaterThan(4);
    expect(stats.dialExhausted).toBe(0);
  });

  it('gives ClientIP affinity the client\'s own address, not the front\'s', async () => {
    const r = await curl(['--interface', '127.0.58.9', '--socks5-hostname', front, `http://sticky.default:${servicePort}/`]);
    expect(r.code, r.stderr).toBe(0);
    const entries = (proxy.units as LocalUnitSet).stickyEntries().find((e) => e.unit === 'default/sticky:http')?.updates ?? [];
    expect(entries.map((e) => e.clientIP)).toEqual(['127.0.58.9']);
  });

  it('hands off to running TCP units only', () => {
    const units = proxy.units as LocalUnitSet;
    expect(units.tcpHandOff('default/web:http')).toBeInstanceOf(TcpProxySocket);
    expect(units.tcpHandOff('default/web:dns')).toBeUndefined();
    expect(units.tcpHandOff('default/nope:http')).toBeUndefined();
  });
});

describe('TcpProxySocket.adopt', () => {
  it('takes no client once closed, and leaves it to the caller', async () => {
    const socket = new TcpProxySocket({ name: 'default/web:http', balancer: roundRobinFactory({ clock: systemClock, random: Math.random }), dialer: new DirectDialer(), logger: silentLogger() });
    await socket.close();
    const server = createServer((s) => s.destroy());
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const client = connect({ host: '127.0.0.1', port: (server.address() as { port: number }).port });
    client.on('error', () => undefined);
    try {
      expect(socket.adopt(client, 0)).toBe(false);
      expect(socket.active()).toBe(0);
      expect(client.listenerCount('data')).toBe(0);
    } finally {
      client.destroy();
      await new Promise((r) => server.close(r));
    }
  });
});
