import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { NodeInfo } from './core/model.js';
import type { StateSink } from './core/state-cache.js';

/**
 * Watches what flows from a source into the proxier, for health and metrics (kube-proxy's
 * change trackers call QueuedUpdate and bump the change counters in the same place). Each
 * callback runs after the change reached the sink, so a sync it requested is already pending.
 */
export interface SinkObserver {
  /** Services added, updated or deleted; a full list counts each of its objects. */
  servicesChanged?(count: number): void;
  /** EndpointSlices upserted (given), or deleted (`deleted` of them). */
  endpointSlicesChanged?(upserted: readonly V1EndpointSlice[], deleted: number): void;
  nodeChanged?(node: NodeInfo): void;
}

/** A sink that forwards to `sink`, then tells every observer. */
export function observeSink(sink: StateSink, ...observers: SinkObserver[]): StateSink {
  const services = (n: number): void => {
    for (const o of observers) o.servicesChanged?.(n);
  };
  const slices = (upserted: readonly V1EndpointSlice[], deleted: number): void => {
    for (const o of observers) o.endpointSlicesChanged?.(upserted, deleted);
  };
  return {
    upsertService(obj: V1Service) {
      sink.upsertService(obj);
      services(1);
    },
    deleteService(namespace: string, name: string) {
      sink.deleteService(namespace, name);
      services(1);
    },
    replaceServices(objs: readonly V1Service[]) {
      sink.replaceServices(objs);
      services(objs.length);
    },
    upsertEndpointSlice(obj: V1EndpointSlice) {
      sink.upsertEndpointSlice(obj);
      slices([obj], 0);
    },
    deleteEndpointSlice(namespace: string, name: string) {
      sink.deleteEndpointSlice(namespace, name);
      slices([], 1);
    },
    replaceEndpointSlices(objs: readonly V1EndpointSlice[]) {
      sink.replaceEndpointSlices(objs);
      slices(objs, 0);
    },
    setNode(node: NodeInfo) {
      sink.setNode(node);
      for (const o of observers) o.nodeChanged?.(node);
    },
  };
}
