import { readFileSync } from 'node:fs';
import { describe, it, expect } from 'vitest';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { deepEqual, StateCache } from '../src/core/state-cache.js';
import type { StateSink } from '../src/seams/state-sink.js';
import type { ObjectProblem } from '../src/core/model.js';
import { endpointSlice, service, type ServiceSpec, type SliceSpec } from './helpers/objects.js';

function fixture<T>(name: string): T {
  return JSON.parse(readFileSync(new URL(`./fixtures/kube/${name}`, import.meta.url), 'utf8')) as T;
}

const svc = (s: Partial<ServiceSpec> = {}): V1Service => service({ name: 'web', ports: [{ name: 'http', port: 80 }], ...s });
const slice = (s: Partial<SliceSpec> = {}): V1EndpointSlice =>
  endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.0.0.1' }], ...s }) as unknown as V1EndpointSlice;
/** A Service whose first port is out of range. */
const badSvc = (s: Partial<ServiceSpec> = {}): V1Service => svc({ ports: [{ name: 'http', port: 0, targetPort: 8080 }], ...s });

function cache(): { c: StateCache; problems: ObjectProblem[] } {
  const problems: ObjectProblem[] = [];
  return { c: new StateCache({ onProblem: (p) => problems.push(p) }), problems };
}

describe('StateCache storage and index', () => {
  it('stores Services and indexes slices by the service-name label', () => {
    const { c } = cache();
    c.upsertService(svc());
    c.upsertEndpointSlice(slice({ name: 'web-b' }));
    c.upsertEndpointSlice(slice({ name: 'web-a' }));
    c.upsertEndpointSlice(slice({ name: 'other-a', service: 'other' }));
    expect(c.serviceKeys()).toEqual(['default/web']);
    expect(c.service('default/web')?.metadata?.name).toBe('web');
    expect(c.slicesFor('default/web').map((s) => s.metadata?.name)).toEqual(['web-a', 'web-b']);
    expect(c.slicesFor('default/other').map((s) => s.metadata?.name)).toEqual(['other-a']);
    expect(c.slicesFor('default/nothing')).toEqual([]);
  });

  it('keys by namespace: same names in two namespaces do not collide', () => {
    const { c } = cache();
    c.upsertService(svc({ namespace: 'a' }));
    c.upsertService(svc({ namespace: 'b' }));
    c.upsertEndpointSlice(slice({ namespace: 'b' }));
    expect(c.serviceKeys()).toEqual(['a/web', 'b/web']);
    expect(c.slicesFor('a/web')).toEqual([]);
    expect(c.slicesFor('b/web')).toHaveLength(1);
  });

  it('puts objects without a namespace in default, without touching the caller\'s object', () => {
    const { c } = cache();
    const s = svc();
    delete (s.metadata as { namespace?: string }).namespace;
    c.upsertService(s);
    const sl = slice();
    delete (sl.metadata as { namespace?: string }).namespace;
    c.upsertEndpointSlice(sl);
    expect(c.service('default/web')?.metadata?.namespace).toBe('default');
    expect(c.slicesFor('default/web')).toHaveLength(1);
    expect(s.metadata?.namespace).toBeUndefined();
  });

  it('moves a slice in the index when its label changes, marking both Services', () => {
    const { c } = cache();
    c.upsertEndpointSlice(slice({ name: 's1', service: 'web' }));
    c.takeDirty();
    c.upsertEndpointSlice(slice({ name: 's1', service: 'api', resourceVersion: '2' }));
    expect(c.takeDirty()).toEqual(new Set(['default/web', 'default/api']));
    expect(c.slicesFor('default/web')).toEqual([]);
    expect(c.slicesFor('default/api')).toHaveLength(1);
  });

  it('deletes Services and slices', () => {
    const { c } = cache();
    c.upsertService(svc());
    c.upsertEndpointSlice(slice());
    c.takeDirty();
    c.deleteEndpointSlice('default', 'web-abcde');
    expect(c.takeDirty()).toEqual(new Set(['default/web']));
    expect(c.slicesFor('default/web')).toEqual([]);
    c.deleteService('default', 'web');
    expect(c.takeDirty()).toEqual(new Set(['default/web']));
    expect(c.service('default/web')).toBeUndefined();
    // Already gone: nothing changes.
    c.deleteService('default', 'web');
    c.deleteEndpointSlice('default', 'web-abcde');
    expect(c.takeDirty().size).toBe(0);
  });

  it('holds the objects a real API server listed', () => {
    const { c, problems } = cache();
    c.replaceServices(fixture<{ items: V1Service[] }>('services-list.json').items);
    c.replaceEndpointSlices(fixture<{ items: V1EndpointSlice[] }>('endpointslices-v1-list.json').items);
    expect(problems).toEqual([]);
    expect(c.serviceKeys()).toEqual(['default/ext', 'default/headless', 'default/kubernetes', 'default/web']);
    expect(c.slicesFor('default/web').map((s) => s.metadata?.name)).toEqual(['web-abcde']);
  });
});

