import { it, expect } from 'vitest';
import { ManifestReader } from '../src/io/kube/manifest-reader.js';
import { parseManifest } from '../src/io/kube/manifest.js';

const FILE = 'state.json';
const svc = (name: string): unknown => ({ apiVersion: 'v1', kind: 'Service', metadata: { name }, spec: { clusterIP: '10.96.0.1', ports: [{ port: 80 }] } });
/** `levels` Lists one inside the other around a Service. */
function nested(levels: number, inner: unknown): unknown {
  let doc = inner;
  for (let i = 0; i < levels; i++) doc = { apiVersion: 'v1', kind: 'List', items: [doc] };
  return doc;
}

it('reads a List nested in an item as deep as a whole parse does, in a delta', () => {
  const text = (item: unknown): Buffer => Buffer.from(JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [svc('a'), item] }));
  const reader = new ManifestReader(FILE);
  expect(reader.read(text(svc('b')))?.kind).toBe('full');
  reader.prepare();
  // The root List and 100 more inside it: a whole parse refuses the innermost list.
  const deep = text(nested(100, svc('deep')));
  const whole = parseManifest(deep.toString(), FILE);
  expect(whole.services.map((s) => s.metadata?.name)).toEqual(['a']);
  expect(whole.problems.map((p) => p.message)).toEqual(['lists nested more than 100 levels deep']);
  const change = reader.read(deep);
  expect(change?.kind).toBe('delta');
  if (change?.kind !== 'delta') return;
  expect(change.upsertServices.map((s) => s.metadata?.name)).toEqual([]);
  expect(change.problems.map((p) => p.message)).toEqual(['lists nested more than 100 levels deep']);
});
