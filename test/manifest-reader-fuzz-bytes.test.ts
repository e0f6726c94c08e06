import { it, expect } from 'vitest';
import { ManifestReader } from '../src/io/kube/manifest-reader.js';
import { parseManifest } from '../src/io/kube/manifest.js';
import { problemString } from '../src/core/model.js';
import { seeded } from './helpers/seeded.js';

const FILE = 's.json';
type Obj = Record<string, unknown>;
function item(rand: () => number, i: number): Obj {
  const name = `n${Math.floor(rand() * 6)}`;
  const r = rand();
  const tricky = ['}{', '","', '\\"', 'é😀', ']', ',{', '\\', '"items":['][Math.floor(rand() * 8)];
  if (r < 0.5) return { apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: rand() < 0.5 ? 'a' : undefined, annotations: { t: tricky } }, spec: { ports: [{ port: 80 + i }] } };
  if (r < 0.9) return { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name, annotations: { t: tricky } }, endpoints: [], v: i };
  return { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name } };
}

it('fuzz', () => {
  let deltas = 0, checked = 0;
  for (let seed = 1; seed < 300; seed++) {
    const rand = seeded(seed);
    const items = Array.from({ length: 1 + Math.floor(rand() * 6) }, (_, i) => item(rand, i));
    let text = JSON.stringify({ apiVersion: 'v1', kind: 'List', items }, null, rand() < 0.5 ? 1 : 0);
    const reader = new ManifestReader(FILE);
    let prevText = text;
    for (let step = 0; step < 60; step++) {
      // byte-level edit of the last good text
      const t = [...prevText];
      const op = rand();
      const i = Math.floor(rand() * (t.length + 1));
      const len = 1 + Math.floor(rand() * 40);
      let n: string[];
      if (op < 0.3) { const piece = t.slice(i, i + len); const k = Math.floor(rand() * (t.length + 1)); n = [...t.slice(0, k), ...piece, ...t.slice(k)]; }
      else if (op < 0.55) { n = [...t.slice(0, i), ...t.slice(i + len)]; }
      else if (op < 0.75) { const piece = t.slice(i, i + len); const rest = [...t.slice(0, i), ...t.slice(i + len)]; const k = Math.floor(rand() * (rest.length + 1)); n = [...rest.slice(0, k), ...piece, ...rest.slice(k)]; }
      else { const ch = [' ', ',', '{}', '"', '\\', '\n', '[]', JSON.stringify(item(rand, 99)), 'é'][Math.floor(rand() * 9)] as string; n = [...t.slice(0, i), ch, ...t.slice(i)]; }
      text = n.join('');
      let expected;
      try { expected = parseManifest(text, FILE); } catch { expected = undefined; }
      let read;
      try { read = reader.diff(Buffer.from(text)); } catch { expect(expected, text).toBeUndefined(); continue; }
      expect(expected, text).toBeDefined();
      if (!expected) continue;
      if (read === undefined) continue;
      if (read.change.kind === 'delta') deltas++;
      read.accept();
      reader.prepare();
      const objs = read.objects();
      const got = { s: [...objs.services], e: [...objs.endpointSlices], p: (read.change.kind === 'full' ? read.change.manifest.problems : read.change.problems).map(problemString) };
      expect(got, `seed ${seed} step ${step}\nprev ${prevText}\nnew  ${text}`).toEqual({ s: expected.services, e: expected.endpointSlices, p: expected.problems.map(problemString) });
      checked++;
      prevText = text;
    }
  }
  // The delta path, not only whole parses, must have been exercised.
  expect(deltas).toBeGreaterThan(500);
  expect(checked).toBeGreaterThan(deltas);
});
