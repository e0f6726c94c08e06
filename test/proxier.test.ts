import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { PortAllocator } from '../src/core/port-allocator.js';
import type { ProxyUnit } from '../src/core/units.js';
import type { BoundAddress, ListenAddress, ProxySocket } from '../src/seams/proxy-socket.js';
import type { ListenSpec, Portal, PortalSyncResult, RunningUnitView } from '../src/seams/portal.js';
import type { Proxier } from '../src/proxier/proxier.js';
import type { SyncEvent } from '../src/seams/proxier-events.js';
import { fixedParts, makeProxier, type ProxierParts } from './helpers/make-proxier.js';
import { captureLogger, waitUntil } from './helpers/proxy-fixtures.js';
import { ServicePortStats } from '../src/core/stats.js';
import { endpointSlice, service } from './helpers/objects.js';

/** A portal that records what it was asked to program, and fails when told to. */
class RecordingPortal implements Portal {
  readonly mode = 'iptables' as const;
  syncs: Array<{ units: string[]; periodic: boolean }> = [];
  fail = false;
  /** What sync() says it cannot program (PortalSyncResult.skipped). */
  skip: string[] = [];
  async start(): Promise<void> {}
  async cleanup(): Promise<void> {}
  listenSpecs(unit: ProxyUnit): ListenSpec[] {
    return [{ host: '0.0.0.0', port: 0, proxyPort: true, portals: unit.portals }];
  }
  async sync(units: readonly RunningUnitView[], periodic: boolean): Promise<PortalSyncResult> {
    this.syncs.push({ units: units.map((u) => `${u.unit.id}@${u.proxyPort}`), periodic });
    return { errors: this.fail ? ['iptables-restore failed'] : [], skipped: this.skip };
  }
}

/** Every fake socket made, to check that shutdown closed each. */
const made: Array<{ closed: boolean }> = [];

/** Sockets that bind nothing: this test is about what the proxier asks of the portal. */
function fakeSocket(): ProxySocket {
  const record = { closed: false };
  made.push(record);
  let next = 40000;
  const bound: BoundAddress[] = [];
  return {
    protocol: 'TCP',
    stats: new ServicePortStats(),
    async listen(addr: ListenAddress) {
      const b = { host: addr.host, port: addr.port || next++ };
      bound.push(b);
      return b;
    },
    addresses: () => bound,
    async unlisten() {},
    async close() {
      record.closed = true;
    },
    active: () => 0,
    drained: async () => {},
    destroyAll() {},
    sweep() {},
    update() {},
  };
}

/** The parts of a loop over fake sockets; tests override what they are about. */
function parts(over: Partial<ProxierParts> = {}): ProxierParts {
  return { ...fixedParts(new RecordingPortal(), () => fakeSocket()), ...over };
}

interface Setup {
  proxier: Proxier;
  portal: RecordingPortal;
  /** What the last sync event said. */
  last: () => SyncEvent | undefined;
}

function setup(portal = new RecordingPortal(), range?: { base: number; size: number }): Setup {
  const { proxier } = makeProxier(parts({
    portal,
    portAllocator: new PortAllocator(range, () => 0.5),
  }));
  let last: SyncEvent | undefined;
  proxier.onSync((e) => {
    last = e;
  });
  return { proxier, portal, last: () => last };
}

/** A portal whose prepare() takes until the test lets it go: a sync held mid-way. */
class SlowPortal extends RecordingPortal {
  release: () => void = () => {};
  entered: Promise<void>;
  private enter: () => void = () => {};
  constructor() {
    super();
    this.entered = new Promise((r) => {
      this.enter = r;
    });
  }
  async prepare(): Promise<PortalSyncResult> {
    this.enter();
    await new Promise<void>((r) => {
      this.release = r;
    });
    return { errors: [] };
  }
}

const web = (rv: string): V1Service => service({ name: 'web', clusterIP: '10.96.0.10', ports: [{ name: 'http', port: 80 }], resourceVersion: rv });
const slice = (ips: string[], rv: string): V1EndpointSlice => endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: ips.map((ip) => ({ ip })), resourceVersion: rv }) as unknown as V1EndpointSlice;

