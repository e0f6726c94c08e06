import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { namespacedName, objectKey, sliceServiceKey, splitNamespacedName } from './object-key.js';
import { problemString, type NodeInfo, type ObjectProblem } from './model.js';
import { objectLabel, show, validateEndpointSlice, validateService } from './validate.js';

/**
 * The last good Service and EndpointSlice objects, and which Services changed since the proxier
 * last looked (kube-proxy's serviceChange / endpointsChange trackers, merged per key).
 *
 * Every object is validated on the way in. An invalid one is reported and not stored, and its
 * last good version stays in force: this is how bad input, from a file or the API, keeps the
 * last good state. An object that makes an upsert throw all the same is reported as a problem of
 * that object alone: the objects after it in a list are still applied.
 */

export interface StateCacheOptions {
  onProblem: (p: ObjectProblem) => void;
}

interface Meta {
  metadata?: { namespace?: string; name?: string; resourceVersion?: string };
}

/** Per kind: the stored objects, and per rejected object its version and the problems reported for it. */
class Store<T extends Meta> {
  readonly objects = new Map<string, T>();
  readonly reported = new Map<string, { version: string; problems: Set<string> }>();
}

/** Its methods are the StateSink's (seams/state-sink.ts), which the change feed calls. */
export class StateCache {
  private readonly onProblem: (p: ObjectProblem) => void;
  private readonly services = new Store<V1Service>();
  private readonly slices = new Store<V1EndpointSlice>();
  /** Service key -> keys of the slices labelled for it. */
  private readonly slicesByService = new Map<string, Set<string>>();
  private readonly dirty = new Set<string>();
  private currentNode: NodeInfo | undefined;

  constructor(opts: StateCacheOptions) {
    this.onProblem = opts.onProblem;
  }

  /** Each change returns how many stored objects it altered (0: nothing new). */
  upsertService(obj: V1Service): number {
    return this.guarded('Service', obj, keyOf(obj), this.storeService);
  }

  /** `key` is keyOf(obj), made once by the caller: every Map below hashes that one string. */
  private readonly storeService = (obj: V1Service, key: string): number => {
    const svc = withNamespace(obj);
    if (this.isStored(this.services, svc, key)) return 0;
    if (!this.admit(this.services, svc, key, validateService)) return 0;
    this.services.objects.set(key, svc);
    this.dirty.add(key);
    return 1;
  };

  deleteService(namespace: string, name: string): number {
    const key = namespacedName(namespace, name);
    this.services.reported.delete(key);
    if (!this.services.objects.delete(key)) return 0;
    this.dirty.add(key);
    return 1;
  }

  upsertEndpointSlice(obj: V1EndpointSlice): number {
    return this.guarded('EndpointSlice', obj, keyOf(obj), this.storeEndpointSlice);
  }

  /** As storeService. */
  private readonly storeEndpointSlice = (obj: V1EndpointSlice, key: string): number => {
    const slice = withNamespace(obj);
    if (this.isStored(this.slices, slice, key)) return 0;
    if (!this.admit(this.slices, slice, key, validateEndpointSlice)) return 0;
    const old = this.slices.objects.get(key);
    if (old !== undefined) this.unindex(key, old);
    this.slices.objects.set(key, slice);
    const svcKey = serviceKeyOf(slice);
    let set = this.slicesByService.get(svcKey);
    if (set === undefined) this.slicesByService.set(svcKey, (set = new Set()));
    set.add(key);
    this.dirty.add(svcKey);
    return 1;
  };

  deleteEndpointSlice(namespace: string, name: string): number {
    const key = namespacedName(namespace, name);
    this.slices.reported.delete(key);
    const old = this.slices.objects.get(key);
    if (old === undefined) return 0;
    this.slices.objects.delete(key);
    this.unindex(key, old);
    return 1;
  }

