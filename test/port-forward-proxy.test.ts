import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { startProxy, type RunningProxy } from '../src/app.js';
import { buildConfig, type RawOptions } from '../src/config.js';
import { runCli } from './helpers/cli.js';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { freePort, tcpRequest, waitFor } from './helpers/net.js';
import { endpointSlice, service } from './helpers/objects.js';
import { captureLogger, connectTo, tcpBackend, withDeadline, type LogRecord, type TcpBackend } from './helpers/proxy-fixtures.js';

/**
 * `--dialer port-forward` end to end: the proxy as startProxy composes it (and once as the CLI),
 * watching the fixture API server, which also serves pods/portforward to loopback "pods". No pod IP
 * is ever dialed (they are 10.244/16 and 192.0.2/24, unreachable here): every byte goes through a
 * tunnel. The loopback portal puts each Service at its 127/8 address (ClusterIP 10.98.7.x ->
 * 127.98.7.x), no root.
 */

type Obj = Record<string, unknown>;
const WEB_ADDR = '127.98.7.10';
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

/**
 * An echo "pod" answering `name:` + what it gets, which ends the connection after a newline. The
 * pod must end first to end quickly: containerd never passes the client's FIN to the pod, and
 * closes a forward only a second after one direction ended (fake-kubelet.ts).
 */
async function podBackend(name: string): Promise<TcpBackend> {
  const b = await tcpBackend('127.0.0.1', (s) => {
    s.write(`${name}:`);
    s.on('data', (d: Buffer) => {
      s.write(d);
      if (d.toString().endsWith('\n')) s.end();
    });
  });
  cleanups.push(() => b.close());
  return b;
}

interface Cluster {
  api: FakeApiServer;
  kubeconfig: string;
  port: number;
}

async function cluster(): Promise<Cluster> {
  const api = await FakeApiServer.start();
  cleanups.push(() => api.close());
  const dir = mkdtempSync(join(tmpdir(), 'kup-pf-'));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  const kubeconfig = join(dir, 'kubeconfig');
  writeFileSync(kubeconfig, api.kubeconfigYaml());
  return { api, kubeconfig, port: await freePort(WEB_ADDR) };
}

function webService(c: Cluster, extra: Partial<Parameters<typeof service>[0]> = {}, namespace = 'default'): Obj {
  return service({ name: 'web', namespace, clusterIP: '10.98.7.10', ports: [{ name: 'http', port: c.port, targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }], ...extra });
}

/** The Service's slice: pods by name (IPs 10.244.0.x), plus endpoints without a pod (192.0.2.x). */
function webSlice(pods: string[], podless: string[] = [], namespace = 'default'): Obj {
  return endpointSlice({
    service: 'web',
    namespace,
    ports: [{ name: 'http', port: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }],
    endpoints: [...pods.map((pod, i) => ({ ip: `10.244.0.${10 + i}`, pod })), ...podless.map((ip) => ({ ip }))],
  });
}

