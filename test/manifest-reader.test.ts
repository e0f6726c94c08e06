import { describe, it, expect } from 'vitest';
import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { ManifestReader, type ManifestChange } from '../src/io/kube/manifest-reader.js';
import { commonPrefix, commonSuffix, scanList } from '../src/io/kube/json-list-scan.js';
import { parseManifest, type Manifest } from '../src/io/kube/manifest.js';
import { problemString } from '../src/core/model.js';
import { endpointSlice, service } from './helpers/objects.js';
import { seeded } from './helpers/seeded.js';

type Obj = Record<string, unknown>;
const FILE = 'state.json';

/** The state a sink would hold: per key the last object, as StateCache.replace* leaves it for valid objects. */
class Model {
  services = new Map<string, V1Service>();
  slices = new Map<string, V1EndpointSlice>();
  problems: string[] = [];

  static of(m: Manifest): Model {
    const model = new Model();
    model.apply({ kind: 'full', manifest: m });
    return model;
  }

  apply(change: ManifestChange): void {
    if (change.kind === 'full') {
      this.services = new Map(change.manifest.services.map((s) => [key(s), s]));
      this.slices = new Map(change.manifest.endpointSlices.map((s) => [key(s), s]));
      this.problems = change.manifest.problems.map(problemString);
      return;
    }
    for (const s of change.upsertServices) this.services.set(key(s), s);
    for (const s of change.upsertEndpointSlices) this.slices.set(key(s), s);
    for (const k of change.deleteServices) expect(this.services.delete(`${k.namespace}/${k.name}`)).toBe(true);
    for (const k of change.deleteEndpointSlices) expect(this.slices.delete(`${k.namespace}/${k.name}`)).toBe(true);
    this.problems = change.problems.map(problemString);
    expect(change.services).toBe(this.services.size);
    expect(change.endpointSlices).toBe(this.slices.size);
  }

  /** Comparable form: sorted keys with their objects, and the problems in file order. */
  view(): unknown {
    const sorted = <T>(m: Map<string, T>): Array<[string, T]> => [...m.entries()].sort(([a], [b]) => (a < b ? -1 : 1));
    return { services: sorted(this.services), slices: sorted(this.slices), problems: this.problems };
  }
}

function key(o: { metadata?: { namespace?: string; name?: string } }): string {
  return `${o.metadata?.namespace || 'default'}/${o.metadata?.name ?? ''}`;
}

describe('scanList', () => {
  it('finds the items of a List around strings holding brackets, quotes and backslashes', () => {
    const tricky = { a: '}{][,"\\', b: '\\', c: 'é😀"}', d: [1, { e: '"' }], f: null, g: true, h: -1.5e3 };
    const items = [{ kind: 'Service', x: tricky }, {}, { kind: 'EndpointSlice', y: [[], [{}]] }];
    for (const indent of [0, 2, '\t']) {
      const text = JSON.stringify({ apiVersion: 'v1', kind: 'List', before: { items: [1] }, items, after: '"items"' }, null, indent);
      const buf = Buffer.from(`\uFEFF \n${text}\n`);
      const layout = scanList(buf);
      expect(layout).toBeDefined();
      expect(layout?.items.map((s) => JSON.parse(buf.toString('utf8', s.start, s.end)) as unknown)).toEqual(items);
      expect(buf[layout?.open ?? -1]).toBe('['.charCodeAt(0));
      expect(buf[layout?.close ?? -1]).toBe(']'.charCodeAt(0));
    }
  });

  it('declines documents it cannot index, so they are always parsed whole', () => {
    const no = (text: string): void => expect(scanList(Buffer.from(text)), text).toBeUndefined();
    no('{"kind":"List"}');
    no('{"items":[{}],"items":[{}]}');
    no('{"items":[{}, 1]}');
    no('{"items":{}}');
    no('{"items":[{}]} trailing');
    no('{"items":[{},]}');
    no('{"items":[{"a":"unterminated}]}');
    no('[{"items":[]}]');
    no('kind: List\nitems: []\n');
    // JSON.parse reads an escaped key as `items` too, and keeps the last of two.
    no('{"items":[{}],"\\u0069tems":[{}]}');
    expect(scanList(Buffer.from('{"items":[]}'))?.items).toEqual([]);
  });
});