describe('the proxier programs the portal only when rules can change', () => {
  it('programs it on the first sync even with no Service (leftover rules are replaced then)', async () => {
    const { proxier, portal } = setup();
    await proxier.setSynced();
    expect(portal.syncs).toEqual([{ units: [], periodic: false }]);
    await proxier.shutdown(0);
  });

  it('leaves it alone when only endpoints change; programs it when a unit opens or closes, and periodically', async () => {
    const { proxier, portal } = setup();
    proxier.cache.upsertService(web('1'));
    proxier.cache.upsertEndpointSlice(slice(['10.0.0.1'], '1'));
    await proxier.setSynced();
    expect(portal.syncs).toHaveLength(1);
    expect(portal.syncs[0]?.units).toEqual(['default/web:http@40000']);

    proxier.cache.upsertEndpointSlice(slice(['10.0.0.1', '10.0.0.2'], '2'));
    const summary = await proxier.syncNow();
    expect(summary.updated).toBe(1);
    expect(portal.syncs).toHaveLength(1);
    expect(proxier.status()[0]?.endpoints).toHaveLength(2);

    await proxier.syncNow(true);
    expect(portal.syncs.map((s) => s.periodic)).toEqual([false, true]);

    proxier.cache.deleteService('default', 'web');
    await proxier.syncNow();
    expect(portal.syncs.at(-1)).toEqual({ units: [], periodic: false });
    await proxier.shutdown(0);
  });

  it('programs it again on the next sync after a failure, whatever changed', async () => {
    const { proxier, portal, last } = setup();
    proxier.cache.upsertService(web('1'));
    portal.fail = true;
    await proxier.setSynced();
    expect(last()?.summary.portalErrors).toBe(1);
    portal.fail = false;
    proxier.cache.upsertEndpointSlice(slice(['10.0.0.3'], '3'));
    await proxier.syncNow();
    expect(portal.syncs).toHaveLength(2);
    expect(last()?.summary.portalErrors).toBe(0);
    await proxier.syncNow();
    expect(portal.syncs).toHaveLength(2);
    await proxier.shutdown(0);
  });

describe('a unit the portal cannot program by its configuration', () => {
  it('is said once, and the sync is complete: health must not fail for what no retry changes', async () => {
    const { logger, records } = captureLogger('warn');
    const portal = new RecordingPortal();
    portal.skip = ['default/web:http: cannot program its IPv6 portals: proxy ports listen on --bind-address 192.168.1.10 only'];
    const { proxier } = makeProxier(parts({ portal, logger }));
    let last: SyncEvent | undefined;
    proxier.onSync((e) => {
      last = e;
    });
    proxier.cache.upsertService(web('1'));
    await proxier.setSynced();
    expect(last?.summary.portalErrors).toBe(0);
    expect(last?.complete).toBe(true);
    // Another Service's unit makes the portal program (and skip) again: not said again.
    proxier.cache.upsertService(service({ name: 'api', clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80 }], resourceVersion: '1' }));
    await proxier.syncNow();
    expect(portal.syncs).toHaveLength(2);
    expect(records.filter((r) => /cannot program its IPv6 portals/.test(String(r.msg)))).toHaveLength(1);
    await proxier.shutdown(0);
  });
});

describe('shutdown', () => {
  it('waits for a sync under way, so nothing it opens outlives the shutdown', async () => {
    const portal = new SlowPortal();
    const { proxier } = setup(portal);
    proxier.cache.upsertService(web('1'));
    proxier.cache.upsertEndpointSlice(slice(['10.0.0.1'], '1'));
    made.length = 0;
    const first = proxier.setSynced();
    await portal.entered; // the first sync is inside prepare(), before opening the unit
    const stopped = proxier.shutdown(0);
    portal.release();
    await Promise.all([first, stopped]);
    expect(made.every((m) => m.closed)).toBe(true);
    expect(proxier.status()).toEqual([]);
  });
});

describe('pause (a successor abandoning a hand-over)', () => {
  it('interrupts the unit set first, so a sync waiting inside it cannot hold the stop up', async () => {
    const { proxier, units } = makeProxier(parts());
    const calls: string[] = [];
    (units as { interrupt?: () => void }).interrupt = () => calls.push('interrupt');
    await proxier.setSynced();
    await proxier.pause();
    expect(calls).toEqual(['interrupt']);
    await proxier.shutdown(0);
  });

  it('no change reaches the portal or the sockets after it; what runs keeps serving', async () => {
    const { proxier, portal } = setup();
    proxier.cache.upsertService(web('1'));
    proxier.cache.upsertEndpointSlice(slice(['10.0.0.1'], '1'));
    await proxier.setSynced();
    await proxier.pause();
    const synced = portal.syncs.length;
    proxier.cache.deleteService('default', 'web');
    // Asked for outright, too: nothing runs.
    await proxier.syncNow().catch(() => undefined);
    expect(portal.syncs.length).toBe(synced);
    expect(proxier.status().map((s) => s.name)).toEqual(['default/web:http']);
    await proxier.shutdown(0);
  });
});

