import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { ObjectProblem } from '../../core/model.js';
import { BYTE, byteBefore, byteFrom, commonPrefix, commonSuffix, isBlank, objectEnd, sameRun, scanListSteps, skipSpace, type Span } from './json-list-scan.js';
import { holdsOf, listItems, manifestOf, parseDocuments, type Doc, type Holds, type Manifest } from './manifest.js';
import { objectKey } from '../../core/object-key.js';

/**
 * Reads successive versions of a state file and says what changed, re-parsing as little as it
 * can. A JSON list (what `kubectl get -o json` prints) is kept as an index of its items' byte
 * spans and parsed objects. A new version is compared with the last accepted one byte for byte
 * (memcmp, a chunk at a time), item by item: an item whose bytes are unchanged keeps its parsed
 * objects, whatever moved around it; only the items whose bytes changed are parsed, and only the
 * objects in them are passed on. So a file rewritten whole, by a script or by
 * `kubectl get -o json > file`, with a few objects changed here and there, costs a read and a
 * memcmp of the file and the parse of those few objects, pretty-printed or on one line.
 * Anything else (YAML, a change outside the items, bytes that do not scan as items) is parsed
 * whole, exactly as parseManifest would.
 *
 * A read is compared with the last version *accepted* (ManifestRead.accept): a version the caller
 * refuses (an empty file caught mid-write, one that says nothing) leaves the index as it was, so
 * the next complete version is again compared with what the state holds. A read that throws
 * (ProxyError PARSE) changes nothing either.
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

/** One version read: what changed since the last accepted version, and what the file holds now. */
export interface ManifestRead {
  change: ManifestChange;
  /** What the whole file says (manifest.ts, Holds): the caller decides whether it stands for the state. */
  holds: Holds;
  /**
   * Every object of the file now, in file order (the whole manifest, not only what changed). The
   * index is edited in place on accept: iterate it wholly before this read's accept(), or call
   * objects() again after it; it is good until another read is accepted.
   */
  objects(): { services: Iterable<V1Service>; endpointSlices: Iterable<V1EndpointSlice> };
  /** Make this version the one the next read is compared with. */
  accept(): void;
}

/**
 * Built as literals (`{ start, end, manifest }`), never by spreading a Span: V8 gives spread-built
 * objects a shape that makes the offset shift after an edit many times slower.
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
  /** Items with problems: when there are none, a delta need not walk every item to list them. */
  problemItems: number;
}

interface Meta {
  metadata?: { namespace?: string; name?: string };
}

