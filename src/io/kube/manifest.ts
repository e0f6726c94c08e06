import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
// client-node's own YAML parser. Its loadAllYaml is not used: it re-types objects through the
// ObjectSerializer (Dates, dropped unknown fields), and the cache should see what the API sends.
import { CORE_SCHEMA, loadAll, Type, YAMLException } from 'js-yaml';
import type { ObjectProblem } from '../../core/model.js';
import { MAX_DEPTH, objectLabel, show } from '../../core/validate.js';
import { ProxyError } from '../../core/errors.js';

/**
 * A state file: what `kubectl get svc,endpointslices -A -o yaml` prints (a `v1 List`), a typed
 * list (`ServiceList`, `EndpointSliceList`), multi-document YAML, or JSON of any of these.
 * Objects of other kinds are reported and ignored; the objects themselves are validated later,
 * by the state cache, like objects from the API.
 */

export interface Manifest {
  services: V1Service[];
  endpointSlices: V1EndpointSlice[];
  problems: ObjectProblem[];
}

const SERVICE_API = 'v1';
const ENDPOINT_SLICE_API = 'discovery.k8s.io/v1';
/** List kinds whose items carry no kind of their own, and the items' kind. */
const TYPED_LISTS: Record<string, { kind: string }> = {
  ServiceList: { kind: 'Service' },
  EndpointSliceList: { kind: 'EndpointSlice' },
};

export type Doc = Record<string, unknown>;

/** Throws ProxyError('PARSE') naming the file, line and column when the text is neither JSON nor YAML. */
export function parseManifest(text: string, file: string): Manifest {
  return manifestOf(parseDocuments(text, file), file);
}

export function emptyManifest(): Manifest {
  return { services: [], endpointSlices: [], problems: [] };
}

/** The objects of parsed documents (what parseDocuments returned). */
export function manifestOf(docs: readonly unknown[], file: string): Manifest {
  const out = emptyManifest();
  let notObjects = 0;
  docs.forEach((doc, i) => {
    // Empty documents (`---` twice, a trailing `---`) are fine.
    if (doc === null || doc === undefined) return;
    if (!isRecord(doc)) {
      if (notObjects++ === 0) out.problems.push({ object: `document ${i + 1}`, field: 'kind', message: 'not a Kubernetes object', file });
      return;
    }
    collect(doc, undefined, file, out);
  });
  if (notObjects > 1) out.problems.push({ object: 'documents', field: 'kind', message: `${notObjects - 1} more documents are not Kubernetes objects`, file });
  return out;
}

/**
 * What a file says: `objects` (at least one Service or EndpointSlice), `empty-list` (only lists
 * with `items: []`: the one way to say "no Services"), `blank` (nothing but white space: a file
 * caught between truncation and rewrite, most likely) or `nothing` (anything else: `null`, `---`
 * or comments alone, `{}`, `[]`, a scalar, objects of other kinds only).
 */
export type Holds = 'objects' | 'empty-list' | 'blank' | 'nothing';

/** What parsed documents hold (see Holds); `blank` is for the caller, who has the text, to tell. */
export function holdsOf(docs: readonly unknown[], m: Manifest): Holds {
  if (m.services.length > 0 || m.endpointSlices.length > 0) return 'objects';
  const present = docs.filter((d) => d !== null && d !== undefined);
  const emptyList = (d: unknown): boolean =>
    isRecord(d) && typeof d.kind === 'string' && (d.kind === 'List' || Object.hasOwn(TYPED_LISTS, d.kind)) && Array.isArray(d.items) && d.items.length === 0;
  return present.length > 0 && present.every(emptyList) ? 'empty-list' : 'nothing';
}

/**
 * Parser messages quote the file: js-yaml several lines around the fault, V8 the characters
 * around it, and pino logs an error's cause with it. A state file may be a symlink to a Secret's
 * or ConfigMap's content, so the error carries no cause and quotes at most the faulty line, cut
 * to MAX_LINE_QUOTE characters around the fault.
 */
const MAX_LINE_QUOTE = 200;

/**
 * YAML aliases may expand a document to at most this many units (see expandedSize) plus twice
 * the text's length. An alias-free document never comes near twice its text (every value and
 * key takes at least one character of it), so only aliases can exceed it: a 1 KB file of nested
 * aliases stands for 10^8 values, which every later walk (validation, comparison, logging) would
 * pay for on every read. js-yaml has no alias limit of its own; go-yaml, behind kubectl, refuses
 * "excessive aliasing" by a ratio too.
 */