describe('a Service whose translation throws (a bug, not input)', () => {
  it('costs the other Services nothing, and is tried again at the next sync', async () => {
    const { proxier } = setup();
    proxier.cache.upsertService(web('1'));
    proxier.cache.upsertService(service({ name: 'api', clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80 }] }));
    const real = proxier.cache.service.bind(proxier.cache);
    let broken = true;
    proxier.cache.service = (key: string) => {
      if (broken && key === 'default/web') throw new Error('bug');
      return real(key);
    };
    await proxier.setSynced();
    expect(proxier.status().map((u) => u.name)).toEqual(['default/api:http']);
    broken = false;
    await proxier.syncNow();
    expect(proxier.status().map((u) => u.name)).toEqual(['default/api:http', 'default/web:http']);
    await proxier.shutdown(0);
  });
});

describe('--proxy-port-range', () => {
  it('an exhausted range is a clear error for that service port; the others keep working', async () => {
    const { proxier } = setup(new RecordingPortal(), { base: 40000, size: 1 });
    proxier.cache.upsertService(web('1'));
    proxier.cache.upsertService(service({ name: 'zzz', clusterIP: '10.96.0.12', ports: [{ name: 'http', port: 80 }] }));
    await proxier.setSynced();
    const [first, second] = proxier.status();
    expect(first).toMatchObject({ name: 'default/web:http', proxyPort: 40000, errors: [] });
    expect(second?.name).toBe('default/zzz:http');
    expect(second?.proxyPort).toBeNull();
    expect(second?.errors[0]).toMatch(/cannot listen on a proxy port on 0\.0\.0\.0: .*40000-40000/);
    // The port comes free when its Service goes, but not in that sync: the portal still sends web's
    // traffic there until it is synced after it. The waiting one binds at the sync that follows.
    proxier.cache.deleteService('default', 'web');
    await proxier.syncNow();
    expect(proxier.status()).toMatchObject([{ name: 'default/zzz:http', proxyPort: null }]);
    expect(proxier.status()[0]?.errors[0]).toMatch(/1 of them freed in this sync, free from the next/);
    await waitUntil(() => proxier.status()[0]?.proxyPort === 40000, 'the follow-up sync to bind the freed port');
    expect(proxier.status()).toMatchObject([{ name: 'default/zzz:http', proxyPort: 40000, errors: [] }]);
    await proxier.shutdown(0);
  });

  it("binds the portal's preferred proxy port (the previous run's) when the range has it free, else allocates one", async () => {
    class PreferringPortal extends RecordingPortal {
      preferredProxyPort(unit: ProxyUnit): number | undefined {
        return { 'default/web:http': 40007, 'default/zzz:http': 40007, 'default/out:http': 39000 }[unit.id];
      }
    }
    const { proxier } = setup(new PreferringPortal(), { base: 40000, size: 10 });
    proxier.cache.upsertService(web('1'));
    proxier.cache.upsertService(service({ name: 'zzz', clusterIP: '10.96.0.12', ports: [{ name: 'http', port: 80 }] }));
    proxier.cache.upsertService(service({ name: 'out', clusterIP: '10.96.0.13', ports: [{ name: 'http', port: 80 }] }));
    await proxier.setSynced();
    const ports = Object.fromEntries(proxier.status().map((u) => [u.name, u.proxyPort]));
    // web (opened first) gets 40007; zzz wanted it too and out wanted a port outside the range.
    expect(ports['default/web:http']).toBe(40007);
    for (const name of ['default/zzz:http', 'default/out:http']) {
      expect(ports[name]).toBeGreaterThanOrEqual(40000);
      expect(ports[name]).toBeLessThan(40010);
      expect(ports[name]).not.toBe(40007);
    }
    await proxier.shutdown(0);

    // Without a range the preferred port is tried as it is.
    const bare = setup(new PreferringPortal()).proxier;
    bare.cache.upsertService(service({ name: 'out', clusterIP: '10.96.0.13', ports: [{ name: 'http', port: 80 }] }));
    await bare.setSynced();
    expect(bare.status()[0]?.proxyPort).toBe(39000);
    await bare.shutdown(0);
  });
});
});

