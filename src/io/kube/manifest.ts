import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
// client-node's own YAML parser. Its loadAllYaml is not used: it re-types objects through the
// ObjectSerializer (Dates, dropped unknown fields), and the cache should see what the API sends.
import { CORE_SCHEMA, loadAll, YAMLException } from 'js-yaml';
import type { ObjectProblem } from '../../core/model.js';
import { objectLabel } from '../../core/validate.js';
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
  docs.forEach((doc, i) => {
    // Empty documents (`---` twice, a trailing `---`) are fine.
    if (doc === null || doc === undefined) return;
    if (!isRecord(doc)) {
      out.problems.push({ object: `document ${i + 1}`, field: 'kind', message: 'not a Kubernetes object', file });
      return;
    }
    collect(doc, undefined, file, out);
  });
  return out;
}

/** JSON is YAML too, but JSON.parse is exact and much faster on large `-o json` dumps. */
export function parseDocuments(raw: string, file: string): unknown[] {
  // Windows editors may start the file with a byte-order mark, which JSON.parse refuses.
  const text = raw.replace(/^\uFEFF/, '');
  if (/^\s*[{[]/.test(text)) {
    try {
      return [JSON.parse(text)];
    } catch (err) {
      const { line, column } = jsonErrorPosition(text, (err as Error).message);
      // Node 20 quotes the text around the error, newlines and all: keep the log to one line.
      const reason = (err as Error).message.replace(/\s+/g, ' ');
      throw new ProxyError('PARSE', `${file}:${line}:${column}: invalid JSON: ${reason}`, { cause: err });
    }
  }
  try {
    return loadAll(text, null, { schema: CORE_SCHEMA, filename: file });
  } catch (err) {
    if (!(err instanceof YAMLException)) throw err;
    const line = err.mark.line + 1;
    const column = err.mark.column + 1;
    throw new ProxyError('PARSE', `${file}:${line}:${column}: invalid YAML: ${err.reason}`, { cause: err });
  }
}

/**
 * Takes one object (or list) into `out`. `implied` is the apiVersion/kind a typed list gives
 * items that do not state their own.
 */
type Implied = { apiVersion: string; kind: string };

function collect(doc: Doc, implied: Implied | undefined, file: string, out: Manifest): void {
  const kind = typeof doc.kind === 'string' ? doc.kind : implied?.kind;
  const apiVersion = typeof doc.apiVersion === 'string' ? doc.apiVersion : implied?.apiVersion;
  const label = objectLabel(kind ?? 'object', doc);
  const problem = (field: string, message: string): void => {
    out.problems.push({ object: label, field, message, file });
  };

  if (kind === undefined) return problem('kind', 'missing');
  if (kind === 'List' || Object.hasOwn(TYPED_LISTS, kind)) return collectList(doc, kind, file, out, problem);
  if (kind === 'Service') {
    if (apiVersion !== SERVICE_API) return problem('apiVersion', `${show(apiVersion)}: Services are read as ${SERVICE_API} only`);
    out.services.push(doc);
    return;
  }
  if (kind === 'EndpointSlice') {
    if (apiVersion !== ENDPOINT_SLICE_API) {
      return problem('apiVersion', `${show(apiVersion)}: EndpointSlices are read as ${ENDPOINT_SLICE_API} only`);
    }
    out.endpointSlices.push(doc as unknown as V1EndpointSlice);
    return;
  }
  problem('kind', `${show(kind)} ignored: only Service and EndpointSlice are read`);
}

function collectList(doc: Doc, kind: string, file: string, out: Manifest, problem: (f: string, m: string) => void): void {
  const items = doc.items ?? [];
  if (!Array.isArray(items)) return problem('items', 'must be a list');
  const implied = impliedBy(doc, kind);
  items.forEach((item: unknown, i) => {
    if (isRecord(item)) collect(item, implied, file, out);
    else problem(`items[${i}]`, 'not a Kubernetes object');
  });
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
      collect(item, implied, file, out);
      return out;
    },
  };
}

/**
 * Where JSON.parse stopped, 1-based. Newer Node versions say `(line L column C)`; Node 20 says
 * `at position N` for some errors and nothing for others, in which case js-yaml (JSON is YAML)
 * is asked to find the spot; failing that, the end of the text.
 */
function jsonErrorPosition(text: string, message: string): { line: number; column: number } {
  const lc = /line (\d+) column (\d+)/.exec(message);
  if (lc) return { line: Number(lc[1]), column: Number(lc[2]) };
  const pos = /position (\d+)/.exec(message);
  if (!pos) {
    try {
      loadAll(text, null, { schema: CORE_SCHEMA, json: true });
    } catch (err) {
      if (err instanceof YAMLException) return { line: err.mark.line + 1, column: err.mark.column + 1 };
    }
  }
  const offset = pos ? Math.min(Number(pos[1]), text.length) : text.trimEnd().length;
  const before = text.slice(0, offset);
  return { line: before.split('\n').length, column: offset - before.lastIndexOf('\n') };
}

function isRecord(v: unknown): v is Doc {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function show(v: unknown): string {
  return v === undefined ? 'missing' : JSON.stringify(v);
}
