import { it, expect } from 'vitest';
import { ManifestReader } from '../src/io/kube/manifest-reader.js';
import { parseManifest } from '../src/io/kube/manifest.js';
import { problemString } from '../src/core/model.js';
import { seeded } from './helpers/seeded.js';

const FILE = 's.json';
function itemText(rand: () => number, i: number): string {
  const name = `n${Math.floor(rand() * 5)}`;
  const r = rand();
  const ws = rand() < 0.3 ? '\n  ' : '';
  const dupKind = rand() < 0.1 ? `"kind":"ConfigMap",` : '';
  const tricky = JSON.stringify(['}{', '","', '\\"', 'é😀', ']', ',{', '\\', '"items":[', '\u2028'][Math.floor(rand() * 9)]);
  if (r < 0.45) return `{${ws}${dupKind}"apiVersion":"v1","kind":"Service",${ws}"metadata":{"name":"${name}"${rand() < 0.3 ? ',"namespace":"a"' : ''},"annotations":{"t":${tricky}}},"spec":{"ports":[{"port":${80 + i}}]}}`;
  if (r < 0.8) return `{"apiVersion":"discovery.k8s.io/v1",${dupKind}"kind":"EndpointSlice","metadata":{"name":"${name}","x":${tricky}},"endpoints":[],"v":${i}}`;
  if (r < 0.9) return `{"apiVersion":"v1","kind":"List","items":[${rand() < 0.5 ? '' : `{"apiVersion":"v1","kind":"Service","metadata":{"name":"${name}"},"nested":${i}}`}]}`;
  return `{"kind":"ConfigMap","metadata":{"name":"${name}"}}`;
}
function render(rand: () => number, items: string[], root: number): string {
  const sep = [',', ', ', ',\n', '\n,\n'][Math.floor(rand() * 4)];
  const head = ['{"apiVersion":"v1","kind":"List","items":[', '\uFEFF{"kind":"List", "items" : [ ', '{"apiVersion":"v1","kind":"ServiceList","items":[', '{"items":[', ][root];
  const tail = root === 3 ? '],"kind":"List"}' : ']}\n';
  return head + items.join(sep) + tail;
}

it('fuzz2', () => {
  let deltas = 0, checked = 0;
  for (let seed = 1; seed < 400; seed++) {
    const rand = seeded(seed * 7 + 3);
    const root = Math.floor(rand() * 4);
    let items = Array.from({ length: Math.floor(rand() * 14) }, (_, i) => itemText(rand, i));
    const reader = new ManifestReader(FILE);
    for (let step = 0; step < 40; step++) {
      const op = rand();
      const i = Math.floor(rand() * (items.length + 1));
      if (op < 0.25) items.splice(i, 0, itemText(rand, step + 100));
      else if (op < 0.45) items.splice(i, 1 + Math.floor(rand() * 3));
      else if (op < 0.6) items[Math.min(i, items.length - 1)] = itemText(rand, step + 200);
      else if (op < 0.7 && items.length > 1) { const [m] = items.splice(i, 1); items.splice(Math.floor(rand() * items.length), 0, m!); }
      else if (op < 0.78 && items.length > 0) items.splice(i, 0, items[Math.floor(rand() * items.length)]!);
      else if (op < 0.85) items = items.filter(() => rand() < 0.7);
      else if (op < 0.9) items.reverse();
      let text = render(rand, items, root);
      if (rand() < 0.15) { const k = Math.floor(rand() * text.length); text = text.slice(0, k) + text.slice(k + 1 + Math.floor(rand() * 5)); }
      let expected;
      try { expected = parseManifest(text, FILE); } catch { expected = undefined; }
      let read;
      try { read = reader.diff(Buffer.from(text)); } catch { expect(expected, text).toBeUndefined(); continue; }
      expect(expected, text).toBeDefined();
      if (!expected || read === undefined) continue;
      if (rand() < 0.1) continue;
      if (read.change.kind === 'delta') deltas++;
      read.accept();
      if (rand() < 0.7) reader.prepare();
      const objs = read.objects();
      const got = { s: [...objs.services], e: [...objs.endpointSlices], p: (read.change.kind === 'full' ? read.change.manifest.problems : read.change.problems).map(problemString), h: read.holds };
      expect(got, `seed ${seed} step ${step}\nnew  ${text}`).toEqual({ s: expected.services, e: expected.endpointSlices, p: expected.problems.map(problemString), h: new ManifestReader(FILE).diff(Buffer.from(text))!.holds });
      checked++;
    }
  }
  // The delta path, not only whole parses, must have been exercised.
  expect(deltas).toBeGreaterThan(2000);
  expect(checked).toBeGreaterThan(deltas);
});