describe('no-local-endpoints counts', () => {
  it('follow each Service as it changes and goes, without recounting the others', async () => {
    const { proxier, last } = setup();
    const local = (name: string, rv: string): V1Service =>
      service({ name, clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80, nodePort: 30080 }], internalTrafficPolicy: 'Local', externalTrafficPolicy: 'Local', resourceVersion: rv });
    const eps = (name: string, nodeName: string, rv: string): V1EndpointSlice =>
      endpointSlice({ service: name, ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.0.0.1', nodeName }], resourceVersion: rv }) as unknown as V1EndpointSlice;
    proxier.cache.upsertService(local('a', '1'));
    proxier.cache.upsertEndpointSlice(eps('a', 'node-b', '1'));
    proxier.cache.upsertService(local('b', '1'));
    proxier.cache.upsertEndpointSlice(eps('b', 'node-b', '1'));
    await proxier.setSynced();
    expect(last()?.noLocalEndpoints).toEqual({ internal: 2, external: 2 });
    // a's endpoint moves to this node; b is deleted; then a's Service goes too.
    proxier.cache.upsertEndpointSlice(eps('a', 'node-a', '2'));
    await proxier.syncNow();
    expect(last()?.noLocalEndpoints).toEqual({ internal: 1, external: 1 });
    proxier.cache.deleteService('default', 'b');
    await proxier.syncNow();
    expect(last()?.noLocalEndpoints).toEqual({ internal: 0, external: 0 });
    proxier.cache.upsertEndpointSlice(eps('a', 'node-b', '3'));
    await proxier.syncNow();
    expect(last()?.noLocalEndpoints).toEqual({ internal: 1, external: 1 });
    proxier.cache.deleteService('default', 'a');
    await proxier.syncNow();
    expect(last()?.noLocalEndpoints).toEqual({ internal: 0, external: 0 });
    await proxier.shutdown(0);
  });
});

describe('a sync that fails after taking the changes (a bug, not input)', () => {
  it('hands them back and tries again on its own, with no new change', async () => {
    class FailingOncePortal extends RecordingPortal {
      private failures = 1;
      async prepare(): Promise<PortalSyncResult> {
        if (this.failures-- > 0) throw new Error('bug in prepare');
        return { errors: [] };
      }
    }
    const portal = new FailingOncePortal();
    const { proxier } = makeProxier(parts({
      portal,
      clock: { now: () => performance.now() },
    }), { syncRetryMs: 20 });
    proxier.cache.upsertService(web('1'));
    await proxier.setSynced();
    expect(proxier.status()).toEqual([]);
    // Nothing else happens: the retry alone applies the Service (before, it waited for the 15-minute resync).
    await waitUntil(() => proxier.status().length === 1, 'the retried sync');
    expect(proxier.status()[0]?.name).toBe('default/web:http');
    await proxier.shutdown(0);
  });
});

describe('changes that alter nothing', () => {
  it('are published with changed 0 and queue no sync', async () => {
    const { proxier } = setup();
    await proxier.setSynced();
    const events: Array<{ kind: string; changed: number; initialized: boolean }> = [];
    proxier.onChange((e) => events.push({ kind: e.change.kind, changed: e.changed, initialized: e.initialized }));
    let syncs = 0;
    proxier.onSync(() => syncs++);
    proxier.sink.upsertService(web('1'));
    await proxier.syncNow();
    expect(syncs).toBe(1);
    proxier.sink.upsertService(web('1')); // the same version again (a re-list)
    proxier.sink.deleteService('default', 'nothing-here');
    proxier.sink.replaceServices([web('1')]);
    expect(events).toEqual([
      { kind: 'upsertService', changed: 1, initialized: true },
      { kind: 'upsertService', changed: 0, initialized: true },
      { kind: 'deleteService', changed: 0, initialized: true },
      { kind: 'replaceServices', changed: 0, initialized: true },
    ]);
    // No sync was asked for: the runner stays idle (a sync now is the one we ask for).
    await proxier.syncNow();
    expect(syncs).toBe(2);
    await proxier.shutdown(0);
  });

  it('a periodic resync that changed nothing logs at debug, not info', async () => {
    const { logger, records } = captureLogger('info');
    const { proxier } = makeProxier(parts({
      portal: new RecordingPortal(),
      logger,
    }));
    proxier.cache.upsertService(web('1'));
    await proxier.setSynced();
    const synced = (): number => records.filter((r) => r.msg === 'synced proxy rules').length;
    expect(synced()).toBe(1);
    await proxier.syncNow(true);
    // The config resync re-plans every Service from memory: nothing differs, nothing is updated.
    proxier.resync();
    const summary = await proxier.syncNow(true);
    expect(summary.updated).toBe(0);
    expect(synced()).toBe(1);
    await proxier.shutdown(0);
  });
});

