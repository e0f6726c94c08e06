import { spawn, type ChildProcess } from 'node:child_process';
import type { Server } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { waitFor } from './helpers/net.js';
import { iptablesSkipReason, nsExec, reportSkip, run } from './helpers/netns.js';
import { endpointSlice, service } from './helpers/objects.js';

/**
 * A watch whose API server vanished without FIN or RST (host lost, path blackholed): the API
 * source must notice it in seconds, not at the watch's deadline (5 to 10 minutes), and watch again.
 *
 * Everything happens inside a network namespace the test creates. A child process in it opens a
 * listening socket and sends it here over IPC, so the fake API server in this process answers in
 * the namespace; the child then runs the built API source (dist/, what global-setup builds)
 * against it and reports what reaches its sink and its log. The test then DROPs, in both
 * directions, the connections of the open watches (matched by their client ports): their peer is
 * silent from then on, while a new connection still gets through, as after a fail-over.
 */
reportSkip('watch-dead-peer.test.ts', iptablesSkipReason);

/** Short keepalive idle time; libuv then probes every second, 10 times (see api-client.ts). */
const KEEPALIVE_IDLE_MS = 2000;

const CHILD = `
  const net = require('node:net');
  const { pathToFileURL } = require('node:url');
  const send = (m) => { if (process.connected) process.send(m); };
  const server = net.createServer();
  // Sent, then closed here: the copy in the test's process is the only one left to accept.
  server.listen(0, '127.0.0.1', () => process.send({ type: 'listening' }, server, () => server.close()));
  process.on('message', async (m) => {
    if (m.type !== 'start') return;
    const dist = (p) => import(pathToFileURL(process.cwd() + '/dist/src/' + p).href);
    const { KubeConfig } = require('@kubernetes/client-node');
    const [{ HttpKubeApi }, { ApiSource }, { createLogger }] = await Promise.all([dist('io/kube/api-client.js'), dist('io/kube/api-source.js'), dist('log.js')]);
    const kc = new KubeConfig();
    kc.loadFromString(m.kubeconfig);
    const logger = createLogger('debug', { write: (line) => send({ type: 'log', record: JSON.parse(line) }) });
    const key = (o) => (o.metadata.namespace || '') + '/' + o.metadata.name;
    const sink = { setNode: () => {} };
    for (const call of ['upsertService', 'upsertEndpointSlice']) sink[call] = (o) => send({ type: 'sink', call, key: key(o) });
    for (const call of ['deleteService', 'deleteEndpointSlice']) sink[call] = (ns, name) => send({ type: 'sink', call, key: ns + '/' + name });
    for (const call of ['replaceServices', 'replaceEndpointSlices']) sink[call] = (objs) => send({ type: 'sink', call, keys: objs.map(key) });
    const source = new ApiSource({
      api: new HttpKubeApi(kc, { requestTimeoutMs: 5000, keepAliveIdleMs: m.keepAliveIdleMs }),
      nodeName: 'node1',
      logger,
      backoff: { initialMs: 20, maxMs: 200 },
    });
    await source.start(sink);
    await source.synced;
    send({ type: 'synced' });
  });`;

interface ChildMessage {
  type: 'listening' | 'log' | 'sink' | 'synced';
  call?: string;
  key?: string;
  record?: { msg: string; err?: { message?: string; failure?: string } };
}

interface Client {
  child: ChildProcess;
  messages: ChildMessage[];
  /** The child's listening socket, once it has sent it. */
  listening: Promise<Server>;
  stderr(): string;
}

/** The child in `ns`, from the repository's root (it loads dist/ and node_modules from there). */
function startClient(ns: string): Client {
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', CHILD], { cwd: process.cwd(), stdio: ['ignore', 'ignore', 'pipe', 'ipc'] });
  const messages: ChildMessage[] = [];
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  const listening = new Promise<Server>((resolve, reject) => {
    child.on('message', (m: ChildMessage, handle: unknown) => {
      if (m.type === 'listening') resolve(handle as Server);
      else messages.push(m);
    });
    child.on('exit', (code) => reject(new Error(`the client in ${ns} exited ${code}: ${err}`)));
  });
  return { child, messages, listening, stderr: () => err };
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

describe.skipIf(iptablesSkipReason !== undefined)(`a watch whose API server vanished without FIN or RST${iptablesSkipReason ? ` [skipped: ${iptablesSkipReason}]` : ''}`, () => {
  it('is noticed by TCP keepalive; the source watches again on a new connection and a later change reaches the sink', async () => {
    const ns = `kup-${process.pid}-ka`;
    await run('ip', ['netns', 'add', ns]);
    cleanups.push(() => run('ip', ['netns', 'del', ns]));
    await nsExec(ns, 'ip', ['link', 'set', 'lo', 'up']);

    const client = startClient(ns);
    const exited = new Promise<void>((resolve) => client.child.on('exit', () => resolve()));
    cleanups.push(async () => {
      if (client.child.exitCode === null && client.child.signalCode === null) client.child.kill('SIGKILL');
      await exited;
    });
    const api = await FakeApiServer.start({ handle: await client.listening });
    cleanups.push(() => api.close());
    api.apply('services', service({ name: 'web', clusterIP: '10.96.1.1', ports: [{ name: 'http', port: 80 }] }));
    api.apply('endpointslices', endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.0.0.1' }] }));
    client.child.send({ type: 'start', kubeconfig: api.kubeconfigYaml(), keepAliveIdleMs: KEEPALIVE_IDLE_MS });
    const seen = (pred: (m: ChildMessage) => boolean, what: string, timeoutMs: number): Promise<ChildMessage> =>
      waitFor(() => client.messages.find(pred), `${what} (client stderr: ${client.stderr()})`, timeoutMs);
    await seen((m) => m.type === 'synced', 'the first lists', 20_000);
    await waitFor(() => api.watchCount() === 3, 'a watch of Services, EndpointSlices and the Node');

    const ports = api.watchClientPorts();
    const from = api.requests.length;
    // Both ends are in this namespace, and the server's end of a blackholed connection stays open:
    // keep connect() from picking a blackholed port again, as a reconnect elsewhere never would.
    await nsExec(ns, 'sysctl', ['-q', '-w', `net.ipv4.ip_local_reserved_ports=${ports.join(',')}`]);
    const rules = ports.flatMap((p) => [`-A INPUT -p tcp --sport ${p} -j DROP`, `-A INPUT -p tcp --dport ${p} -j DROP`]);
    await nsExec(ns, 'iptables-restore', ['--noflush'], { input: ['*filter', ...rules, 'COMMIT', ''].join('\n') });

    // The watches' own deadline is minutes away: only keepalive can end them this soon.
    const failed = await seen((m) => m.type === 'log' && (m.record?.msg.startsWith('watch of services failed') ?? false), 'the dead watch to fail', 30_000);
    // ETIMEDOUT from the socket: the kernel's keepalive probes went unanswered.
    expect(failed.record?.err).toMatchObject({ failure: 'Network', message: expect.stringContaining('ETIMEDOUT') });
    const resumed = await api.waitForWatch('services', { from, timeoutMs: 10_000 });
    expect(ports).not.toContain(resumed.clientPort);
    expect(resumed.query.resourceVersion).not.toBe('');

    api.apply('services', service({ name: 'after', clusterIP: '10.96.1.2', ports: [{ name: 'http', port: 80 }] }));
    await seen((m) => m.type === 'sink' && m.call === 'upsertService' && m.key === 'default/after', 'the change after the blackhole', 10_000);
  }, 60_000);
});
