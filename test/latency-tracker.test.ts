import type { V1EndpointSlice } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { ProgrammingLatencyTracker, type ProgrammedChange } from '../src/core/programming-latency.js';
import { endpointSlice } from './helpers/objects.js';

/** network_programming_duration_seconds bookkeeping, on fake clocks (no timing is asserted on a real one). */

const T0 = Date.parse('2026-11-22T10:00:00Z');

/** The tracker's inputs under the names of the changes that carry them (the metrics route them so). */
interface SliceFeed {
  upsertEndpointSlice(o: V1EndpointSlice): void;
  deleteEndpointSlice(ns: string, name: string): void;
  replaceEndpointSlices(objs: readonly V1EndpointSlice[]): void;
}

function feed(tracker: ProgrammingLatencyTracker): SliceFeed {
  return {
    upsertEndpointSlice: (o) => tracker.upserted(o),
    deleteEndpointSlice: (ns, name) => tracker.deleted(ns, name),
    replaceEndpointSlices: (objs) => tracker.replaced(objs),
  };
}

function rig(): { tracker: ProgrammingLatencyTracker; sink: SliceFeed; seen: ProgrammedChange[]; clock: { mono: number; wall: number }; synced: (durationMs: number) => void } {
  const clock = { mono: 1000, wall: T0 };
  const seen: ProgrammedChange[] = [];
  const tracker = new ProgrammingLatencyTracker({ clock: { now: () => clock.mono }, wallNow: () => clock.wall, observe: (c) => seen.push(c) });
  // A sync that ends now and took `durationMs`.
  const synced = (durationMs: number): void => tracker.synced({ startedAt: clock.mono - durationMs });
  return { tracker, sink: feed(tracker), seen, clock, synced };
}

function slice(name: string, trigger?: number): V1EndpointSlice {
  const s = endpointSlice({ service: 'web', name, ports: [{ name: 'http', port: 80 }], endpoints: [{ ip: '10.0.0.1' }] }) as { metadata: Record<string, unknown> };
  if (trigger !== undefined) s.metadata.annotations = { 'endpoints.kubernetes.io/last-change-trigger-time': new Date(trigger).toISOString() };
  return s as unknown as V1EndpointSlice;
}

describe('network programming latency', () => {
  it('measures from the trigger time, and from arrival, to the end of the sync that programmed the change', () => {
    const { tracker, sink, seen, clock, synced } = rig();
    clock.wall = T0 + 2000;
    sink.upsertEndpointSlice(slice('web-1', T0 + 1500)); // arrives at mono 1000
    clock.mono += 300;
    clock.wall += 300;
    synced(50); // started at mono 1250, after the arrival
    expect(seen).toEqual([{ service: 'default/web', sinceTriggerSeconds: 0.8, sinceArrivalSeconds: 0.3 }]);
    expect(tracker.pendingCount).toBe(0);
  });

  it('leaves a change that arrived during a sync to the next one', () => {
    const { sink, seen, clock, synced } = rig();
    clock.wall = T0 + 1000;
    clock.mono = 5000;
    sink.upsertEndpointSlice(slice('web-1', T0 + 1000));
    clock.mono = 5010;
    synced(20); // started at 4990: before the arrival
    expect(seen).toEqual([]);
    clock.mono = 5100;
    synced(5);
    expect(seen.map((s) => s.sinceArrivalSeconds)).toEqual([0.1]);
  });

  it('counts a slice once per trigger time: re-lists and resyncs of the same version are not changes', () => {
    const { sink, seen, clock, synced } = rig();
    clock.wall = T0 + 1000;
    sink.upsertEndpointSlice(slice('web-1', T0 + 500));
    sink.replaceEndpointSlices([slice('web-1', T0 + 500)]);
    sink.upsertEndpointSlice(slice('web-1', T0 + 500));
    clock.mono += 10;
    synced(1);
    expect(seen).toHaveLength(1);
    sink.upsertEndpointSlice(slice('web-1', T0 + 900));
    clock.mono += 10;
    synced(1);
    expect(seen).toHaveLength(2);
  });

  it('ignores trigger times from before it started, slices without one, and forgets deleted slices', () => {
    const { sink, seen, clock, synced } = rig();
    sink.upsertEndpointSlice(slice('old', T0 - 60_000));
    sink.upsertEndpointSlice(slice('none'));
    clock.wall = T0 + 100;
    sink.upsertEndpointSlice(slice('web-1', T0 + 100));
    sink.deleteEndpointSlice('default', 'web-1');
    sink.upsertEndpointSlice(slice('web-1', T0 + 100)); // re-created: a change again
    clock.mono += 10;
    synced(1);
    expect(seen).toHaveLength(2);
  });

  it('keeps a bounded backlog while nothing syncs', () => {
    const seen: ProgrammedChange[] = [];
    let wall = T0;
    const tracker = new ProgrammingLatencyTracker({ clock: { now: () => 0 }, wallNow: () => wall, observe: (c) => seen.push(c), maxPending: 3 });
    const sink = feed(tracker);
    for (let i = 1; i <= 5; i++) {
      wall = T0 + i * 1000;
      sink.upsertEndpointSlice(slice(`web-${i}`, wall));
    }
    expect(tracker.pendingCount).toBe(3);
  });
});