const SERVICE = 'Service ';
const SLICE = 'EndpointSlice ';
/** Old items looked at past one that changed, to find where the two versions line up again. */
const LOOKAHEAD = 8;

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
  /** The last accepted version. */
  private last: Buffer | undefined;
  private index: Index | undefined;
  /** Indexing of the last accepted version, under way (see indexFor). */
  private indexing: Generator<void, Index | undefined, void> | undefined;
  private lastHolds: Holds = 'nothing';
  /** Bumped by every accept and reset: a read accepted after another one was is stale. */
  private generation = 0;

  constructor(private readonly file: string) {}

  /** What the whole file says as of the last accepted read (manifest.ts, Holds). */
  get holds(): Holds {
    return this.lastHolds;
  }

  /** What changed since the last version read, accepting it; undefined when the bytes are the same. */
  read(buf: Buffer): ManifestChange | undefined {
    const r = this.diff(buf);
    r?.accept();
    return r?.change;
  }

  /**
   * What changed since the last accepted version; undefined when the bytes are the same. Throws
   * ProxyError PARSE when the text is neither JSON nor YAML.
   */
  diff(buf: Buffer): ManifestRead | undefined {
    const last = this.last;
    // One memcmp up to the first difference, which the delta starts from: no separate equals().
    const p = last ? commonPrefix(last, buf) : 0;
    if (last !== undefined && p === last.length && p === buf.length) return undefined;
    this.prepare();
    const delta = this.index && last ? this.deltaOf(last, this.index, buf, p) : undefined;
    if (delta) return delta;
    const docs = parseDocuments(buf.toString('utf8'), this.file);
    const manifest = manifestOf(docs, this.file);
    const holds = isBlank(buf) ? 'blank' : holdsOf(docs, manifest);
    const generation = this.generation;
    return {
      change: { kind: 'full', manifest },
      holds,
      objects: () => manifest,
      accept: () => {
        if (this.generation !== generation) return this.reset();
        this.commit(buf, holds);
        this.index = undefined;
        this.indexing = docs.length === 1 ? buildIndex(buf, docs[0], this.file) : undefined;
      },
    };
  }

  /**
   * Index the last accepted version for up to `ms` milliseconds of work; true once nothing is
   * left to index. A whole read leaves its index for later, because it usually comes at start-up,
   * when ports are waiting to listen, and the file source does it a slice at a time when idle; a
   * read that finds it unfinished finishes it first.
   */
  indexFor(ms: number): boolean {
    if (this.indexing === undefined) return true;
    const deadline = performance.now() + ms;
    for (;;) {
      const r = this.indexing.next();
      if (r.done) {
        this.index = r.value;
        this.indexing = undefined;
        return true;
      }
      if (performance.now() >= deadline) return false;
    }
  }

  /** Index the last accepted version now. */
  prepare(): void {
    this.indexFor(Infinity);
  }

  /** Forget the last version: the next read is parsed whole and reported as full. */
  reset(): void {
    this.last = undefined;
    this.index = undefined;
    this.indexing = undefined;
    this.generation++;
  }

  private commit(buf: Buffer, holds: Holds): void {
    this.last = buf;
    this.lastHolds = holds;
    this.generation++;
  }

  /**
   * The change from `prev` to `buf` (which share their first `p` bytes) when it lies inside the
   * items array, or undefined. Nothing is changed until the read is accepted.
   *
   * The window compared item by item runs over whole items of the old version: [a, b) with a the
   * start of the last item starting at or before the first changed byte, b the end of the first
   * item ending at or after the last one. Everything before a and from b on is the same in both
   * versions, so in the new one the window sits between the same `[`/`,` and `,`/`]` as before.
   */
  private deltaOf(prev: Buffer, index: Index, buf: Buffer, p: number): ManifestRead | undefined {
    const q = prev.length - commonSuffix(prev, buf, Math.min(prev.length, buf.length) - p);
    if (p <= index.open || q > index.close) return undefined;
    const { items } = index;
    const first = lastStartAtOrBefore(items, p);
    const last = firstEndAtOrAfter(items, q);
    const a = first >= 0 ? (items[first] as Item).start : index.open + 1;
    const b = last < items.length ? (items[last] as Item).end : index.close;
    const shift = buf.length - prev.length;
    if (b + shift < a) return undefined;
    const from = Math.max(first, 0);
    const to = Math.min(last, items.length - 1);
    const w = walk(prev, buf, items, from, to, a, b + shift, index.read);
    if (w === undefined) return undefined;
    // Every item gone from the window: valid only if the array is now empty.
    if (w.window.length === 0 && (byteBefore(buf, a) !== BYTE.LBRACKET || byteFrom(buf, b + shift) !== BYTE.RBRACKET)) return undefined;
    // Once accepted, the index's own list is the new one (replaceItems edits it in place).
    let accepted = false;
    const after = (): Iterable<Item> => (accepted ? items : concat(items, from, w.window, to + 1));
    const { change, holds, counts, problemItems } = changeOf(index, after, w.removed, w.fresh);
    const generation = this.generation;
    return {
      change,
      holds,
      objects: () => ({
        services: (function* () {
          for (const item of after()) yield* item.manifest.services;
        })(),
        endpointSlices: (function* () {
          for (const item of after()) yield* item.manifest.endpointSlices;
        })(),
      }),
      accept: () => {
        if (this.generation !== generation) return this.reset();
        for (let k = to + 1; k < items.length; k++) {
          const item = items[k] as Item;
          item.start += shift;
          item.end += shift;
        }
        replaceItems(items, from, to + 1 - from, w.window);
        accepted = true;
        index.close += shift;
        for (const [key, n] of counts) {
          if (n === 0) index.counts.delete(key);
          else index.counts.set(key, n);
        }
        index.services = change.kind === 'delta' ? change.services : index.services;
        index.endpointSlices = change.kind === 'delta' ? change.endpointSlices : index.endpointSlices;
        index.problemItems = problemItems;
        this.commit(buf, holds);
      },
    };
  }
}

interface Walk {
  /** The items of the new window, in order: unchanged ones at their new offsets, and fresh ones. */
  window: Item[];
  fresh: Item[];
  removed: Item[];
}

/**
 * Lines up the old items from..to with the new window [a, newEnd) of `buf`. From the next old
 * item on, a memcmp finds how far the two versions run alike: every old item inside that run is
 * unchanged and kept (with its parsed objects). Where they differ, an old item a little further
 * on that matches here means the ones before it were removed; otherwise the item here is new or
 * changed, and is scanned and parsed. Undefined when the new window is not `item (, item)*`, or
 * an item does not parse: the caller then parses the file whole.
 */
