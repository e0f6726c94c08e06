import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { ObjectProblem } from '../../core/model.js';
import { BYTE, byteBefore, byteFrom, commonPrefix, commonSuffix, isBlank, scanItems, scanList, type Span } from './json-list-scan.js';
import { holdsOf, listItems, manifestOf, parseDocuments, type Doc, type Holds, type Manifest } from './manifest.js';
import { objectKey } from '../../core/object-key.js';

/**
 * Reads successive versions of a state file and says what changed, re-parsing as little as it
 * can. A JSON list (what `kubectl get -o json` prints) is kept as an index of its items' byte
 * spans and parsed objects; a new version that differs from the last one only inside the items
 * array costs a memcmp of the two versions and a JSON.parse of the items around the change, and
 * yields only the objects that changed. Anything else (YAML, a change outside the items, a
 * window that does not scan cleanly) is parsed whole, exactly as parseManifest would.
 *
 * A read that throws (ProxyError PARSE) changes nothing: the next read is compared with the last
 * version that parsed.
 */

export interface ObjectKey {
  namespace: string;
  name: string;
}

export type ManifestChange =
  | { kind: 'full'; manifest: Manifest }
  | {
      kind: 'delta';
      upsertServices: V1Service[];
      deleteServices: ObjectKey[];
      upsertEndpointSlices: V1EndpointSlice[];
      deleteEndpointSlices: ObjectKey[];
      /** Every problem of the whole file now, as parseManifest would list them. */
      problems: ObjectProblem[];
      /** Distinct objects in the whole file now. */
      services: number;
      endpointSlices: number;
    };

/**
 * Built as literals (`{ start, end, manifest }`), never by spreading a Span: V8 gives spread-built
 * objects a shape that makes the offset shift after an edit ~20 times slower (20 ms at 20,000 items).
 */
interface Item extends Span {
  manifest: Manifest;
}

interface Index {
  open: number;
  close: number;
  items: Item[];
  read: (item: Doc) => Manifest;
  /** Per key (see keyOf): how many objects in the file carry it. */
  counts: Map<string, number>;
  services: number;
  endpointSlices: number;
}

interface Meta {
  metadata?: { namespace?: string; name?: string };
}

const SERVICE = 'Service ';
const SLICE = 'EndpointSlice ';

/** The cache's identity of an object: kind, then its key as state-cache.ts keys it. */
function keyOf(prefix: string, obj: Meta): string {
  return `${prefix}${objectKey(obj)}`;
}

function* keysOf(m: Manifest): Generator<string> {
  for (const s of m.services) yield keyOf(SERVICE, s);
  for (const s of m.endpointSlices) yield keyOf(SLICE, s);
}

function splitKey(key: string): { prefix: string; key: ObjectKey } {
  const prefix = key.startsWith(SERVICE) ? SERVICE : SLICE;
  const rest = key.slice(prefix.length);
  const i = rest.indexOf('/');
  return { prefix, key: { namespace: rest.slice(0, i), name: rest.slice(i + 1) } };
}

export class ManifestReader {
  private last: Buffer | undefined;
  private index: Index | undefined;
  /** The single document of the last whole read, until prepare() (or the next read) indexes it. */
  private unindexed: unknown;
  private lastHolds: Holds = 'nothing';

  /**
   * What the whole file says as of the last read that returned a change (manifest.ts, Holds):
   * the caller decides whether a file holding no objects stands for the state.
   */
  get holds(): Holds {
    return this.lastHolds;
  }

  constructor(private readonly file: string) {}

  /** What changed since the last version read; undefined when the bytes are the same. */
  read(buf: Buffer): ManifestChange | undefined {
    if (this.last?.equals(buf)) return undefined;
    this.prepare();
    const delta = this.index && this.last ? this.readDelta(this.last, this.index, buf) : undefined;
    if (delta) {
      this.last = buf;
      return delta;
    }
    const docs = parseDocuments(buf.toString('utf8'), this.file);
    this.last = buf;
    this.index = undefined;
    this.unindexed = docs.length === 1 ? docs[0] : undefined;
    const manifest = manifestOf(docs, this.file);
    this.lastHolds = isBlank(buf) ? 'blank' : holdsOf(docs, manifest);
    return { kind: 'full', manifest };
  }

  /**
   * Index the last whole read now, so that the next edit is read as a delta without first paying
   * for the index (≈60 ms at 10,000 Services). A whole read leaves this for later because it
   * usually comes at start-up, when ports are waiting to listen; the next read does it anyway.
   */
  prepare(): void {
    if (this.unindexed === undefined || this.last === undefined) return;
    this.index = indexOf(this.last, this.unindexed, this.file);
    this.unindexed = undefined;
  }

  /** Forget the last version: the next read is parsed whole and reported as full. */
  reset(): void {
    this.last = undefined;
    this.index = undefined;
    this.unindexed = undefined;
  }