const ALIAS_EXPANSION_FLOOR = 1 << 20;

/**
 * YAML as kubectl reads it (go-yaml): the core schema, with merge keys (`<<: *base`), which the
 * core schema alone would keep as a field named "<<" and so drop what they merge, silently.
 */
const SCHEMA = CORE_SCHEMA.extend({
  // js-yaml's own merge type (exported at run time as types.merge, absent from its typings): the
  // loader merges any key of this tag, bounded by its maxTotalMergeKeys.
  implicit: [new Type('tag:yaml.org,2002:merge', { kind: 'scalar', resolve: (data: unknown) => data === '<<' || data === null })],
});

/** JSON is YAML too, but JSON.parse is exact and much faster on large `-o json` dumps. */
export function parseDocuments(raw: string, file: string): unknown[] {
  // Windows editors may start the file with a byte-order mark, which JSON.parse refuses.
  const text = raw.replace(/^\uFEFF/, '');
  if (/^\s*[{[]/.test(text)) {
    try {
      return [JSON.parse(text)];
    } catch (err) {
      // As kubectl reads it (YAMLOrJSONDecoder): text that starts like JSON is JSON, one value or
      // several one after another; never flow-style YAML.
      const stream = jsonStream(text, (err as Error).message);
      if (Array.isArray(stream)) return stream;
      // The fault of the value that failed, placed in the whole text.
      const message = stream;
      const { line, column, known } = jsonErrorPosition(text, message);
      // V8 quotes the text around the fault ("..."): drop that; keep the log to one line.
      const reason = message.replace(V8_CONTEXT, '').replace(/\s+/g, ' ');
      const quote = known ? quoteLine(text, line, column) : '';
      throw new ProxyError('PARSE', `${file}:${line}:${column}: invalid JSON: ${clip(reason)}${quote}`);
    }
  }
  let docs: unknown[];
  try {
    docs = loadAll(text, null, { schema: SCHEMA, filename: file });
  } catch (err) {
    if (!(err instanceof YAMLException)) throw err;
    const line = err.mark.line + 1;
    const column = err.mark.column + 1;
    throw new ProxyError('PARSE', `${file}:${line}:${column}: invalid YAML: ${clip(err.reason)}${quoteLine(text, line, column)}`);
  }
  // Without a `*` there is no alias, and nothing to expand.
  if (text.includes('*')) checkExpansion(docs, text.length, file);
  return docs;
}

/**
 * JSON values one after another (`kubectl get -o json >> file`, twice): each a document, as a
 * YAML stream's are. `firstError` is JSON.parse's message for the whole text. Returns the values,
 * or the message of the first one that does not parse, its position counted from the text's start
 * (V8's line and column, counted from the value's, are dropped: the caller finds them again).
 */
function jsonStream(text: string, firstError: string): unknown[] | string {
  const docs: unknown[] = [];
  let consumed = 0;
  let error = firstError;
  for (;;) {
    const after = AFTER_JSON.exec(error);
    if (after === null) {
      if (consumed === 0) return error;
      return error.replace(/ \(line \d+ column \d+\)/, '').replace(/position (\d+)/, (_, at: string) => `position ${consumed + Number(at)}`);
    }
    const end = consumed + Number(after[1]);
    try {
      // V8 parsed the value before `end` whole: this cannot fail but costs a second parse of it.
      docs.push(JSON.parse(text.slice(consumed, end)));
    } catch {
      return firstError;
    }
    consumed = end;
    try {
      docs.push(JSON.parse(text.slice(consumed)));
      return docs;
    } catch (err) {
      error = (err as Error).message;
    }
  }
}

/** V8's words for text after a complete JSON value, with where it starts. */
const AFTER_JSON = /^Unexpected non-whitespace character after JSON at position (\d+)/;

function checkExpansion(docs: unknown[], textLength: number, file: string): void {
  const limit = ALIAS_EXPANSION_FLOOR + 2 * textLength;
  const size = expandedSize(docs, limit);
  if (size === 'cycle') throw new ProxyError('PARSE', `${file}: invalid YAML: an alias refers to a node that contains it`);
  if (size > limit) {
    throw new ProxyError('PARSE', `${file}: invalid YAML: aliases expand the file to more than ${limit} values and characters (twice its size, plus 1 Mi); refused as an alias bomb`);
  }
}

/**
 * The size of a value with every alias expanded: 1 per value, plus the length of each string and
 * key. js-yaml resolves an alias to the very object its anchor names, so this is memoized per
 * object and costs the distinct values, not the expansion. Stops once past `limit`; 'cycle' for
 * an alias inside its own anchor (`&a [*a]`), which js-yaml builds as a cyclic structure.
 * A loop with its own stack: alias chains nest deeper than the text does.
 */
function expandedSize(root: unknown, limit: number): number | 'cycle' {
  interface Frame {
    obj: object;
    entries: Array<[string, unknown]>;
    next: number;
    total: number;
  }
  const done = new Map<object, number>();
  const open = new Set<object>();
  const enter = (obj: object): Frame => {
    open.add(obj);
    return { obj, entries: Object.entries(obj), next: 0, total: 1 };
  };
  if (typeof root !== 'object' || root === null) return 1;
  const stack: Frame[] = [enter(root)];
  for (;;) {
    const f = stack[stack.length - 1] as Frame;
    if (f.next === f.entries.length) {
      stack.pop();
      open.delete(f.obj);
      done.set(f.obj, f.total);
      const parent = stack[stack.length - 1];
      if (parent === undefined) return f.total;
      parent.total += f.total;
      if (parent.total > limit) return parent.total;
      continue;
    }
    const [key, v] = f.entries[f.next++] as [string, unknown];
    if (!Array.isArray(f.obj)) f.total += key.length;
    if (typeof v !== 'object' || v === null) {
      f.total += 1 + (typeof v === 'string' ? v.length : 0);
    } else if (open.has(v)) {
      return 'cycle';
    } else {
      const known = done.get(v);
      if (known === undefined) {
        stack.push(enter(v));
        continue;
      }
      f.total += known;
    }
    if (f.total > limit) return f.total;
  }
}

/** `; the line reads "..."`: the faulty line, or 200 characters of it around the column; nothing when the fault is the end of the text. */
function quoteLine(text: string, line: number, column: number): string {
  let start = 0;
  for (let l = 1; l < line; l++) {
    const nl = text.indexOf('\n', start);
    if (nl < 0) return '';
    start = nl + 1;
  }
  if (start + column - 1 >= text.trimEnd().length) return '';
  let end = text.indexOf('\n', start);
  if (end < 0) end = text.length;
  const lineText = text.slice(start, end).replace(/\r$/, '');
  if (lineText.trim() === '') return '';
  const from = Math.max(0, Math.min(column - 1 - MAX_LINE_QUOTE / 2, lineText.length - MAX_LINE_QUOTE));
  const cut = lineText.slice(from, from + MAX_LINE_QUOTE);
  const quoted = `${from > 0 ? '…' : ''}${cut}${from + MAX_LINE_QUOTE < lineText.length ? '…' : ''}`;
  return `; the line reads ${JSON.stringify(quoted)}`;
}

function clip(s: string): string {
  return s.length > MAX_LINE_QUOTE ? `${s.slice(0, MAX_LINE_QUOTE)}…` : s;
}

/**
 * Takes one object (or list) into `out`. `implied` is the apiVersion/kind a typed list gives
 * items that do not state their own.
 */
type Implied = { apiVersion: string; kind: string };

function collect(doc: Doc, implied: Implied | undefined, file: string, out: Manifest, depth = 0): void {
  const kind = typeof doc.kind === 'string' ? doc.kind : implied?.kind;
  const apiVersion = typeof doc.apiVersion === 'string' ? doc.apiVersion : implied?.apiVersion;
  // The label only when there is a problem to name: every object of every whole read comes here.
  const problem = (field: string, message: string): void => {
    out.problems.push({ object: objectLabel(kind ?? 'object', doc), field, message, file });
  };

  if (kind === undefined) return problem('kind', 'missing');
  if (kind === 'List' || Object.hasOwn(TYPED_LISTS, kind)) {
    // Lists of lists are read, but not to any depth: this recursion must not meet the stack's end.
    if (depth >= MAX_DEPTH) return problem('items', `lists nested more than ${MAX_DEPTH} levels deep`);
    return collectList(doc, kind, file, out, problem, depth);
  }
  if (kind === 'Service') {
    if (apiVersion !== SERVICE_API) return problem('apiVersion', `${apiVersion === undefined ? 'missing' : show(apiVersion)}: Services are read as ${SERVICE_API} only`);
    out.services.push(doc);
    return;
  }
  if (kind === 'EndpointSlice') {
    if (apiVersion !== ENDPOINT_SLICE_API) {
      return problem('apiVersion', `${apiVersion === undefined ? 'missing' : show(apiVersion)}: EndpointSlices are read as ${ENDPOINT_SLICE_API} only`);
    }
    out.endpointSlices.push(doc as unknown as V1EndpointSlice);
    return;
  }
  problem('kind', `${show(kind)} ignored: only Service and EndpointSlice are read`);
}

function collectList(doc: Doc, kind: string, file: string, out: Manifest, problem: (f: string, m: string) => void, depth: number): void {
  const items = doc.items ?? [];
  if (!Array.isArray(items)) return problem('items', 'must be a list');
  const implied = impliedBy(doc, kind);
  let notObjects = 0;
  items.forEach((item: unknown, i) => {
    if (isRecord(item)) collect(item, implied, file, out, depth + 1);
    else if (notObjects++ === 0) problem(`items[${i}]`, 'not a Kubernetes object');
  });
  if (notObjects > 1) problem('items', `${notObjects - 1} more items are not Kubernetes objects`);
}

/** Items of a typed list have the list's group/version (a v1beta1 EndpointSliceList holds v1beta1 slices). */
function impliedBy(doc: Doc, kind: string): Implied | undefined {
  const itemKind = TYPED_LISTS[kind]?.kind;
  return itemKind && typeof doc.apiVersion === 'string' ? { kind: itemKind, apiVersion: doc.apiVersion } : undefined;
}

/**
 * For a document that is a list whose items are all objects: the items, and how to read one of
 * them alone (manifestOf the document equals the items' manifests joined in order). Undefined
 * for any other document.
 */
export function listItems(doc: unknown, file: string): { items: Doc[]; read: (item: Doc) => Manifest } | undefined {
  if (!isRecord(doc) || typeof doc.kind !== 'string') return undefined;
  const kind = doc.kind;
  if (kind !== 'List' && !Object.hasOwn(TYPED_LISTS, kind)) return undefined;
  const items: unknown = doc.items;
  if (!Array.isArray(items) || !items.every(isRecord)) return undefined;
  const implied = impliedBy(doc, kind);
  return {
    items,
    read: (item) => {
      const out = emptyManifest();
      // An item lies a level below its list, as collectList reads it: the same depth bound.
      collect(item, implied, file, out, 1);
      return out;
    },
  };
}

/**
 * V8's `Unexpected token` message: the text around the fault, from 10 characters before it to 10
 * after, with `...` where the text goes on (v8 src/json/json-parser.cc, ReportUnexpectedToken).
 */
const V8_CONTEXT = /, (\.\.\.)?"([\s\S]*)"(\.\.\.)? is not valid JSON$/;
const V8_CONTEXT_CHARS = 10;

/**
 * Where JSON.parse stopped, 1-based, and whether that is known (`known`) or a guess. Newer Node
 * versions say `(line L column C)`, or for an unexpected token quote the text around it (found
 * again in the text); Node 20 says `at position N` for some errors and nothing for others, in
 * which case js-yaml (JSON is YAML) is asked to find the spot; failing that, the end of the text.
 */
function jsonErrorPosition(text: string, message: string): { line: number; column: number; known: boolean } {
  const lc = /line (\d+) column (\d+)/.exec(message);
  if (lc) return { line: Number(lc[1]), column: Number(lc[2]), known: true };
  const pos = /position (\d+)/.exec(message);
  if (pos) return { ...lineAndColumn(text, Math.min(Number(pos[1]), text.length)), known: true };
  const ctx = V8_CONTEXT.exec(message);
  if (ctx) {
    const [, before, around = '', after] = ctx;
    const at = before ? text.indexOf(around) : 0;
    if (at >= 0 && (before || after)) {
      const offset = before ? at + V8_CONTEXT_CHARS : around.length - V8_CONTEXT_CHARS;
      return { ...lineAndColumn(text, offset), known: true };
    }
  }
  try {
    loadAll(text, null, { schema: CORE_SCHEMA, json: true });
  } catch (err) {
    if (err instanceof YAMLException) return { line: err.mark.line + 1, column: err.mark.column + 1, known: true };
  }
  return { ...lineAndColumn(text, text.trimEnd().length), known: false };
}

function lineAndColumn(text: string, offset: number): { line: number; column: number } {
  let line = 1;
  for (let i = text.indexOf('\n'); i >= 0 && i < offset; i = text.indexOf('\n', i + 1)) line++;
  return { line, column: offset - text.lastIndexOf('\n', offset - 1) };
}

function isRecord(v: unknown): v is Doc {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