  replaceServices(objs: readonly V1Service[]): number {
    const keys = objs.map(keyOf);
    const listed = new Set(keys);
    let changed = 0;
    for (const key of [...this.services.objects.keys()]) {
      if (!listed.has(key)) changed += this.deleteService(...splitKey(key));
    }
    forgetUnlisted(this.services, listed);
    for (let i = 0; i < objs.length; i++) changed += this.guarded('Service', objs[i] as V1Service, keys[i] as string, this.storeService);
    return changed;
  }

  replaceEndpointSlices(objs: readonly V1EndpointSlice[]): number {
    const keys = objs.map(keyOf);
    const listed = new Set(keys);
    let changed = 0;
    for (const key of [...this.slices.objects.keys()]) {
      if (!listed.has(key)) changed += this.deleteEndpointSlice(...splitKey(key));
    }
    forgetUnlisted(this.slices, listed);
    for (let i = 0; i < objs.length; i++) changed += this.guarded('EndpointSlice', objs[i] as V1EndpointSlice, keys[i] as string, this.storeEndpointSlice);
    return changed;
  }

  /** Locality and topology depend on the node's name and zone: a change to either touches every Service. */
  setNode(node: NodeInfo): number {
    const old = this.currentNode;
    this.currentNode = { ...node };
    if (old !== undefined && old.name === node.name && old.zone === node.zone) return 0;
    this.markAllDirty();
    return 1;
  }

  /** Service keys whose Service or slices changed since the last call. */
  takeDirty(): Set<string> {
    const taken = new Set(this.dirty);
    this.dirty.clear();
    return taken;
  }

  /** Whether any Service waits for a sync. */
  hasDirty(): boolean {
    return this.dirty.size > 0;
  }

  /** Marks these Service keys dirty again (a sync that could not apply them hands them back). */
  markDirty(keys: Iterable<string>): void {
    for (const key of keys) this.dirty.add(key);
  }

  markAllDirty(): void {
    for (const key of this.services.objects.keys()) this.dirty.add(key);
    for (const key of this.slicesByService.keys()) this.dirty.add(key);
  }

  service(key: string): V1Service | undefined {
    return this.services.objects.get(key);
  }

  /** The slices labelled for a Service, sorted by name. */
  slicesFor(key: string): V1EndpointSlice[] {
    const set = this.slicesByService.get(key);
    if (set === undefined) return [];
    const keys = [...set];
    if (keys.length > 1) keys.sort();
    return keys.map((k) => this.slices.objects.get(k)).filter((s): s is V1EndpointSlice => s !== undefined);
  }

  serviceKeys(): string[] {
    return [...this.services.objects.keys()].sort();
  }

  node(): NodeInfo | undefined {
    return this.currentNode;
  }

  /**
   * Runs one object's upsert; if it throws, reports that object and carries on. Validation keeps
   * known bad shapes out before anything walks them, so this is the net for shapes nobody foresaw.
   */
  private guarded<T>(kind: string, obj: T, key: string, upsert: (obj: T, key: string) => number): number {
    try {
      return upsert(obj, key);
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      this.onProblem({ object: objectLabel(kind, obj), field: '', message: `not applied: ${show(message)}` });
      return 0;
    }
  }

  /**
   * Whether this very version is stored already. Asked before validating: a re-read file or a
   * relist hands over every object again, nearly all unchanged, and the stored version passed
   * validation when it came in. The comparison is safe before validation because it walks only
   * as deep as the stored (validated) object goes. A valid object clears any problem record, as
   * admit() does.
   */
  private isStored<T extends Meta>(store: Store<T>, obj: T, key: string): boolean {
    if (typeof obj !== 'object' || obj === null) return false;
    if (!isSameVersion(store.objects.get(key), obj)) return false;
    store.reported.delete(key);
    return true;
  }