describe('StateCache dirty tracking', () => {
  it('marks a Service dirty when it or its slices change, and takeDirty clears', () => {
    const { c } = cache();
    c.upsertService(svc());
    c.upsertEndpointSlice(slice({ service: 'api' }));
    expect(c.takeDirty()).toEqual(new Set(['default/web', 'default/api']));
    expect(c.takeDirty().size).toBe(0);
  });

  it('marks nothing for an identical upsert (same resourceVersion, or equal content without one)', () => {
    const { c } = cache();
    c.upsertService(svc({ resourceVersion: '5' }));
    c.upsertEndpointSlice(slice());
    c.takeDirty();
    c.upsertService(svc({ resourceVersion: '5' }));
    c.upsertEndpointSlice(slice());
    expect(c.takeDirty().size).toBe(0);

    const noRV = (port: number): V1Service => {
      const s = svc({ ports: [{ name: 'http', port }] });
      delete (s.metadata as { resourceVersion?: string }).resourceVersion;
      return s;
    };
    c.upsertService(noRV(80));
    expect(c.takeDirty()).toEqual(new Set(['default/web']));
    c.upsertService(noRV(80));
    expect(c.takeDirty().size).toBe(0);
    c.upsertService(noRV(81));
    expect(c.takeDirty()).toEqual(new Set(['default/web']));
  });

  it('marks a new resourceVersion dirty, and a hand edit that kept the old resourceVersion too', () => {
    const { c } = cache();
    c.upsertService(svc({ resourceVersion: '5' }));
    c.takeDirty();
    c.upsertService(svc({ resourceVersion: '6' }));
    expect(c.takeDirty()).toEqual(new Set(['default/web']));
    // Copied from `kubectl get -o yaml` then edited: the resourceVersion says nothing.
    c.upsertService(svc({ resourceVersion: '6', ports: [{ name: 'http', port: 81 }] }));
    expect(c.takeDirty()).toEqual(new Set(['default/web']));
    expect(c.service('default/web')?.spec?.ports?.[0]?.port).toBe(81);
  });

  it('setNode marks every Service when the node\'s name or zone changes, not otherwise', () => {
    const { c } = cache();
    c.upsertService(svc());
    c.upsertEndpointSlice(slice({ service: 'orphan' }));
    c.takeDirty();
    c.setNode({ name: 'node1', zone: 'zone-a' });
    expect(c.takeDirty()).toEqual(new Set(['default/web', 'default/orphan']));
    c.setNode({ name: 'node1', zone: 'zone-a' });
    expect(c.takeDirty().size).toBe(0);
    c.setNode({ name: 'node1', zone: 'zone-b' });
    expect(c.takeDirty().size).toBe(2);
    c.setNode({ name: 'node2', zone: 'zone-b' });
    expect(c.takeDirty().size).toBe(2);
    expect(c.node()).toEqual({ name: 'node2', zone: 'zone-b' });
  });

  it('markAllDirty marks every known Service key', () => {
    const { c } = cache();
    c.upsertService(svc());
    c.upsertService(svc({ name: 'api' }));
    c.takeDirty();
    c.markAllDirty();
    expect(c.takeDirty()).toEqual(new Set(['default/web', 'default/api']));
  });
});

