import type { KubernetesObject, V1EndpointSlice, V1Node, V1Service } from '@kubernetes/client-node';
import type { NodeInfo } from '../../core/model.js';
import type { StateSink } from '../../seams/state-sink.js';
import type { RandomSource } from '../../core/clock.js';
import type { Logger } from '../../seams/logger.js';
import type { KubeApi } from './api-client.js';
import { API_RESOURCES, PROXY_LABEL_SELECTOR, type ApiResource } from './api-resources.js';
import type { BackoffOptions } from '../../core/backoff.js';
import { NamespacedLists } from './namespaced-lists.js';
import { Reflector, type ReflectorHandlers, type ReflectorStats } from './reflector.js';
import type { Source } from '../../seams/source.js';

/**
 * Services, EndpointSlices and this node's Node from a cluster: one reflector (list + watch)
 * each, feeding the proxier's sink. The sink merges changes per key and the proxier applies them
 * with one rate-limited sync; an object that fails validation is reported there and skipped.
 *
 * Services and EndpointSlices are watched in all namespaces with kube-proxy's label selector, or,
 * with `namespaces` (for RBAC scoped to namespaces), in each of those on its own: one reflector per
 * namespace and resource, a re-list of one namespace replacing that namespace's objects only.
 * The Node is watched by name: its zone label drives topology hints (sink.setNode, only when name
 * or zone change, since a Node is updated often), and the raw object goes to `onNode` for the
 * health server (deletionTimestamp, the ToBeDeletedByClusterAutoscaler taint).
 */

export const ZONE_LABEL = 'topology.kubernetes.io/zone';

export interface ApiSourceOptions {
  api: KubeApi;
  /** This node's name (`--hostname-override`, else the hostname). */
  nodeName: string;
  /** `--namespace`: watch only these; absent or empty: all namespaces. */
  namespaces?: readonly string[];
  logger: Logger;
  /** This Node as the API shows it; `undefined` once it is deleted (after having been seen). */
  onNode?: (node: V1Node | undefined) => void;
  backoff?: Partial<BackoffOptions>;
  random?: RandomSource;
  /** Tests shorten these; production leaves them to the reflector's defaults. */
  watchTimeoutSeconds?: () => number;
  watchGraceMs?: number;
  pageSize?: number;
}

export class ApiSource implements Source {
  readonly synced: Promise<void>;
  private resolveSynced: () => void = () => {};
  private readonly log: Logger;
  private reflectors: Array<Reflector<KubernetesObject>> = [];
  /** The stats' name of each reflector, in order. */
  private reflectorNames: string[] = [];
  private sink: StateSink | undefined;
  private node: NodeInfo | undefined;
  private nodeSeen = false;
  private nodeMissingReported = false;

  constructor(private readonly opts: ApiSourceOptions) {
    this.log = opts.logger.child({ component: 'api-source' });
    this.synced = new Promise((resolve) => {
      this.resolveSynced = resolve;
    });
  }

  /** Starts the watches and returns at once; `synced` tells when the first lists are in. */
  async start(sink: StateSink): Promise<void> {
    if (this.sink) return;
    this.sink = sink;
    const serviceHandlers: ReflectorHandlers<V1Service> = {
      replace: (items) => sink.replaceServices(items),
      upsert: (obj) => sink.upsertService(obj),
      remove: (obj) => sink.deleteService(obj.metadata?.namespace ?? '', obj.metadata?.name ?? ''),
    };
    const sliceHandlers: ReflectorHandlers<V1EndpointSlice> = {
      replace: (items) => sink.replaceEndpointSlices(items),
      upsert: (obj) => sink.upsertEndpointSlice(obj),
      remove: (obj) => sink.deleteEndpointSlice(obj.metadata?.namespace ?? '', obj.metadata?.name ?? ''),
    };
    const namespaces = this.opts.namespaces ?? [];
    const listed: Array<Reflector<KubernetesObject>> = [];
    if (namespaces.length === 0) {
      listed.push(this.reflector(API_RESOURCES.services, PROXY_LABEL_SELECTOR, undefined, serviceHandlers));
      listed.push(this.reflector(API_RESOURCES.endpointSlices, PROXY_LABEL_SELECTOR, undefined, sliceHandlers));
      this.reflectorNames = ['services', 'endpointSlices'];
    } else {
      const services = new NamespacedLists(serviceHandlers);
      const slices = new NamespacedLists(sliceHandlers);
      for (const ns of namespaces) {
        listed.push(this.reflector(API_RESOURCES.services, PROXY_LABEL_SELECTOR, undefined, services.handlers(ns), ns));
        listed.push(this.reflector(API_RESOURCES.endpointSlices, PROXY_LABEL_SELECTOR, undefined, slices.handlers(ns), ns));
        this.reflectorNames.push(`services/${ns}`, `endpointSlices/${ns}`);
      }
    }
    const node = this.reflector<V1Node>(API_RESOURCES.nodes, undefined, `metadata.name=${this.opts.nodeName}`, {
      replace: (items) => this.nodeListed(items),
      upsert: (obj) => this.nodeChanged(obj),
      remove: () => this.nodeGone(),
    });
    this.reflectors = [...listed, node];
    this.reflectorNames.push('nodes');
    this.log.info({ server: this.opts.api.server, node: this.opts.nodeName, namespaces: namespaces.length > 0 ? namespaces : 'all' }, 'watching Services, EndpointSlices and this Node');
    for (const r of this.reflectors) r.start();
    void Promise.all(listed.map((r) => r.synced)).then(() => {
      this.log.info('first lists of Services and EndpointSlices are in');
      this.resolveSynced();
    });
  }

