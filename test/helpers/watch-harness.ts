import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { roundRobinFactory } from '../../src/core/balancer/round-robin.js';
import { systemClock } from '../../src/core/clock.js';
import type { NodeInfo } from '../../src/core/model.js';
import { PortAllocator } from '../../src/core/port-allocator.js';
import { ServiceHealthServer } from '../../src/io/http/service-health.js';
import { HttpKubeApi } from '../../src/io/kube/api-client.js';
import { ApiSource } from '../../src/io/kube/api-source.js';
import { FileSource } from '../../src/io/kube/file-source.js';
import type { Source } from '../../src/seams/source.js';
import { DirectDialer } from '../../src/io/net/direct-dialer.js';
import type { ProxySocket } from '../../src/seams/proxy-socket.js';
import { TcpProxySocket } from '../../src/io/net/tcp-proxy.js';
import { UdpProxySocket } from '../../src/io/net/udp-proxy.js';
import { LoopbackPortal } from '../../src/io/portal/loopback-portal.js';
import type { Logger } from '../../src/log.js';
import type { Proxier } from '../../src/proxier/proxier.js';
import type { LocalUnitSet, ProxySocketFactory } from '../../src/proxier/unit-set.js';
import { makeProxier } from './make-proxier.js';
import { FakeApiServer, type ResourceName } from './fake-apiserver.js';
import { list } from './objects.js';
import { captureLogger, type LogRecord } from './proxy-fixtures.js';

/**
 * The proxy as startProxy composes it (Proxier, loopback portal, real TCP/UDP proxy sockets,
 * the health check node port servers), fed by either source, so that one test body can run
 * against the API (through the fake API server) and against a --state file.
 */

export type Kind = 'api' | 'file';
type Obj = Record<string, unknown>;

/** The desired cluster state: Services, EndpointSlices and (API only) this Node. */
export interface ClusterState {
  services: Obj[];
  slices: Obj[];
}

export interface Harness {
  kind: Kind;
  proxier: Proxier;
  units: LocalUnitSet;
  health: ServiceHealthServer;
  logs: LogRecord[];
  /** The fake API server (API kind only). */
  api?: FakeApiServer;
  source: Source;
  /** Make the cluster look like `state`: the API gets creates, updates and deletes; the file is rewritten whole. */
  setState(state: ClusterState): Promise<void>;
  stop(): Promise<void>;
}

export interface HarnessOptions {
  node: NodeInfo;
  /** For the API: the Node object to serve (its zone label is what the proxy uses). */
  nodeObject?: Obj;
  initial: ClusterState;
  minSyncPeriodMs?: number;
  /** Do not await the first lists and setSynced (the gate test does it by hand). */
  manualSync?: boolean;
  /** API only: called with the fake server once it holds the initial state, before the source starts. */
  beforeStart?: (api: FakeApiServer) => void;
}

function socketFactory(logger: Logger): ProxySocketFactory {
  const dialer = new DirectDialer();
  return (unit, balancer, stats): ProxySocket => {
    const log = logger.child({ component: 'proxysocket', service: unit.id });
    if (unit.protocol === 'UDP') return new UdpProxySocket({ name: unit.id, balancer, logger: log, stats, idleTimeoutMs: 250, maxSessions: 64 });
    return new TcpProxySocket({ name: unit.id, balancer, dialer, logger: log, stats });
  };
}