describe('StateCache validation', () => {
  it('refuses an invalid object, reports it, and keeps the last good version in force', () => {
    const { c, problems } = cache();
    c.upsertService(svc({ resourceVersion: '1' }));
    c.takeDirty();
    c.upsertService(badSvc({ resourceVersion: '2' }));
    expect(problems).toEqual([{ object: 'Service default/web', field: 'spec.ports[0].port', message: 'must be an integer from 1 to 65535, got 0' }]);
    expect(c.service('default/web')?.metadata?.resourceVersion).toBe('1');
    expect(c.takeDirty().size).toBe(0);
  });

  it('does not store an invalid object that has no good version', () => {
    const { c, problems } = cache();
    c.upsertEndpointSlice(slice({ endpoints: [{ ip: '10.0.0.300' }] }));
    expect(problems.map((p) => p.field)).toEqual(['endpoints[0].addresses[0]']);
    expect(c.slicesFor('default/web')).toEqual([]);
    expect(c.takeDirty().size).toBe(0);
  });

  it('reports each problem once per object version, not on every replace', () => {
    const { c, problems } = cache();
    const list = [svc({ name: 'good' }), badSvc({ resourceVersion: '2' })];
    c.replaceServices(list);
    c.replaceServices(list);
    c.upsertService(badSvc({ resourceVersion: '2' }));
    expect(problems).toHaveLength(1);
    // A new version with the same problem is news; so is another problem.
    c.upsertService(badSvc({ resourceVersion: '3' }));
    expect(problems).toHaveLength(2);
    c.upsertService(svc({ resourceVersion: '3', ports: [{ name: 'http', port: 80, protocol: 'ICMP' as 'TCP' }] }));
    expect(problems.map((p) => p.field)).toEqual(['spec.ports[0].port', 'spec.ports[0].port', 'spec.ports[0].protocol']);
  });

  it('reports a problem again after the object was fixed and broke again, or left the list and came back', () => {
    const { c, problems } = cache();
    c.upsertService(badSvc());
    c.upsertService(svc());
    c.upsertService(badSvc());
    expect(problems).toHaveLength(2);
    c.replaceServices([]);
    c.replaceServices([badSvc()]);
    expect(problems).toHaveLength(3);
  });

  it('keeps a malformed object among good ones out, and the good ones in', () => {
    const { c, problems } = cache();
    c.replaceEndpointSlices([slice({ name: 'a' }), slice({ name: 'b', ports: [{ name: 'http', port: 99999 }] }), slice({ name: 'c' })]);
    expect(problems).toHaveLength(1);
    expect(problems[0]?.object).toBe('EndpointSlice default/b');
    expect(c.slicesFor('default/web').map((s) => s.metadata?.name)).toEqual(['a', 'c']);
  });
});

