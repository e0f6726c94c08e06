import { mkdtemp, rm, writeFile, rename } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startProxy, type RunningProxy } from '../src/app.js';
import { buildConfig } from '../src/config.js';
import { createLogger } from '../src/log.js';
import { Writable } from 'node:stream';
import { endpointSlice, list, service } from './helpers/objects.js';
import { freePort, tcpEchoServer, tcpRequest, udpEchoServer, udpRequest, waitFor } from './helpers/net.js';

/**
 * The engine end to end, in-process, on real loopback sockets: a state file -> proxier ->
 * loopback portal -> TCP and UDP proxy sockets -> echo backends.
 */
let dir: string;
let stateFile: string;
let proxy: RunningProxy;
let port: number; // the Service port, TCP and UDP
let nodePort: number;
let backendPort: number;
const closers: Array<() => unknown> = [];
const logLines: string[] = [];
const logSink = new Writable({
  write(chunk: Buffer, _enc, cb) {
    logLines.push(...chunk.toString().split('\n').filter(Boolean));
    cb();
  },
});

const SVC_ADDR = '127.96.7.7'; // the loopback portal's address for ClusterIP 10.96.7.7

function objects(opts: { endpoints?: string[]; port?: number; withOther?: boolean; badPort?: boolean } = {}): string {
  const eps = opts.endpoints ?? ['127.0.20.1', '127.0.20.2'];
  const p = opts.port ?? port;
  const items: unknown[] = [
    service({ name: 'echo', clusterIP: '10.96.7.7', ports: [{ name: 'tcp', port: p, nodePort }, { name: 'udp', port: p, protocol: 'UDP' }] }),
    endpointSlice({ service: 'echo', ports: [{ name: 'tcp', port: backendPort }, { name: 'udp', port: backendPort, protocol: 'UDP' }], endpoints: eps.map((ip) => ({ ip })) }),
  ];
  if (opts.withOther !== false) {
    items.push(
      service({ name: 'other', clusterIP: '10.96.7.8', ports: [{ name: 'tcp', port: opts.badPort ? 70000 : p }] }),
      endpointSlice({ service: 'other', ports: [{ name: 'tcp', port: backendPort }], endpoints: [{ ip: '127.0.20.1' }] }),
    );
  }
  return list(items);
}

async function writeState(text: string): Promise<void> {
  // Write-then-rename, as editors and kubectl-driven scripts do.
  const tmp = `${stateFile}.tmp`;
  await writeFile(tmp, text);
  await rename(tmp, stateFile);
}

async function services(): Promise<Array<{ name: string; reachable: string[]; endpoints: string[]; active: number; protocol: string }>> {
  const res = await fetch(`http://${proxy.adminAddress}/services`);
  return ((await res.json()) as { services: never[] }).services;
}

