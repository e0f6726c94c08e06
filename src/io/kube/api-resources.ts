/**
 * The API resources the proxy reads, and the verbs it uses on them: the watch code builds its
 * requests from this list, and the deploy test checks that the ClusterRole grants exactly these.
 */
export interface ApiResource {
  /** API group; '' is the core group. */
  group: string;
  version: string;
  resource: string;
  verbs: readonly string[];
}

export const API_RESOURCES = {
  services: { group: '', version: 'v1', resource: 'services', verbs: ['list', 'watch'] },
  endpointSlices: { group: 'discovery.k8s.io', version: 'v1', resource: 'endpointslices', verbs: ['list', 'watch'] },
  nodes: { group: '', version: 'v1', resource: 'nodes', verbs: ['list', 'watch'] },
} as const satisfies Record<string, ApiResource>;

/**
 * What --emit-events writes (NeedPods Events, event-recorder.ts): granted only by the
 * deploy/emit-events/ overlay, so it is not among the resources every proxy reads.
 */
export const EVENT_RESOURCE = { group: '', version: 'v1', resource: 'events', verbs: ['create'] } as const satisfies ApiResource;

/** kube-proxy's label selector for Services and EndpointSlices it should program. */
export const PROXY_LABEL_SELECTOR = '!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless';

/**
 * What the port-forward dialer uses in each namespace whose pods it reaches: `get` for the
 * WebSocket tunnel (a GET), `create` for the SPDY upgrade (a POST). Not in the ClusterRole: the
 * DaemonSet dials pods directly. deploy/developer/port-forward-role.yaml grants it.
 */
export const PORT_FORWARD_RESOURCE = { group: '', version: 'v1', resource: 'pods/portforward', verbs: ['get', 'create'] } as const satisfies ApiResource;