export async function startHarness(kind: Kind, opts: HarnessOptions): Promise<Harness> {
  const { logger, records } = captureLogger('info');
  const portal = new LoopbackPortal();
  const { proxier, units } = makeProxier({
    portal,
    logger,
    balancerFactory: roundRobinFactory,
    socketFactory: socketFactory(logger),
    portAllocator: new PortAllocator(undefined, Math.random),
    clock: systemClock,
    random: Math.random,
    node: { name: opts.node.name },
    minSyncPeriodMs: opts.minSyncPeriodMs ?? 50,
    syncPeriodMs: 30_000,
    sweepIntervalMs: 100,
    bindAddress: '127.0.0.1',
  });
  const health = new ServiceHealthServer({ hosts: ['127.0.0.1'], logger });
  proxier.onSync((e) => void health.sync(e.serviceHealth));
  await portal.start();

  let source: Source;
  let setState: (s: ClusterState) => Promise<void>;
  let cleanup: () => Promise<void>;
  let api: FakeApiServer | undefined;
  if (kind === 'api') {
    const fake = await FakeApiServer.start();
    api = fake;
    if (opts.nodeObject) fake.apply('nodes', opts.nodeObject);
    setState = async (s) => applyToApi(fake, s);
    await setState(opts.initial);
    opts.beforeStart?.(fake);
    source = new ApiSource({ api: new HttpKubeApi(fake.kubeConfig(), { requestTimeoutMs: 5000 }), nodeName: opts.node.name, logger, backoff: { initialMs: 20, maxMs: 250 } });
    cleanup = () => fake.close();
  } else {
    const dir = await mkdtemp(join(tmpdir(), 'kup-watch-harness-'));
    const file = join(dir, 'state.json');
    setState = async (s) => {
      await writeFile(`${file}.tmp`, list([...s.services, ...s.slices]));
      await rename(`${file}.tmp`, file);
    };
    await setState(opts.initial);
    source = new FileSource({ path: file, logger: logger.child({ component: 'file-source' }), debounceMs: 20, pollIntervalMs: 100 });
    // A state file has no Node: its name and zone come from where the flags would put them.
    proxier.sink.setNode(opts.node);
    cleanup = () => rm(dir, { recursive: true, force: true });
  }
  await source.start(proxier.sink);
  if (!opts.manualSync) {
    await source.synced;
    await proxier.setSynced();
  }
  const harness: Harness = {
    kind,
    proxier,
    units,
    health,
    logs: records,
    source,
    setState,
    async stop() {
      await source.stop();
      await proxier.shutdown(100);
      await health.close();
      await cleanup();
    },
  };
  if (api) harness.api = api;
  return harness;
}

const RESOURCE_OF: Record<string, ResourceName> = { Service: 'services', EndpointSlice: 'endpointslices' };

/** Creates and updates what `state` holds, deletes what it no longer does. */
function applyToApi(api: FakeApiServer, state: ClusterState): void {
  const wanted = new Map<string, { resource: ResourceName; obj: Obj }>();
  for (const obj of [...state.services, ...state.slices]) {
    const resource = RESOURCE_OF[String(obj.kind)];
    if (!resource) throw new Error(`cannot apply a ${String(obj.kind)}`);
    const meta = obj.metadata as { namespace?: string; name: string };
    wanted.set(`${resource}|${meta.namespace ?? 'default'}/${meta.name}`, { resource, obj });
  }
  for (const resource of ['services', 'endpointslices'] as const) {
    for (const key of api.keys(resource)) {
      if (!wanted.has(`${resource}|${key}`)) {
        const [ns, name] = key.split('/') as [string, string];
        api.remove(resource, ns, name);
      }
    }
  }
  for (const { resource, obj } of wanted.values()) {
    const meta = obj.metadata as { namespace?: string; name: string };
    const current = api.get(resource, meta.namespace ?? 'default', meta.name);
    if (!current || !sameContent(current, obj)) api.apply(resource, obj);
  }
}

/** Whether an update would change anything but server-set metadata. */
function sameContent(current: Obj, next: Obj): boolean {
  const strip = (o: Obj): string => {
    const { metadata, ...rest } = o;
    const { resourceVersion: _rv, uid: _uid, creationTimestamp: _ct, ...meta } = (metadata ?? {}) as Obj;
    return JSON.stringify(sortKeys({ ...rest, metadata: meta }));
  };
  return strip(current) === strip(next);
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (typeof v !== 'object' || v === null) return v;
  return Object.fromEntries(Object.entries(v as Obj).sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, x]) => [k, sortKeys(x)]));
}