describe('StateCache replace', () => {
  it('removes what the full list no longer holds, and marks only what changed', () => {
    const { c } = cache();
    c.replaceServices([svc({ name: 'a' }), svc({ name: 'b' })]);
    c.replaceEndpointSlices([slice({ name: 'a-1', service: 'a' }), slice({ name: 'b-1', service: 'b' })]);
    c.takeDirty();
    c.replaceServices([svc({ name: 'b' }), svc({ name: 'c' })]);
    c.replaceEndpointSlices([slice({ name: 'b-1', service: 'b' })]);
    expect(c.serviceKeys()).toEqual(['default/b', 'default/c']);
    expect(c.slicesFor('default/a')).toEqual([]);
    expect(c.takeDirty()).toEqual(new Set(['default/a', 'default/c']));
  });

  it('keeps the last good version of an object that is listed but now invalid', () => {
    const { c } = cache();
    c.replaceServices([svc({ name: 'a' }), svc({ name: 'b' })]);
    c.replaceEndpointSlices([slice({ name: 'a-1', service: 'a' })]);
    c.replaceServices([badSvc({ name: 'a', resourceVersion: '2' })]);
    c.replaceEndpointSlices([slice({ name: 'a-1', service: 'a', resourceVersion: '2', endpoints: [{ ip: 'x' }] })]);
    expect(c.serviceKeys()).toEqual(['default/a']);
    expect(c.service('default/a')?.spec?.ports?.[0]?.port).toBe(80);
    expect(c.slicesFor('default/a')[0]?.endpoints[0]?.addresses).toEqual(['10.0.0.1']);
  });

  it('is a StateSink', () => {
    const sink: StateSink = cache().c;
    sink.setNode({ name: 'n' });
    expect(typeof sink.replaceServices).toBe('function');
  });
});

describe('StateCache and hostile objects', () => {
  /** A Service whose annotation nests 100,000 levels: parsed anew each call, as each read of a file does. */
  const deepService = (port: number): V1Service => {
    const inner = `${'{"a":'.repeat(100_000)}1${'}'.repeat(100_000)}`;
    const base = JSON.stringify(svc({ name: 'deep', ports: [{ name: 'http', port }] }));
    return JSON.parse(base.replace('"metadata":{', `"metadata":{"annotations":{"deep":${inner}},`)) as V1Service;
  };

  it('refuses an object nested past the stack, names the field, and applies the others, read after read', () => {
    const { c, problems } = cache();
    for (const port of [80, 81]) {
      c.replaceServices([svc({ name: 'a', ports: [{ name: 'http', port }] }), deepService(port), svc({ name: 'b', ports: [{ name: 'http', port }] })]);
    }
    expect(c.serviceKeys()).toEqual(['default/a', 'default/b']);
    expect(c.service('default/b')?.spec?.ports?.[0]?.port).toBe(81);
    expect(problems).toEqual([{ object: 'Service default/deep', field: 'metadata.annotations.deep.a.a.a…', message: 'nested more than 100 levels deep' }]);
  });

  it('reports an object whose upsert throws all the same, and applies the others in the list', () => {
    const { c, problems } = cache();
    const hostile = svc({ name: 'hostile' });
    Object.defineProperty(hostile, 'spec', { enumerable: true, get: () => { throw new Error('no spec for you'); } });
    c.replaceServices([svc({ name: 'a' }), hostile, svc({ name: 'b' })]);
    const weird = { ...slice({ name: 'weird' }), metadata: { name: { toString: 1, valueOf: 1 } } } as unknown as V1EndpointSlice;
    c.replaceEndpointSlices([weird, slice({ name: 'web-1' })]);
    expect(c.serviceKeys()).toEqual(['default/a', 'default/b']);
    expect(c.slicesFor('default/web').map((sl) => sl.metadata?.name)).toEqual(['web-1']);
    expect(problems[0]).toEqual({ object: 'Service default/hostile', field: '', message: 'not applied: "no spec for you"' });
  });
});

describe('deepEqual', () => {
  it('compares plain JSON-shaped data, treating absent and undefined alike', () => {
    expect(deepEqual({ a: [1, { b: 'x' }] }, { a: [1, { b: 'x' }] })).toBe(true);
    expect(deepEqual({ a: 1, b: undefined }, { a: 1 })).toBe(true);
    expect(deepEqual({ a: [1] }, { a: { 0: 1 } })).toBe(false);
    expect(deepEqual([1, 2], [1, 2, 3])).toBe(false);
    expect(deepEqual(new Date(5), new Date(5))).toBe(true);
    expect(deepEqual(new Date(5), '1970')).toBe(false);
    expect(deepEqual(null, {})).toBe(false);
  });
});