describe('commonPrefix and commonSuffix', () => {
  it('agree with a byte-by-byte count, across the 64 KiB chunks', () => {
    const rand = seeded(7);
    for (let t = 0; t < 40; t++) {
      const n = Math.floor(rand() * 200_000);
      const a = Buffer.alloc(n, 0x61);
      const b = Buffer.from(a);
      if (n > 0 && rand() < 0.8) b[Math.floor(rand() * n)] = 0x62;
      const c = rand() < 0.5 ? b.subarray(0, Math.floor(rand() * n)) : b;
      let p = 0;
      while (p < Math.min(a.length, c.length) && a[p] === c[p]) p++;
      expect(commonPrefix(a, c)).toBe(p);
      const max = Math.min(a.length, c.length) - p;
      let s = 0;
      while (s < max && a[a.length - 1 - s] === c[c.length - 1 - s]) s++;
      expect(commonSuffix(a, c, max)).toBe(s);
    }
  });
});

/** Random objects with colliding names now and then, other kinds, bad apiVersions and tricky strings. */
function randomItem(rand: () => number, serial: number): Obj {
  const name = `svc-${Math.floor(rand() * 12)}`;
  const namespace = rand() < 0.2 ? undefined : rand() < 0.5 ? 'default' : 'prod';
  const r = rand();
  if (r < 0.4) {
    const s = service({ name, namespace: namespace ?? 'x', ports: [{ name: 'http', port: 80 + Math.floor(rand() * 3) }], resourceVersion: `${serial}` });
    const meta = s.metadata as Obj;
    if (namespace === undefined) delete meta.namespace;
    if (rand() < 0.3) meta.annotations = { note: '}{][,"\\ é😀 "items": [' };
    return s;
  }
  if (r < 0.85) {
    const s = endpointSlice({ service: name, namespace: namespace ?? 'x', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: `10.0.0.${Math.floor(rand() * 250) + 1}` }] });
    if (namespace === undefined) delete (s.metadata as Obj).namespace;
    return s;
  }
  if (r < 0.93) return { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: `cm-${Math.floor(rand() * 3)}` } };
  return { apiVersion: 'v1beta1', kind: 'Service', metadata: { name: `old-${Math.floor(rand() * 3)}` } };
}

