import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { startProxy, type RunningProxy } from '../src/app.js';
import { HOLD_WHEN_EMPTY_ANNOTATION } from '../src/core/annotations.js';
import { buildConfig } from '../src/config.js';
import { needPodsEvent, splitServicePortKey } from '../src/core/need-pods-event.js';
import { HttpKubeApi } from '../src/io/kube/api-client.js';
import { EventRecorder } from '../src/io/kube/event-recorder.js';
import { createLogger } from '../src/log.js';
import { runCli } from './helpers/cli.js';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { endpointSlice, service } from './helpers/objects.js';
import { freePort, tcpEchoServer, waitFor } from './helpers/net.js';
import { captureLogger, connectTo, waitUntil, withDeadline } from './helpers/proxy-fixtures.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function fakeApi(): Promise<FakeApiServer> {
  const api = await FakeApiServer.start();
  cleanups.push(() => api.close());
  return api;
}

describe('the NeedPods Event', () => {
  it('is OpenShift\'s: reason NeedPods on the Service, with this node as its source', () => {
    expect(needPodsEvent({ namespace: 'shop', name: 'web', port: 'http', uid: 'u-1', node: 'node-a', time: '2026-01-02T03:04:05.000Z' })).toEqual({
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { generateName: 'web.', namespace: 'shop' },
      involvedObject: { apiVersion: 'v1', kind: 'Service', namespace: 'shop', name: 'web', uid: 'u-1' },
      reason: 'NeedPods',
      message: 'The service-port web:http needs pods.',
      type: 'Normal',
      source: { component: 'kube-userspace-proxy', host: 'node-a' },
      reportingComponent: 'kube-userspace-proxy',
      reportingInstance: 'node-a',
      firstTimestamp: '2026-01-02T03:04:05.000Z',
      lastTimestamp: '2026-01-02T03:04:05.000Z',
      count: 1,
    });
    expect(splitServicePortKey('shop/web:')).toEqual({ namespace: 'shop', name: 'web', port: '' });
    expect(splitServicePortKey('nonsense')).toBeUndefined();
  });

  it('is posted at most once per Service per interval, and a refusal is one warning naming RBAC', async () => {
    const api = await fakeApi();
    let now = 1_000_000;
    const { logger, records } = captureLogger('warn');
    const recorder = new EventRecorder({ api: new HttpKubeApi(api.kubeConfig()), logger, node: 'node-a', now: () => now, minIntervalMs: 10_000, serviceUid: () => 'uid-web' });
    cleanups.push(() => recorder.stop());
    recorder.needPods('default/web:http');
    recorder.needPods('default/web:https');
    await waitUntil(() => api.createdEvents.length === 1, 'the Event');
    expect(api.createdEvents[0]).toMatchObject({ reason: 'NeedPods', involvedObject: { name: 'web', uid: 'uid-web' } });
    now += 10_000;
    api.forbidEvents = true;
    recorder.needPods('default/web:http');
    await waitUntil(() => records.length === 1, 'the warning');
    expect(records[0]?.msg).toMatch(/cannot post a NeedPods Event \(RBAC: create on events\?\)/);
    expect(api.createdEvents).toHaveLength(1);
  });
});