describe('the fast lane', () => {
  it('moves endpoints at once, whatever the minimum sync period, and leaves sockets and portal to the runner', async () => {
    const portal = new RecordingPortal();
    const { proxier } = makeProxier(parts({
      portal,
      clock: { now: () => performance.now() },
      minSyncPeriodMs: 3_600_000, // an hour: nothing but the fast lane can apply a change in this test
      syncPeriodMs: 3_600_000,
    }));
    proxier.sink.upsertService(web('1'));
    proxier.sink.upsertEndpointSlice(slice(['10.0.0.1'], '1'));
    await proxier.setSynced();
    expect(portal.syncs).toHaveLength(1);
    const programmed: number[] = [];
    proxier.onSync((e) => programmed.push(e.summary.updated));

    proxier.sink.upsertEndpointSlice(slice(['10.0.0.2', '10.0.0.3'], '2'));
    await waitUntil(() => proxier.status()[0]?.endpoints.length === 2, 'the endpoint move');
    expect(proxier.status()[0]?.endpoints).toEqual(['10.0.0.2:8080', '10.0.0.3:8080']);
    expect(programmed).toEqual([1]); // one SyncEvent: what network programming latency is measured on
    expect(portal.syncs).toHaveLength(1); // the portal was not touched

    // A port change needs a new socket: that waits for the runner (an hour here), endpoints or not.
    proxier.sink.upsertService(service({ name: 'web', clusterIP: '10.96.0.10', ports: [{ name: 'http', port: 81 }], resourceVersion: '3' }));
    proxier.sink.upsertEndpointSlice(slice(['10.0.0.4'], '3'));
    await new Promise((r) => setImmediate(r));
    expect(proxier.status()[0]?.endpoints).toEqual(['10.0.0.2:8080', '10.0.0.3:8080']);
    const summary = await proxier.syncNow();
    expect(summary.recreated).toBe(1);
    expect(proxier.status()[0]?.endpoints).toEqual(['10.0.0.4:8080']);
    await proxier.shutdown(0);
  });
});

describe('what a sync leaves undone', () => {
  function loop(portal: RecordingPortal, minSyncPeriodMs = 3_600_000) {
    return makeProxier(parts({
      portal,
      clock: { now: () => performance.now() },
      minSyncPeriodMs,
      syncPeriodMs: 3_600_000,
    }), { syncRetryMs: 20 }).proxier;
  }

  it('a fast-lane run that hands a Service to the runner is not complete (health does not count it as an update)', async () => {
    const proxier = loop(new RecordingPortal());
    proxier.sink.upsertService(web('1'));
    proxier.sink.upsertEndpointSlice(slice(['10.0.0.1'], '1'));
    await proxier.setSynced();
    const events: Array<{ complete: boolean; updated: number }> = [];
    proxier.onSync((e) => events.push({ complete: e.complete, updated: e.summary.updated }));
    // One burst: an endpoint move (fast lane) and a new Service (needs a socket: the runner's).
    proxier.sink.upsertEndpointSlice(slice(['10.0.0.2'], '2'));
    proxier.sink.upsertService(service({ name: 'api', clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80 }] }));
    await waitUntil(() => events.length > 0, 'the fast lane');
    expect(events[0]).toEqual({ complete: false, updated: 1 });
    await proxier.syncNow();
    expect(events.at(-1)?.complete).toBe(true);
    await proxier.shutdown(0);
  });

  it('a portal sync that throws after sockets opened is programmed again by the retry', async () => {
    class ThrowsWhenTold extends RecordingPortal {
      throws = 0;
      override async sync(units: readonly RunningUnitView[], periodic: boolean): Promise<PortalSyncResult> {
        if (this.throws-- > 0) throw new Error('bug in the portal');
        return super.sync(units, periodic);
      }
    }
    const portal = new ThrowsWhenTold();
    const proxier = loop(portal, 20); // retries keep the minimum sync period, as upstream's RetryAfter
    proxier.sink.upsertService(web('1'));
    await proxier.setSynced();
    expect(portal.syncs).toHaveLength(1);
    // A later sync opens a socket and its portal sync throws once.
    portal.throws = 1;
    proxier.sink.upsertService(service({ name: 'api', clusterIP: '10.96.0.11', ports: [{ name: 'http', port: 80 }] }));
    // The retry finds nothing new to open (the unit runs) but must still program the portal.
    await waitUntil(() => portal.syncs.length === 2, 'the retried portal sync');
    expect(portal.syncs[1]?.units).toEqual(['default/web:http@40000', 'default/api:http@40000']);
    await proxier.shutdown(0);
  });
});