/** A file as a sequence of versions: object-level edits, occasional reformatting, root changes and byte-level damage. */
function* versions(seed: number, count: number): Generator<string> {
  const rand = seeded(seed);
  let items: Obj[] = Array.from({ length: 20 }, (_, i) => randomItem(rand, i));
  let indent: number | string = 2;
  let root: Obj = { apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' } };
  const render = (): string => JSON.stringify({ ...root, items }, null, indent);
  for (let v = 0; v < count; v++) {
    const r = rand();
    const at = Math.floor(rand() * (items.length + 1));
    if (r < 0.2 && items.length > 0) {
      // Change one field of one object (the common edit: an endpoint moves).
      const item = items[Math.min(at, items.length - 1)] as Obj;
      items = items.map((o) => (o === item ? { ...item, metadata: { ...(item.metadata as Obj), resourceVersion: `${v}-${rand()}` } } : o));
    } else if (r < 0.3 && items.length > 0) {
      // A script's rewrite of the whole file: several objects changed, added or removed here and there.
      const edits = 1 + Math.floor(rand() * 5);
      for (let e = 0; e < edits; e++) {
        const i = Math.floor(rand() * (items.length + 1));
        const what = rand();
        if (what < 0.6 && i < items.length) items[i] = { ...(items[i] as Obj), metadata: { ...((items[i] as Obj).metadata as Obj), resourceVersion: `${v}-${e}` } };
        else if (what < 0.8) items.splice(i, 0, randomItem(rand, 2000 + v * 10 + e));
        else if (i < items.length) items.splice(i, 1);
      }
      items = [...items];
    } else if (r < 0.45) {
      items = [...items.slice(0, at), randomItem(rand, 1000 + v), ...items.slice(at)];
    } else if (r < 0.6 && items.length > 0) {
      items = items.filter((_, i) => i !== Math.min(at, items.length - 1));
    } else if (r < 0.65 && items.length > 1) {
      const [moved] = items.splice(Math.floor(rand() * items.length), 1);
      items.splice(Math.floor(rand() * items.length), 0, moved as Obj);
      items = [...items];
    } else if (r < 0.68) {
      items = rand() < 0.5 ? [] : items.slice(0, 1);
    } else if (r < 0.72) {
      indent = [0, 1, 2, '\t'][Math.floor(rand() * 4)] as number | string;
    } else if (r < 0.75) {
      root = { ...root, metadata: { resourceVersion: `${v}` } };
    } else if (r < 0.85) {
      // Damage one byte: most such files do not parse; some do (a changed name, or space).
      const text = render();
      const i = Math.floor(rand() * text.length);
      const junk = [',', '}', ']', '"', ' ', 'x', '\\', '{'][Math.floor(rand() * 8)] as string;
      yield rand() < 0.5 ? text.slice(0, i) + junk + text.slice(i) : text.slice(0, i) + text.slice(i + 1);
      continue;
    } else if (r < 0.9) {
      // Whitespace between items, which only a text edit produces.
      const text = render();
      yield text.replace(/\},\n/g, (m) => (rand() < 0.2 ? '}\n ,\n\n' : m));
      continue;
    }
    yield render();
  }
}