describe('--emit-events, watching a cluster', () => {
  it('posts one NeedPods Event per hold episode, and the held connection completes once the slice comes', async () => {
    const api = await fakeApi();
    const dir = await mkdtemp(join(tmpdir(), 'kup-events-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const kubeconfig = join(dir, 'kubeconfig');
    await writeFile(kubeconfig, api.kubeconfigYaml());
    const host = '127.96.8.8'; // the loopback portal's address for ClusterIP 10.96.8.8
    const port = await freePort(host);
    const backendPort = await freePort('127.0.21.1');
    const echo = await tcpEchoServer('127.0.21.1', 'be', backendPort);
    cleanups.push(() => echo.close());
    const svc = service({ name: 'web', clusterIP: '10.96.8.8', ports: [{ name: 'http', port }] }) as { metadata: Record<string, unknown> };
    svc.metadata.annotations = { [HOLD_WHEN_EMPTY_ANNOTATION]: '30s' };
    api.apply('services', svc);
    const config = buildConfig({ kubeconfig, emitEvents: true, hostnameOverride: 'node-a', metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', iptablesMinSyncPeriod: '0s', logLevel: 'silent' });
    const logSink = new Writable({ write: (_c, _e, cb) => cb() });
    const proxy: RunningProxy = await startProxy(config, createLogger('silent', logSink));
    cleanups.push(() => proxy.stop(100));

    const held = [await connectTo(port, host), await connectTo(port, host)];
    for (const h of held) {
      cleanups.push(() => h.socket.destroy());
      h.socket.write('hi');
    }
    await waitUntil(() => api.createdEvents.length === 1, 'the NeedPods Event');
    expect(api.createdEvents[0]).toMatchObject({ reason: 'NeedPods', message: 'The service-port web:http needs pods.', involvedObject: { kind: 'Service', namespace: 'default', name: 'web', uid: 'uid-web' }, source: { host: 'node-a' } });
    const status = await (await fetch(`http://${proxy.adminAddress}/services`)).json() as { services: Array<{ held: number; holdWhenEmpty: string }> };
    expect(status.services[0]).toMatchObject({ held: 2, holdWhenEmpty: '30s' });

    api.apply('endpointslices', endpointSlice({ service: 'web', ports: [{ name: 'http', port: backendPort }], endpoints: [{ ip: '127.0.21.1' }] }));
    for (const h of held) {
      await h.got.until(5);
      expect(h.got.bytes().toString()).toBe('be:hi');
    }
    for (const h of held) h.socket.end();
    await withDeadline(Promise.all(held.map((h) => h.got.ended)), 5000, 'the ends');
    // Two connections, one episode: one Event.
    expect(api.createdEvents).toHaveLength(1);
  });

  it('with --workers 2: the workers tell the controller, which posts one Event for the episode', async () => {
    const api = await fakeApi();
    const dir = await mkdtemp(join(tmpdir(), 'kup-events-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const kubeconfig = join(dir, 'kubeconfig');
    await writeFile(kubeconfig, api.kubeconfigYaml());
    const host = '127.96.8.9'; // the loopback portal's address for ClusterIP 10.96.8.9
    const port = await freePort(host);
    const svc = service({ name: 'web', clusterIP: '10.96.8.9', ports: [{ name: 'http', port }] }) as { metadata: Record<string, unknown> };
    svc.metadata.annotations = { [HOLD_WHEN_EMPTY_ANNOTATION]: '30s' };
    api.apply('services', svc);
    const proxy = runCli(['--kubeconfig', kubeconfig, '--emit-events', '--hostname-override', 'node-a', '--workers', '2', '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--iptables-min-sync-period', '0s']);
    cleanups.push(async () => {
      proxy.child.kill('SIGTERM');
      await withDeadline(proxy.exited, 20_000, 'the proxy to exit').catch(() => proxy.kill());
    });
    const admin = (JSON.parse(await proxy.waitForLine(/kube-userspace-proxy started/)) as { admin: string }).admin;
    // Enough connections that both workers hold some (the kernel spreads them by SO_REUSEPORT).
    const held = await Promise.all(Array.from({ length: 8 }, () => connectTo(port, host)));
    for (const h of held) cleanups.push(() => h.socket.destroy());
    const status = async (): Promise<{ held: number } | undefined> => ((await (await fetch(`http://${admin}/services`)).json()) as { services: Array<{ held: number }> }).services[0];
    await waitFor(async () => (await status())?.held === 8, '/services to show all 8 held, summed over the workers');
    await waitUntil(() => api.createdEvents.length === 1, 'the NeedPods Event');
    expect(api.createdEvents[0]).toMatchObject({ reason: 'NeedPods', involvedObject: { kind: 'Service', namespace: 'default', name: 'web' }, source: { host: 'node-a' } });
    // Each worker's episode began a post; the recorder's per-Service interval let one through.
    expect(api.createdEvents).toHaveLength(1);
  });

  it('is refused with --state: Events need the API', () => {
    expect(() => buildConfig({ state: '/tmp/x.yaml', emitEvents: true })).toThrow(/--emit-events .* --state/);
  });
});