  /**
   * The change from `prev` to `buf` when it lies inside the items array, or undefined. The index
   * is updated only when a delta is returned.
   *
   * The window re-read is widened to whole items of the old version: [A, B) with A the start of
   * the last item starting at or before the first changed byte, B the end of the first item
   * ending at or after the last one. Everything before A and from B on is the same in both
   * versions, so in the new one the window sits between the same `[`/`,` and `,`/`]` as before.
   */
  private readDelta(prev: Buffer, index: Index, buf: Buffer): ManifestChange | undefined {
    const p = commonPrefix(prev, buf);
    const q = prev.length - commonSuffix(prev, buf, Math.min(prev.length, buf.length) - p);
    if (p <= index.open || q > index.close) return undefined;
    const { items } = index;
    const first = lastStartAtOrBefore(items, p);
    const last = firstEndAtOrAfter(items, q);
    const a = first >= 0 ? (items[first] as Item).start : index.open + 1;
    const b = last < items.length ? (items[last] as Item).end : index.close;
    const shift = buf.length - prev.length;
    const spans = scanItems(buf, a, b + shift);
    if (spans === undefined) return undefined;
    // Every item gone from the window: valid only if the array is now empty.
    if (spans.length === 0 && (byteBefore(buf, a) !== BYTE.LBRACKET || byteFrom(buf, b + shift) !== BYTE.RBRACKET)) return undefined;
    const fresh: Item[] = [];
    for (const span of spans) {
      let doc: unknown;
      try {
        doc = JSON.parse(buf.toString('utf8', span.start, span.end));
      } catch {
        return undefined; // parsed whole, so that the error names the file's line and column
      }
      fresh.push({ start: span.start, end: span.end, manifest: index.read(doc as Doc) });
    }

    const from = Math.max(first, 0);
    const removed = items.splice(from, Math.min(last, items.length - 1) - from + 1, ...fresh);
    for (let k = from + fresh.length; k < items.length; k++) {
      const item = items[k] as Item;
      item.start += shift;
      item.end += shift;
    }
    index.close += shift;
    return this.changeOf(index, removed, fresh);
  }

  private changeOf(index: Index, removed: readonly Item[], fresh: readonly Item[]): ManifestChange {
    const touched = new Set<string>();
    const tally = (item: Item, by: number): void => {
      for (const key of keysOf(item.manifest)) {
        touched.add(key);
        count(index, key, by);
      }
    };
    for (const item of removed) tally(item, -1);
    const inFresh = new Map<string, V1Service | V1EndpointSlice>();
    for (const item of fresh) {
      for (const s of item.manifest.services) inFresh.set(keyOf(SERVICE, s), s);
      for (const s of item.manifest.endpointSlices) inFresh.set(keyOf(SLICE, s), s);
      tally(item, +1);
    }
    // A delta is an edit of a list's items: with none left it is an empty list.
    this.lastHolds = index.services + index.endpointSlices > 0 ? 'objects' : index.items.length === 0 ? 'empty-list' : 'nothing';
    const change = {
      kind: 'delta' as const,
      upsertServices: [] as V1Service[],
      deleteServices: [] as ObjectKey[],
      upsertEndpointSlices: [] as V1EndpointSlice[],
      deleteEndpointSlices: [] as ObjectKey[],
      problems: index.items.flatMap((item) => item.manifest.problems),
      services: index.services,
      endpointSlices: index.endpointSlices,
    };
    for (const key of touched) {
      const n = index.counts.get(key) ?? 0;
      const { prefix, key: objKey } = splitKey(key);
      const isService = prefix === SERVICE;
      if (n === 0) {
        (isService ? change.deleteServices : change.deleteEndpointSlices).push(objKey);
        continue;
      }
      // One holder, and it is new: that is the object. Otherwise (duplicates, or the one holder
      // lies outside the window) every holder in file order, as a full replace would upsert them.
      const holders = n === 1 && inFresh.has(key) ? [inFresh.get(key)] : holdersOf(index, prefix, key);
      for (const obj of holders) {
        if (isService) change.upsertServices.push(obj as V1Service);
        else change.upsertEndpointSlices.push(obj as V1EndpointSlice);
      }
    }
    return change;
  }
}

function count(index: Index, key: string, by: number): void {
  const n = (index.counts.get(key) ?? 0) + by;
  const isService = key.startsWith(SERVICE);
  if (n === 0) {
    index.counts.delete(key);
    if (isService) index.services--;
    else index.endpointSlices--;
  } else {
    if (by > 0 && n === 1) {
      if (isService) index.services++;
      else index.endpointSlices++;
    }
    index.counts.set(key, n);
  }
}

function holdersOf(index: Index, prefix: string, key: string): Array<V1Service | V1EndpointSlice> {
  const out: Array<V1Service | V1EndpointSlice> = [];
  for (const item of index.items) {
    const objs = prefix === SERVICE ? item.manifest.services : item.manifest.endpointSlices;
    for (const obj of objs) if (keyOf(prefix, obj) === key) out.push(obj);
  }
  return out;
}

/** The index of a JSON list document, or undefined when the file is not one (it is then always parsed whole). */
function indexOf(buf: Buffer, doc: unknown, file: string): Index | undefined {
  const list = listItems(doc, file);
  if (list === undefined) return undefined;
  const layout = scanList(buf);
  if (layout === undefined || layout.items.length !== list.items.length) return undefined;
  const index: Index = { open: layout.open, close: layout.close, items: [], read: list.read, counts: new Map(), services: 0, endpointSlices: 0 };
  layout.items.forEach((span, k) => {
    const manifest = list.read(list.items[k] as Doc);
    index.items.push({ start: span.start, end: span.end, manifest });
    for (const key of keysOf(manifest)) count(index, key, +1);
  });
  return index;
}

/** Index of the last item whose start is <= offset, or -1 (items are in file order). */
function lastStartAtOrBefore(items: readonly Span[], offset: number): number {
  let lo = 0;
  let hi = items.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((items[mid] as Span).start <= offset) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

/** Index of the first item whose end is >= offset, or items.length. */
function firstEndAtOrAfter(items: readonly Span[], offset: number): number {
  let lo = 0;
  let hi = items.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((items[mid] as Span).end < offset) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