function refused(host: string, p: number): Promise<boolean> {
  return tcpRequest(host, p, 'x', 1000).then(() => false, (err: NodeJS.ErrnoException) => err.code === 'ECONNREFUSED' || err.code === 'ECONNRESET');
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-engine-'));
  stateFile = join(dir, 'state.json');
  port = await freePort(SVC_ADDR);
  nodePort = await freePort('127.0.0.1');
  backendPort = await freePort('127.0.20.1');
  for (const [ip, name] of [['127.0.20.1', 'a'], ['127.0.20.2', 'b']] as const) {
    const t = await tcpEchoServer(ip, name, backendPort);
    const u = await udpEchoServer(ip, name, backendPort);
    closers.push(() => t.close(), () => u.close());
  }
  await writeState(objects());
  const config = buildConfig({ state: stateFile, metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', iptablesMinSyncPeriod: '0s', udpTimeout: '250ms', logLevel: 'silent' });
  proxy = await startProxy(config, createLogger('info', logSink));
  await waitFor(async () => (await services()).length === 3, 'the first sync');
});

afterAll(async () => {
  await proxy?.stop(100);
  for (const c of closers) await c();
  await rm(dir, { recursive: true, force: true });
});

describe('the engine from a state file', () => {
  it('proxies TCP to the endpoints round-robin, on the Service address and on the node port', async () => {
    const replies = new Set<string>();
    for (let i = 0; i < 4; i++) replies.add(await tcpRequest(SVC_ADDR, port, 'hello'));
    expect(replies).toEqual(new Set(['a:hello', 'b:hello']));
    expect(await tcpRequest('127.0.0.1', nodePort, 'np')).toMatch(/^[ab]:np$/);
  });

  it('proxies UDP on the same port number as the TCP port of the same Service', async () => {
    const reply = await udpRequest(SVC_ADDR, port, 'ping');
    expect(reply.toString()).toMatch(/^[ab]:ping$/);
  });

  it('reports every service port in /services', async () => {
    const s = await services();
    const tcp = s.find((x) => x.name === 'default/echo:tcp');
    expect(tcp).toMatchObject({ protocol: 'TCP', reachable: [`${SVC_ADDR}:${port}`, `127.0.0.1:${nodePort}`] });
    expect(tcp?.endpoints.sort()).toEqual([`127.0.20.1:${backendPort}`, `127.0.20.2:${backendPort}`]);
    expect(s.find((x) => x.name === 'default/echo:udp')).toMatchObject({ protocol: 'UDP', reachable: [`${SVC_ADDR}:${port}`] });
    // What the open-file check counts: every socket listening, here 2 + 1 + 1.
    expect(proxy.units.listenerCount()).toBe(s.reduce((n, x) => n + x.reachable.length, 0));
    expect(proxy.units.listenerCount()).toBe(4);
  });

  it('applies a live edit of the file to new connections', async () => {
    await writeState(objects({ endpoints: ['127.0.20.2'] }));
    await waitFor(async () => (await services()).find((x) => x.name === 'default/echo:tcp')?.endpoints.length === 1, 'the edit to apply');
    for (let i = 0; i < 4; i++) expect(await tcpRequest(SVC_ADDR, port, 'x')).toBe('b:x');
    await writeState(objects());
    await waitFor(async () => (await services()).find((x) => x.name === 'default/echo:tcp')?.endpoints.length === 2, 'the endpoints to come back');
  });

  it('keeps the last good state when an edit does not parse, and when an object does not validate', async () => {
    const before = logLines.length;
    await writeState('{"apiVersion": "v1", "kind": "List", "items": [');
    const error = await waitFor(() => logLines.slice(before).find((l) => l.includes('"level":50')), 'the parse error to be logged');
    expect(error).toContain('state.json');
    expect((await services()).length).toBe(3);
    expect(await tcpRequest(SVC_ADDR, port, 'still')).toMatch(/^[ab]:still$/);
    await writeState(objects({ badPort: true, endpoints: ['127.0.20.1'] }));
    await waitFor(async () => (await services()).find((x) => x.name === 'default/echo:tcp')?.endpoints.length === 1, 'the good part of the edit');
    // `other` has port 70000 in the file: one line names it and the field; its last good version keeps serving.
    expect(logLines.some((l) => l.includes('Service default/other') && l.includes('spec.ports[0].port'))).toBe(true);
    expect((await services()).find((x) => x.name === 'default/other:tcp')?.reachable).toEqual([`127.96.7.8:${port}`]);
    expect(await tcpRequest('127.96.7.8', port, 'o')).toBe('a:o');
    await writeState(objects());
  });

  it('keeps an established connection alive when its Service is removed', async () => {
    const sock: Socket = connect({ host: SVC_ADDR, port });
    const received: Buffer[] = [];
    sock.on('data', (d: Buffer) => received.push(d));
    await new Promise((r) => sock.once('connect', r));
    sock.write('one');
    await waitFor(() => Buffer.concat(received).toString().endsWith('one'), 'the first echo');
    await writeState(list([]));
    await waitFor(async () => (await services()).length === 0, 'the Service to go');
    expect(await refused(SVC_ADDR, port)).toBe(true);
    sock.write('two');
    await waitFor(() => Buffer.concat(received).toString().endsWith('onetwo'), 'the echo after removal');
    sock.destroy();
    await writeState(objects());
    await waitFor(async () => (await services()).length === 3, 'the Services to return');
  });

  it('recreates the listener when the port changes', async () => {
    const newPort = await freePort(SVC_ADDR);
    await writeState(objects({ port: newPort, withOther: false }));
    await waitFor(async () => (await services()).find((x) => x.name === 'default/echo:tcp')?.reachable[0] === `${SVC_ADDR}:${newPort}`, 'the new port');
    expect(await tcpRequest(SVC_ADDR, newPort, 'moved')).toMatch(/^[ab]:moved$/);
    expect((await udpRequest(SVC_ADDR, newPort, 'moved')).toString()).toMatch(/^[ab]:moved$/);
    expect(await refused(SVC_ADDR, port)).toBe(true);
    await writeState(objects());
    await waitFor(async () => (await services()).length === 3, 'the old port back');
  });
});