function walk(prev: Buffer, buf: Buffer, items: readonly Item[], from: number, to: number, a: number, newEnd: number, read: (item: Doc) => Manifest): Walk | undefined {
  const w: Walk = { window: [], fresh: [], removed: [] };
  let k = from;
  let j = skipSpace(buf, a, newEnd);
  while (j < newEnd) {
    if (k <= to) {
      const base = (items[k] as Item).start;
      const run = sameRun(prev, base, buf, j, Math.min(prev.length - base, newEnd - j));
      const m = lastEndWithin(items, k, to, base + run);
      if (m >= k) {
        const delta = j - base;
        for (let x = k; x <= m; x++) {
          const it = items[x] as Item;
          w.window.push({ start: it.start + delta, end: it.end + delta, manifest: it.manifest });
        }
        k = m + 1;
        j = nextItem(buf, (items[m] as Item).end + delta, newEnd);
        if (j < 0) return undefined;
        continue;
      }
      const found = matchAhead(prev, buf, items, k, to, j, newEnd);
      if (found >= 0) {
        for (; k < found; k++) w.removed.push(items[k] as Item);
        continue;
      }
    }
    const end = objectEnd(buf, j, newEnd);
    if (end < 0) return undefined;
    let doc: unknown;
    try {
      doc = JSON.parse(buf.toString('utf8', j, end));
    } catch {
      return undefined; // parsed whole, so that the error names the file's line and column
    }
    const item: Item = { start: j, end, manifest: read(doc as Doc) };
    w.window.push(item);
    w.fresh.push(item);
    j = nextItem(buf, end, newEnd);
    if (j < 0) return undefined;
  }
  for (; k <= to; k++) w.removed.push(items[k] as Item);
  return w;
}

/** Past an item: the start of the next one after `,` and space, `limit` when only space is left, -1 for anything else. */
function nextItem(buf: Buffer, i: number, limit: number): number {
  i = skipSpace(buf, i, limit);
  if (i === limit) return limit;
  if (buf[i] !== BYTE.COMMA) return -1;
  i = skipSpace(buf, i + 1, limit);
  return i === limit ? -1 : i; // a trailing comma
}

/** The first old item in (k, k + LOOKAHEAD] (and at most `to`) whose bytes are those at buf[j], or -1. */
function matchAhead(prev: Buffer, buf: Buffer, items: readonly Item[], k: number, to: number, j: number, limit: number): number {
  for (let x = k + 1; x <= Math.min(to, k + LOOKAHEAD); x++) {
    const it = items[x] as Item;
    const len = it.end - it.start;
    if (j + len <= limit && prev.compare(buf, j, j + len, it.start, it.end) === 0) return x;
  }
  return -1;
}

/** The most items spliced in as arguments: past it, the list is built anew (a call's arguments live on the stack). */
const MAX_SPLICED = 1024;

/**
 * items[from, from + count) replaced by `window`, in place: a new list per accepted read is a
 * large array (V8's large-object space, soon promoted), and a file rewritten often then brings on
 * the mark-compacts that slow the reads around them (docs/scale.md, "What is left", file churn).
 */
function replaceItems(items: Item[], from: number, count: number, window: readonly Item[]): void {
  if (window.length === count) {
    // The common edit (objects changed where they stood): nothing moves, nothing is allocated.
    for (let k = 0; k < count; k++) items[from + k] = window[k] as Item;
    return;
  }
  if (window.length <= MAX_SPLICED) {
    items.splice(from, count, ...window);
    return;
  }
  const rest = items.slice(from + count);
  items.length = from;
  for (const item of window) items.push(item);
  for (const item of rest) items.push(item);
}

/** The new list of items, without building it: items before `from`, the window, items from `rest` on. */
function* concat(items: readonly Item[], from: number, window: readonly Item[], rest: number): Generator<Item> {
  for (let k = 0; k < from; k++) yield items[k] as Item;
  yield* window;
  for (let k = rest; k < items.length; k++) yield items[k] as Item;
}