async function start(c: Cluster, extra: RawOptions = {}): Promise<{ proxy: RunningProxy; logs: LogRecord[] }> {
  const { logger, records } = captureLogger('debug');
  const config = buildConfig({ kubeconfig: c.kubeconfig, dialer: 'port-forward', hostnameOverride: 'laptop', metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', iptablesMinSyncPeriod: '0s', ...extra });
  const proxy = await startProxy(config, logger);
  cleanups.push(() => proxy.stop(100));
  return { proxy, logs: records };
}

/** Which pods answer `n` fresh connections. */
async function answering(port: number, n: number, host = WEB_ADDR): Promise<string[]> {
  const names: string[] = [];
  for (let i = 0; i < n; i++) names.push((await tcpRequest(host, port, 'x\n', 5000)).split(':')[0] as string);
  return names;
}

describe('--dialer port-forward', () => {
  it('serves a Service at its loopback address through tunnels to its pods, round-robin', async () => {
    const c = await cluster();
    for (const name of ['web-0', 'web-1', 'web-2']) c.api.portForward.addPod('default', name, { 8080: (await podBackend(name)).port });
    c.api.apply('services', webService(c));
    c.api.apply('endpointslices', webSlice(['web-0', 'web-1', 'web-2']));
    const { proxy, logs } = await start(c);
    await waitFor(() => proxy.proxier.status().find((u) => u.name === 'default/web:http')?.endpoints.length === 3, 'the endpoints');
    const seen = await answering(c.port, 6);
    expect(seen.slice(0, 3).sort()).toEqual(['web-0', 'web-1', 'web-2']);
    expect(seen.slice(3)).toEqual(seen.slice(0, 3));
    expect(c.api.portForward.opened.websocket).toBe(3);
    // Not a Node of the cluster: said once, and it serves.
    expect(logs.filter((r) => String(r.msg).startsWith('no Node named laptop: topology hints are off'))).toHaveLength(1);
  });

  it('lists what port-forward cannot reach in /services and says it once: a UDP port, endpoints without a pod', async () => {
    const c = await cluster();
    c.api.portForward.addPod('default', 'web-0', { 8080: (await podBackend('web-0')).port });
    c.api.apply('services', webService(c));
    c.api.apply('endpointslices', webSlice(['web-0'], ['192.0.2.7']));
    const { proxy, logs } = await start(c);
    await waitFor(() => proxy.proxier.status().length === 2, 'both ports in the status');
    const [dns, http] = proxy.proxier.status();
    expect(dns).toMatchObject({ name: 'default/web:dns', protocol: 'UDP', reachable: [], notServed: 'UDP is not carried by port-forward (TCP only)' });
    expect(http).toMatchObject({ name: 'default/web:http', endpoints: ['10.244.0.10:8080'], unreachable: [{ endpoint: '192.0.2.7:8080', reason: expect.stringMatching(/no targetRef/) }] });
    expect(await tcpRequest(WEB_ADDR, c.port, 'hi\n', 5000)).toBe('web-0:hi\n');
    // A resync re-plans every Service: nothing is said twice.
    proxy.proxier.resync();
    await proxy.proxier.syncNow();
    expect(logs.filter((r) => String(r.msg).includes('UDP port "dns" is not served'))).toHaveLength(1);
    expect(logs.filter((r) => String(r.msg).includes('192.0.2.7:8080 left out'))).toHaveLength(1);
  });

  it('applies Service and endpoint edits live: a pod scaled in, one deleted, affinity turned on', async () => {
    const c = await cluster();
    for (const name of ['web-0', 'web-1', 'web-2']) c.api.portForward.addPod('default', name, { 8080: (await podBackend(name)).port });
    c.api.apply('services', webService(c));
    c.api.apply('endpointslices', webSlice(['web-0']));
    const { proxy } = await start(c);
    await waitFor(() => proxy.proxier.status().find((u) => u.name === 'default/web:http')?.endpoints.length === 1, 'one endpoint');
    // A connection open across every edit keeps its pod.
    const { socket, got } = await connectTo(c.port, WEB_ADDR);
    socket.write('long');
    await got.until('web-0:long'.length);
    c.api.apply('endpointslices', webSlice(['web-0', 'web-1']));
    await waitFor(async () => new Set(await answering(c.port, 2)).size === 2, 'web-1 to answer');
    // web-0 deleted: the kubelet cuts its connections, the controller drops its endpoint.
    c.api.portForward.deletePod('default', 'web-0');
    c.api.apply('endpointslices', webSlice(['web-1', 'web-2']));
    await expect(withDeadline(got.ended, 10_000, 'the cut')).rejects.toMatchObject({ code: 'ECONNRESET' });
    socket.destroy();
    await waitFor(async () => (await answering(c.port, 4)).every((n) => n !== 'web-0'), 'web-0 gone');
    expect(new Set(await answering(c.port, 4))).toEqual(new Set(['web-1', 'web-2']));
    // ClientIP affinity: every connection from here sticks to one pod.
    c.api.apply('services', webService(c, { sessionAffinity: 'ClientIP' }));
    await waitFor(() => proxy.proxier.status().find((u) => u.name === 'default/web:http')?.sessionAffinity === 'ClientIP', 'affinity on');
    expect(new Set(await answering(c.port, 4)).size).toBe(1);
  });

  it('watches only the namespaces asked for, and names what RBAC forbids in one line each', async () => {
    const c = await cluster();
    c.api.rbac = { namespaces: new Set(['team-a']), nodes: false };
    c.api.portForward.addPod('team-a', 'web-0', { 8080: (await podBackend('a-web-0')).port });
    c.api.apply('services', webService(c, {}, 'team-a'));
    c.api.apply('endpointslices', webSlice(['web-0'], [], 'team-a'));
    const bPort = await freePort('127.98.7.11');
    c.api.apply('services', service({ name: 'web', namespace: 'team-b', clusterIP: '10.98.7.11', ports: [{ name: 'http', port: bPort }] }));
    const { proxy, logs } = await start(c, { namespaces: ['team-a', 'team-b'] });
    await waitFor(() => proxy.proxier.status().some((u) => u.name === 'team-a/web:http'), 'team-a served');
    expect(await tcpRequest(WEB_ADDR, c.port, 'hi\n', 5000)).toBe('a-web-0:hi\n');
    expect(proxy.proxier.status().some((u) => u.servicePort.startsWith('team-b/'))).toBe(false);
    expect(c.api.requests.some((r) => r.resource === 'services' && r.namespace === undefined)).toBe(false);
    // Said once each (at warn); the retries that follow are at debug.
    const forbidden = (): string[] => logs.filter((r) => r.level === 40 && String(r.msg).startsWith('forbidden:')).map((r) => String(r.msg));
    await waitFor(() => forbidden().length >= 3, 'the 403 lines');
    expect(forbidden().sort()).toEqual([
      'forbidden: cannot list endpointslices in namespace team-b: grant list and watch on endpointslices there (a Role and RoleBinding: deploy/developer/port-forward-role.yaml)',
      'forbidden: cannot list nodes cluster-wide: topology hints are off until it is granted; serving goes on',
      'forbidden: cannot list services in namespace team-b: grant list and watch on services there (a Role and RoleBinding: deploy/developer/port-forward-role.yaml)',
    ]);
  });

  it('serves nothing rather than waits when even listing cluster-wide is forbidden, and says how to mend it', async () => {
    const c = await cluster();
    c.api.rbac = { namespaces: new Set(['team-a']), nodes: false };
    const { proxy, logs } = await start(c);
    expect(proxy.proxier.status()).toEqual([]);
    await waitFor(() => logs.filter((r) => r.level === 40 && String(r.msg).startsWith('forbidden:')).length >= 3, 'the 403 lines');
    expect(logs.filter((r) => r.level === 40 && String(r.msg).startsWith('forbidden:')).map((r) => String(r.msg)).sort()).toEqual([
      'forbidden: cannot list endpointslices cluster-wide: grant list and watch on endpointslices cluster-wide (a ClusterRole), or pass --namespace for each namespace you may read',
      'forbidden: cannot list nodes cluster-wide: topology hints are off until it is granted; serving goes on',
      'forbidden: cannot list services cluster-wide: grant list and watch on services cluster-wide (a ClusterRole), or pass --namespace for each namespace you may read',
    ]);
  });

  it('runs as the command a developer types', async () => {
    const c = await cluster();
    c.api.portForward.addPod('default', 'web-0', { 8080: (await podBackend('web-0')).port });
    c.api.apply('services', webService(c));
    c.api.apply('endpointslices', webSlice(['web-0']));
    const cli = runCli(['--kubeconfig', c.kubeconfig, '--dialer', 'port-forward', '--hostname-override', 'laptop', '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0']);
    cleanups.push(() => cli.kill());
    await cli.waitForLine(/synced proxy rules/);
    await waitFor(async () => (await tcpRequest(WEB_ADDR, c.port, 'cli\n', 5000).catch(() => '')) === 'web-0:cli\n', 'the Service through the CLI');
    cli.child.kill('SIGTERM');
    expect(await withDeadline(cli.exited, 15_000, 'the exit')).toBe(0);
  });
});
