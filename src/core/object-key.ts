import { SERVICE_NAME_LABEL } from './validate.js';

/**
 * The one spelling of a namespaced object's key, `namespace/name` (client-go's
 * cache.MetaNamespaceKeyFunc), used by the cache, the plan, the latency tracker and the file
 * reader. An object with no namespace lives in `default`, as kubectl puts it. Works on any value,
 * valid or not: parts that are not strings count as empty (a template string of an object would
 * call its toString, which a parsed `{"toString": 1}` turns into a throw).
 */

function text(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

export function namespacedName(namespace: unknown, name: unknown): string {
  return `${text(namespace) || 'default'}/${text(name)}`;
}

/** The key of an object by its metadata. */
export function objectKey(obj: unknown): string {
  const meta = typeof obj === 'object' && obj !== null ? (obj as { metadata?: { namespace?: unknown; name?: unknown } }).metadata : undefined;
  return namespacedName(meta?.namespace, meta?.name);
}

/** The key of the Service an EndpointSlice belongs to (its `kubernetes.io/service-name` label). */
export function sliceServiceKey(slice: { metadata?: { namespace?: unknown; labels?: Record<string, unknown> | null } }): string {
  return namespacedName(slice.metadata?.namespace, slice.metadata?.labels?.[SERVICE_NAME_LABEL]);
}

export function splitNamespacedName(key: string): [namespace: string, name: string] {
  const i = key.indexOf('/');
  return [key.slice(0, i), key.slice(i + 1)];
}