  async stop(): Promise<void> {
    await Promise.all(this.reflectors.map((r) => r.stop()));
  }

  /** Per resource: lists, watches, 410s and failures so far, and the resourceVersion a watch resumes from. */
  stats(): Record<string, ReflectorStats & { resourceVersion: string }> {
    return Object.fromEntries(this.reflectors.map((r, i) => [this.reflectorNames[i] ?? String(i), { ...r.stats, resourceVersion: r.resourceVersion }]));
  }

  private reflector<T extends KubernetesObject>(res: ApiResource, labelSelector: string | undefined, fieldSelector: string | undefined, handlers: ReflectorHandlers<T>, namespace?: string): Reflector<T> {
    const opts = this.opts;
    return new Reflector<T>({
      name: res.resource,
      api: opts.api,
      path: collectionPath(res, namespace),
      labelSelector,
      fieldSelector,
      handlers,
      logger: opts.logger,
      forbiddenHint: forbiddenHint(res, namespace),
      forbiddenIsEmpty: res.resource !== 'nodes',
      ...(namespace !== undefined ? { namespace } : {}),
      ...(opts.backoff ? { backoff: opts.backoff } : {}),
      ...(opts.random ? { random: opts.random } : {}),
      ...(opts.watchTimeoutSeconds ? { watchTimeoutSeconds: opts.watchTimeoutSeconds } : {}),
      ...(opts.watchGraceMs !== undefined ? { watchGraceMs: opts.watchGraceMs } : {}),
      ...(opts.pageSize ? { pageSize: opts.pageSize } : {}),
    });
  }

  private nodeListed(items: V1Node[]): void {
    const mine = items.find((n) => n.metadata?.name === this.opts.nodeName);
    if (mine) {
      this.nodeChanged(mine);
      return;
    }
    if (this.nodeSeen) {
      this.nodeGone();
    } else if (!this.nodeMissingReported) {
      this.nodeMissingReported = true;
      // A laptop is no Node: nothing is missing but topology hints, and the proxy serves on.
      this.log.warn({ node: this.opts.nodeName }, `no Node named ${this.opts.nodeName}: topology hints are off until one appears (from a laptop that is expected; on a node, is --hostname-override right?)`);
    }
  }

  private nodeChanged(obj: V1Node): void {
    if (obj.metadata?.name !== this.opts.nodeName) return;
    this.nodeSeen = true;
    const zone = obj.metadata.labels?.[ZONE_LABEL];
    const info: NodeInfo = zone ? { name: this.opts.nodeName, zone } : { name: this.opts.nodeName };
    if (this.node === undefined || this.node.zone !== info.zone) {
      this.node = info;
      this.log.info({ node: info.name, zone: info.zone ?? null }, 'this Node');
      this.sink?.setNode(info);
    }
    this.opts.onNode?.(obj);
  }

  private nodeGone(): void {
    if (!this.nodeSeen) return;
    this.nodeSeen = false;
    this.log.warn({ node: this.opts.nodeName }, `Node ${this.opts.nodeName} was deleted`);
    // Its zone is gone with it: topology hints no longer match anything here.
    if (this.node?.zone !== undefined) {
      this.node = { name: this.opts.nodeName };
      this.sink?.setNode(this.node);
    }
    this.opts.onNode?.(undefined);
  }
}

/** `/api/v1/services`, `/apis/discovery.k8s.io/v1/endpointslices` (all namespaces), or one namespace's. */
export function collectionPath(res: ApiResource, namespace?: string): string {
  const base = res.group === '' ? `/api/${res.version}` : `/apis/${res.group}/${res.version}`;
  return namespace === undefined ? `${base}/${res.resource}` : `${base}/namespaces/${encodeURIComponent(namespace)}/${res.resource}`;
}

/** What a 403 on a resource means here, and how to mend it. */
function forbiddenHint(res: ApiResource, namespace: string | undefined): string {
  if (res.resource === 'nodes') return 'topology hints are off until it is granted; serving goes on';
  const verbs = res.verbs.join(' and ');
  if (namespace !== undefined) return `grant ${verbs} on ${res.resource} there (a Role and RoleBinding: deploy/developer/port-forward-role.yaml)`;
  return `grant ${verbs} on ${res.resource} cluster-wide (a ClusterRole), or pass --namespace for each namespace you may read`;
}