describe('ManifestReader', () => {
  it('keeps a sink exactly where a whole parse of each version puts it, edit after edit', () => {
    let deltas = 0;
    let fulls = 0;
    let refused = 0;
    let unaccepted = 0;
    for (const seed of [1, 2, 3, 4, 5, 6]) {
      const rand = seeded(seed + 100);
      const reader = new ManifestReader(FILE);
      const model = new Model();
      let lastGood: Model | undefined;
      for (const text of versions(seed, 250)) {
        let expected: Model | undefined;
        try {
          expected = Model.of(parseManifest(text, FILE));
        } catch {
          expected = undefined;
        }
        if (expected === undefined) {
          // Refused whole, and the state stays: the next version is compared with the last good one.
          expect(() => reader.read(Buffer.from(text)), text).toThrow(/invalid (JSON|YAML)/);
          refused++;
          continue;
        }
        const read = reader.diff(Buffer.from(text));
        // A read the caller does not accept (the file source refusing it) changes nothing: the
        // next one is compared with the last accepted version.
        if (read !== undefined && rand() < 0.1) {
          unaccepted++;
          continue;
        }
        read?.accept();
        const change = read?.change;
        if (change?.kind === 'delta') deltas++;
        if (change?.kind === 'full') fulls++;
        if (change !== undefined) model.apply(change);
        expect(model.view(), `seed ${seed}`).toEqual(expected.view());
        lastGood = expected;
      }
      expect(lastGood).toBeDefined();
    }
    // The generator must exercise both paths and refusals, or the comparison proves little.
    expect(deltas).toBeGreaterThan(500);
    expect(fulls).toBeGreaterThan(50);
    expect(refused).toBeGreaterThan(50);
    expect(unaccepted).toBeGreaterThan(50);
  });

  it('hands on only the object an edit touched, in a large List', () => {
    const items: Obj[] = [];
    for (let i = 0; i < 2000; i++) {
      items.push(service({ name: `s${i}`, clusterIP: '10.96.0.10', ports: [{ port: 80 }] }));
      items.push(endpointSlice({ service: `s${i}`, ports: [{ port: 8080 }], endpoints: [{ ip: '10.0.0.1' }] }));
    }
    const doc = { apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items };
    const reader = new ManifestReader(FILE);
    expect(reader.read(Buffer.from(JSON.stringify(doc)))?.kind).toBe('full');
    items[2001] = endpointSlice({ service: 's1000', ports: [{ port: 8080 }], endpoints: [{ ip: '10.0.0.2' }] });
    const change = reader.read(Buffer.from(JSON.stringify(doc)));
    expect(change).toMatchObject({ kind: 'delta', upsertServices: [], deleteServices: [], deleteEndpointSlices: [], services: 2000, endpointSlices: 2000 });
    expect(change?.kind === 'delta' && change.upsertEndpointSlices.map((s) => s.endpoints[0]?.addresses)).toEqual([['10.0.0.2']]);
    // The same bytes again: nothing.
    expect(reader.read(Buffer.from(JSON.stringify(doc)))).toBeUndefined();
    // The last item removed, then the first: one deletion each.
    items.pop();
    expect(reader.read(Buffer.from(JSON.stringify(doc)))).toMatchObject({ kind: 'delta', deleteEndpointSlices: [{ namespace: 'default', name: 's1999-abcde' }] });
    items.shift();
    expect(reader.read(Buffer.from(JSON.stringify(doc)))).toMatchObject({ kind: 'delta', deleteServices: [{ namespace: 'default', name: 's0' }], upsertServices: [] });
  });

  it('keeps its index right through edits that replace items in place, splice them in, or rebuild the list, and lists the objects once accepted', () => {
    const slice = (i: number, ip: string): Obj => endpointSlice({ service: `s${i}`, ports: [{ port: 8080 }], endpoints: [{ ip }] });
    let items: Obj[] = Array.from({ length: 3000 }, (_, i) => slice(i, '10.0.0.1'));
    const text = (): Buffer => Buffer.from(JSON.stringify({ apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items }, null, 2));
    const addresses = (objs: Iterable<V1EndpointSlice>): string[] => [...objs].map((s) => `${s.metadata?.name ?? ''}=${s.endpoints[0]?.addresses[0] ?? ''}`);
    const expected = (): string[] => items.map((o) => `${(o.metadata as Obj).name as string}=${(((o.endpoints as Obj[])[0] as Obj).addresses as string[])[0] as string}`);
    const reader = new ManifestReader(FILE);
    expect(reader.read(text())?.kind).toBe('full');
    reader.prepare();
    /** One version: its delta names `changed`, and its objects, listed after accept, are the file's. */
    const step = (changed: string[], removed: string[] = []): void => {
      const read = reader.diff(text());
      const change = read?.change;
      expect(change?.kind).toBe('delta');
      if (change?.kind !== 'delta') return;
      expect(change.upsertEndpointSlices.map((s) => s.metadata?.name ?? '').sort()).toEqual([...changed].sort());
      expect(change.deleteEndpointSlices.map((k) => k.name).sort()).toEqual([...removed].sort());
      read?.accept();
      expect(addresses(read?.objects().endpointSlices ?? [])).toEqual(expected());
    };
    // Every item but the first and the last changed, and one removed from their midst: a window
    // of 2,997 new items for 2,998 old ones, past what is spliced in as arguments (rebuilt).
    items = items.filter((_, i) => i !== 1500).map((o, i) => (i === 0 || i === 2998 ? o : slice(i < 1500 ? i : i + 1, '10.0.0.2')));
    step(
      items.slice(1, 2998).map((o) => `${(o.metadata as Obj).name as string}`),
      ['s1500-abcde'],
    );
    // One item replaced where it stood (assigned in place), at the very end.
    items[2998] = slice(2999, '10.0.0.3');
    step(['s2999-abcde']);
    // One item inserted near the start (spliced in): everything after it moves by one item.
    items.splice(3, 0, slice(5000, '10.0.0.4'));
    step(['s5000-abcde']);
    // The index still lines up past the shifted items: a change at the end is one object.
    items[2999] = slice(2999, '10.0.0.5');
    step(['s2999-abcde']);
  });

  it('hands on only what a whole rewrite changed, however scattered: edits, an insertion and a removal', () => {
    const items: Obj[] = [];
    for (let i = 0; i < 1000; i++) items.push(endpointSlice({ service: `s${i}`, ports: [{ port: 8080 }], endpoints: [{ ip: '10.0.0.1' }] }));
    const text = (): Buffer => Buffer.from(JSON.stringify({ apiVersion: 'v1', items, kind: 'List', metadata: { resourceVersion: '' } }, null, 4));
    const reader = new ManifestReader(FILE);
    expect(reader.read(text())?.kind).toBe('full');
    for (const i of [3, 400, 998]) items[i] = endpointSlice({ service: `s${i}`, ports: [{ port: 8080 }], endpoints: [{ ip: '10.0.0.9' }] });
    items.splice(700, 0, endpointSlice({ service: 'new', ports: [{ port: 8080 }], endpoints: [{ ip: '10.0.0.5' }] }));
    items.splice(100, 1);
    const change = reader.read(text());
    expect(change?.kind).toBe('delta');
    if (change?.kind !== 'delta') return;
    expect(change.upsertEndpointSlices.map((s) => s.metadata?.name).sort()).toEqual(['new-abcde', 's3-abcde', 's400-abcde', 's998-abcde']);
    expect(change.deleteEndpointSlices).toEqual([{ namespace: 'default', name: 's100-abcde' }]);
    expect(change.endpointSlices).toBe(1000);
  });

  it('reads items of a typed list with the kind the list implies, also in a delta', () => {
    const svc = (port: number): Obj => {
      const { kind: _k, apiVersion: _a, ...rest } = service({ name: 'web', ports: [{ port }] });
      return rest;
    };
    const named = (s: Obj, name: string): Obj => ({ ...s, metadata: { ...(s.metadata as Obj), name } });
    const text = (port: number): Buffer => Buffer.from(JSON.stringify({ apiVersion: 'v1', kind: 'ServiceList', items: [named(svc(80), 'web0'), named(svc(81), 'web1'), svc(port)] }));
    const reader = new ManifestReader(FILE);
    expect(reader.read(text(80))?.kind).toBe('full');
    reader.prepare(); // indexed ahead of the edit, as the file source does once start-up is over
    const change = reader.read(text(90));
    expect(change?.kind).toBe('delta');
    expect(change?.kind === 'delta' && change.upsertServices.map((s) => s.spec?.ports?.[0]?.port)).toEqual([90]);
  });

  it('follows the items array JSON.parse keeps when an escaped key names it a second time', () => {
    const svc = (name: string, port: number): string => JSON.stringify(service({ name, ports: [{ port }] }));
    const text = (port: number): string => `{"apiVersion":"v1","kind":"List","items":[${svc('a', port)}],"\\u0069tems":[${svc('b', 80)}]}`;
    const reader = new ManifestReader(FILE);
    const model = new Model();
    for (const port of [80, 81, 82]) {
      const change = reader.read(Buffer.from(text(port)));
      if (change) model.apply(change);
      reader.prepare();
      expect(model.view()).toEqual(Model.of(parseManifest(text(port), FILE)).view());
    }
    expect([...model.services.keys()]).toEqual(['default/b']);
  });

  it('parses YAML whole every time', () => {
    const reader = new ManifestReader(FILE);
    const yaml = (port: number): Buffer => Buffer.from(`apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: web}\n  spec: {clusterIP: 10.96.0.1, ports: [{port: ${port}}]}\n`);
    expect(reader.read(yaml(80))?.kind).toBe('full');
    expect(reader.read(yaml(81))?.kind).toBe('full');
  });

  it('after reset, reads the same bytes again as a full change', () => {
    const reader = new ManifestReader(FILE);
    const buf = Buffer.from(JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [] }));
    expect(reader.read(buf)?.kind).toBe('full');
    expect(reader.read(buf)).toBeUndefined();
    reader.reset();
    expect(reader.read(buf)?.kind).toBe('full');
  });
});