  /**
   * Validates; reports each problem once per object version (a resync or a re-read file sends the
   * same bad object again and again). A valid object clears the record.
   */
  private admit<T extends Meta>(store: Store<T>, obj: T, key: string, validate: (o: T) => ObjectProblem[]): boolean {
    const problems = validate(obj);
    if (problems.length === 0) {
      store.reported.delete(key);
      return true;
    }
    const version = versionOf(obj, problems);
    let seen = store.reported.get(key);
    if (seen?.version !== version) store.reported.set(key, (seen = { version, problems: new Set() }));
    for (const p of problems) {
      const id = problemString(p);
      if (seen.problems.has(id)) continue;
      seen.problems.add(id);
      this.onProblem(p);
    }
    // Not stored: whatever version is stored (the last good one) stays in force.
    return false;
  }

  private unindex(sliceKey: string, slice: V1EndpointSlice): void {
    const svcKey = serviceKeyOf(slice);
    const set = this.slicesByService.get(svcKey);
    set?.delete(sliceKey);
    if (set?.size === 0) this.slicesByService.delete(svcKey);
    this.dirty.add(svcKey);
  }
}

/** Objects with no namespace live in `default`, as kubectl puts them. Copies; never mutates the caller's object. */
function withNamespace<T extends Meta>(obj: T): T {
  if (typeof obj !== 'object' || obj === null || obj.metadata?.namespace) return obj;
  return { ...obj, metadata: { ...obj.metadata, namespace: 'default' } };
}

const keyOf = objectKey;
const serviceKeyOf = sliceServiceKey;
const splitKey = splitNamespacedName;

/** Problem records of objects no longer listed are dropped, so a re-added bad object is reported again. */
function forgetUnlisted(store: Store<Meta>, listed: ReadonlySet<string>): void {
  for (const key of [...store.reported.keys()]) {
    if (!listed.has(key)) store.reported.delete(key);
  }
}

/**
 * The identity of one version: resourceVersion when the API set one, else the content; for
 * content JSON.stringify cannot write (nested past the stack), the problems found in it.
 */
function versionOf(obj: Meta, problems: readonly ObjectProblem[]): string {
  const rv = typeof obj === 'object' && obj !== null ? obj.metadata?.resourceVersion : undefined;
  if (typeof rv === 'string') return rv;
  try {
    return JSON.stringify(obj);
  } catch {
    return problems.map(problemString).join('\n');
  }
}

/**
 * Different resourceVersions mean a change (cheap test first). Equal ones are confirmed by
 * content: a hand-edited file keeps the resourceVersion it was copied with from kubectl, so an
 * equal resourceVersion alone would hide the edit. (The file reader passes on only objects whose
 * text changed, so for a file this comparison runs on the few objects an edit touched; a relist
 * or a whole re-read runs it on every object.)
 */
function isSameVersion(old: Meta | undefined, obj: Meta): boolean {
  if (old === undefined) return false;
  const a = old.metadata?.resourceVersion;
  const b = obj.metadata?.resourceVersion;
  if (a !== undefined && b !== undefined && a !== b) return false;
  return deepEqual(old, obj);
}

/**
 * Structural equality, a missing key equal to an undefined one. Recursion as deep as `a` nests:
 * callers pass a stored object as `a`, whose nesting validate.ts bounds (MAX_DEPTH). Loops
 * without allocation: a relist compares every object.
 */
export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (a instanceof Date || b instanceof Date) {
    return a instanceof Date && b instanceof Date && a.getTime() === b.getTime();
  }
  const arrayA = Array.isArray(a);
  if (arrayA !== Array.isArray(b)) return false;
  if (arrayA) {
    const x = a as unknown[];
    const y = b as unknown[];
    if (x.length !== y.length) return false;
    for (let i = 0; i < x.length; i++) if (!deepEqual(x[i], y[i])) return false;
    return true;
  }
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  let defined = 0;
  for (const k in x) {
    if (!Object.hasOwn(x, k) || x[k] === undefined) continue;
    defined++;
    if (!Object.hasOwn(y, k) || !deepEqual(x[k], y[k])) return false;
  }
  for (const k in y) if (Object.hasOwn(y, k) && y[k] !== undefined) defined--;
  return defined === 0;
}
