import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import type { NodeInfo } from '../src/core/model.js';
import type { StateSink } from '../src/core/state-cache.js';
import { ProgrammingLatencyTracker, type ProgrammedChange } from '../src/io/kube/programming-latency.js';
import { endpointSlice } from './helpers/objects.js';

/** network_programming_duration_seconds bookkeeping, on fake clocks (no timing is asserted on a real one). */

const T0 = Date.parse('2026-11-22T10:00:00Z');

function rig(): { tracker: ProgrammingLatencyTracker; sink: StateSink; seen: ProgrammedChange[]; forwarded: string[]; clock: { mono: number; wall: number } } {
  const clock = { mono: 1000, wall: T0 };
  const seen: ProgrammedChange[] = [];
  const forwarded: string[] = [];
  const inner: StateSink = {
    upsertService: (o: V1Service) => void forwarded.push(`upsertService ${o.metadata?.name}`),
    deleteService: (_ns: string, name: string) => void forwarded.push(`deleteService ${name}`),
    replaceServices: (objs: readonly V1Service[]) => void forwarded.push(`replaceServices ${objs.length}`),
    upsertEndpointSlice: (o: V1EndpointSlice) => void forwarded.push(`upsertEndpointSlice ${o.metadata?.name}`),
    deleteEndpointSlice: (_ns: string, name: string) => void forwarded.push(`deleteEndpointSlice ${name}`),
    replaceEndpointSlices: (objs: readonly V1EndpointSlice[]) => void forwarded.push(`replaceEndpointSlices ${objs.length}`),
    setNode: (n: NodeInfo) => void forwarded.push(`setNode ${n.name}`),
  };
  const tracker = new ProgrammingLatencyTracker({ clock: { now: () => clock.mono }, wallNow: () => clock.wall, observe: (c) => seen.push(c) });
  return { tracker, sink: tracker.wrap(inner), seen, forwarded, clock };
}

function slice(name: string, trigger?: number): V1EndpointSlice {
  const s = endpointSlice({ service: 'web', name, ports: [{ name: 'http', port: 80 }], endpoints: [{ ip: '10.0.0.1' }] }) as { metadata: Record<string, unknown> };
  if (trigger !== undefined) s.metadata.annotations = { 'endpoints.kubernetes.io/last-change-trigger-time': new Date(trigger).toISOString() };
  return s as unknown as V1EndpointSlice;
}

describe('network programming latency', () => {
  it('measures from the trigger time, and from arrival, to the end of the sync that programmed the change', () => {
    const { tracker, sink, seen, clock } = rig();
    clock.wall = T0 + 2000;
    sink.upsertEndpointSlice(slice('web-1', T0 + 1500)); // arrives at mono 1000
    clock.mono += 300;
    clock.wall += 300;
    tracker.synced({ durationMs: 50 }); // started at mono 1250, after the arrival
    expect(seen).toEqual([{ service: 'default/web', sinceTriggerSeconds: 0.8, sinceArrivalSeconds: 0.3 }]);
    expect(tracker.pendingCount).toBe(0);
  });

  it('leaves a change that arrived during a sync to the next one', () => {
    const { tracker, sink, seen, clock } = rig();
    clock.wall = T0 + 1000;
    clock.mono = 5000;
    sink.upsertEndpointSlice(slice('web-1', T0 + 1000));
    clock.mono = 5010;
    tracker.synced({ durationMs: 20 }); // started at 4990: before the arrival
    expect(seen).toEqual([]);
    clock.mono = 5100;
    tracker.synced({ durationMs: 5 });
    expect(seen.map((s) => s.sinceArrivalSeconds)).toEqual([0.1]);
  });

  it('counts a slice once per trigger time: re-lists and resyncs of the same version are not changes', () => {
    const { tracker, sink, seen, clock } = rig();
    clock.wall = T0 + 1000;
    sink.upsertEndpointSlice(slice('web-1', T0 + 500));
    sink.replaceEndpointSlices([slice('web-1', T0 + 500)]);
    sink.upsertEndpointSlice(slice('web-1', T0 + 500));
    clock.mono += 10;
    tracker.synced({ durationMs: 1 });
    expect(seen).toHaveLength(1);
    sink.upsertEndpointSlice(slice('web-1', T0 + 900));
    clock.mono += 10;
    tracker.synced({ durationMs: 1 });
    expect(seen).toHaveLength(2);
  });

  it('ignores trigger times from before it started, slices without one, and forgets deleted slices', () => {
    const { tracker, sink, seen, clock } = rig();
    sink.upsertEndpointSlice(slice('old', T0 - 60_000));
    sink.upsertEndpointSlice(slice('none'));
    clock.wall = T0 + 100;
    sink.upsertEndpointSlice(slice('web-1', T0 + 100));
    sink.deleteEndpointSlice('default', 'web-1');
    sink.upsertEndpointSlice(slice('web-1', T0 + 100)); // re-created: a change again
    clock.mono += 10;
    tracker.synced({ durationMs: 1 });
    expect(seen).toHaveLength(2);
  });

  it('forwards everything to the sink it wraps', () => {
    const { sink, forwarded } = rig();
    sink.upsertService({ metadata: { name: 's' } });
    sink.deleteService('default', 's');
    sink.replaceServices([]);
    sink.upsertEndpointSlice(slice('e'));
    sink.deleteEndpointSlice('default', 'e');
    sink.replaceEndpointSlices([slice('e')]);
    sink.setNode({ name: 'node1' });
    expect(forwarded).toEqual(['upsertService s', 'deleteService s', 'replaceServices 0', 'upsertEndpointSlice e', 'deleteEndpointSlice e', 'replaceEndpointSlices 1', 'setNode node1']);
  });

  it('keeps a bounded backlog while nothing syncs', () => {
    const seen: ProgrammedChange[] = [];
    let wall = T0;
    const tracker = new ProgrammingLatencyTracker({ clock: { now: () => 0 }, wallNow: () => wall, observe: (c) => seen.push(c), maxPending: 3 });
    const noop = (): void => {};
    const sink = tracker.wrap({ upsertService: noop, deleteService: noop, replaceServices: noop, upsertEndpointSlice: noop, deleteEndpointSlice: noop, replaceEndpointSlices: noop, setNode: noop });
    for (let i = 1; i <= 5; i++) {
      wall = T0 + i * 1000;
      sink.upsertEndpointSlice(slice(`web-${i}`, wall));
    }
    expect(tracker.pendingCount).toBe(3);
  });
});
