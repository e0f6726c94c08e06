import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { NodeInfo } from '../core/model.js';

/**
 * What a source (file or API watch) drives. The change feed (core/change-feed.ts) implements it and
 * hands each call on as one typed change to whoever subscribed: the proxier's cache first.
 */
export interface StateSink {
  upsertService(obj: V1Service): void;
  deleteService(namespace: string, name: string): void;
  upsertEndpointSlice(obj: V1EndpointSlice): void;
  deleteEndpointSlice(namespace: string, name: string): void;
  /** A full list: stored Services absent from it are removed. */
  replaceServices(objs: readonly V1Service[]): void;
  /** A full list: stored EndpointSlices absent from it are removed. */
  replaceEndpointSlices(objs: readonly V1EndpointSlice[]): void;
  setNode(node: NodeInfo): void;
}