/** The change that removing `removed` and adding `fresh` makes, and the counts per touched key it leaves. */
function changeOf(index: Index, after: () => Iterable<Item>, removed: readonly Item[], fresh: readonly Item[]): { change: ManifestChange; holds: Holds; counts: Map<string, number>; problemItems: number } {
  const counts = new Map<string, number>();
  const tally = (item: Item, by: number): void => {
    for (const key of keysOf(item.manifest)) counts.set(key, (counts.get(key) ?? index.counts.get(key) ?? 0) + by);
  };
  for (const item of removed) tally(item, -1);
  const inFresh = new Map<string, V1Service | V1EndpointSlice>();
  for (const item of fresh) {
    for (const s of item.manifest.services) inFresh.set(keyOf(SERVICE, s), s);
    for (const s of item.manifest.endpointSlices) inFresh.set(keyOf(SLICE, s), s);
    tally(item, +1);
  }
  let services = index.services;
  let endpointSlices = index.endpointSlices;
  const change = {
    kind: 'delta' as const,
    upsertServices: [] as V1Service[],
    deleteServices: [] as ObjectKey[],
    upsertEndpointSlices: [] as V1EndpointSlice[],
    deleteEndpointSlices: [] as ObjectKey[],
    problems: [] as ObjectProblem[],
    services: 0,
    endpointSlices: 0,
  };
  const withProblems = (items: readonly Item[]): number => items.filter((item) => item.manifest.problems.length > 0).length;
  const problemItems = index.problemItems - withProblems(removed) + withProblems(fresh);
  const itemCount = index.items.length - removed.length + fresh.length;
  if (problemItems > 0) for (const item of after()) for (const p of item.manifest.problems) change.problems.push(p);
  for (const [key, n] of counts) {
    const was = index.counts.get(key) ?? 0;
    const { prefix, key: objKey } = splitKey(key);
    const isService = prefix === SERVICE;
    const distinct = (was > 0 ? -1 : 0) + (n > 0 ? 1 : 0);
    if (isService) services += distinct;
    else endpointSlices += distinct;
    if (n === 0) {
      if (was > 0) (isService ? change.deleteServices : change.deleteEndpointSlices).push(objKey);
      continue;
    }
    // One holder, and it is new: that is the object. Otherwise (duplicates, or the one holder
    // lies outside the window) every holder in file order, as a full replace would upsert them.
    const holders = n === 1 && inFresh.has(key) ? [inFresh.get(key)] : holdersOf(after(), prefix, key);
    for (const obj of holders) {
      if (isService) change.upsertServices.push(obj as V1Service);
      else change.upsertEndpointSlices.push(obj as V1EndpointSlice);
    }
  }
  change.services = services;
  change.endpointSlices = endpointSlices;
  // A delta is an edit of a list's items: with none left it is an empty list.
  const holds: Holds = services + endpointSlices > 0 ? 'objects' : itemCount === 0 ? 'empty-list' : 'nothing';
  return { change, holds, counts, problemItems };
}

function holdersOf(items: Iterable<Item>, prefix: string, key: string): Array<V1Service | V1EndpointSlice> {
  const out: Array<V1Service | V1EndpointSlice> = [];
  for (const item of items) {
    const objs = prefix === SERVICE ? item.manifest.services : item.manifest.endpointSlices;
    for (const obj of objs) if (keyOf(prefix, obj) === key) out.push(obj);
  }
  return out;
}

/**
 * The index of a JSON list document, a step at a time (yielding after each item scanned and each
 * batch of items read), or undefined when the file is not one (it is then always parsed whole).
 */
function* buildIndex(buf: Buffer, doc: unknown, file: string): Generator<void, Index | undefined, void> {
  const list = listItems(doc, file);
  if (list === undefined) return undefined;
  const scan = scanListSteps(buf);
  let step = scan.next();
  while (!step.done) {
    yield;
    step = scan.next();
  }
  const layout = step.value;
  if (layout === undefined || layout.items.length !== list.items.length) return undefined;
  const index: Index = { open: layout.open, close: layout.close, items: [], read: list.read, counts: new Map(), services: 0, endpointSlices: 0, problemItems: 0 };
  for (let k = 0; k < layout.items.length; k++) {
    const span = layout.items[k] as Span;
    const manifest = list.read(list.items[k] as Doc);
    index.items.push({ start: span.start, end: span.end, manifest });
    if (manifest.problems.length > 0) index.problemItems++;
    for (const key of keysOf(manifest)) {
      const n = (index.counts.get(key) ?? 0) + 1;
      index.counts.set(key, n);
      if (n === 1) {
        if (key.startsWith(SERVICE)) index.services++;
        else index.endpointSlices++;
      }
    }
    if (k % 64 === 63) yield;
  }
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

/** Index of the last item in [k, to] whose end is <= offset, or k - 1 when even item k ends past it. */
function lastEndWithin(items: readonly Span[], k: number, to: number, offset: number): number {
  let lo = k;
  let hi = to + 1;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((items[mid] as Span).end <= offset) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}
