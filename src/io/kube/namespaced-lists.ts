import type { KubernetesObject } from '@kubernetes/client-node';
import type { ReflectorHandlers } from './reflector.js';

/**
 * One resource watched per namespace (a reflector each) into one sink that knows only whole
 * lists: a namespace's list replaces that namespace's objects and keeps the others', so the sink
 * is handed everything known at each list. The objects are the reflectors' own, referenced twice,
 * not copied.
 */
export class NamespacedLists<T extends KubernetesObject> {
  private readonly byNamespace = new Map<string, Map<string, T>>();

  constructor(private readonly sink: ReflectorHandlers<T>) {}

  handlers(namespace: string): ReflectorHandlers<T> {
    const mine = new Map<string, T>();
    this.byNamespace.set(namespace, mine);
    return {
      replace: (items) => {
        mine.clear();
        for (const o of items) mine.set(nameOf(o), o);
        this.sink.replace(this.all());
      },
      upsert: (obj) => {
        mine.set(nameOf(obj), obj);
        this.sink.upsert(obj);
      },
      remove: (obj) => {
        mine.delete(nameOf(obj));
        this.sink.remove(obj);
      },
    };
  }

  private all(): T[] {
    const out: T[] = [];
    for (const m of this.byNamespace.values()) for (const o of m.values()) out.push(o);
    return out;
  }
}

function nameOf(o: KubernetesObject): string {
  return o.metadata?.name ?? '';
}
