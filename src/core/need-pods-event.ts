/**
 * The Event that makes demand for a Service without endpoints visible, so that something can
 * scale its workload up: reason `NeedPods` on the Service, as OpenShift's idler emits and its
 * unidling controller watches for (openshift/origin pkg/proxy/hybrid and pkg/unidling). Pure: the
 * time comes in.
 */

export const NEED_PODS_REASON = 'NeedPods';
export const EVENT_COMPONENT = 'kube-userspace-proxy';

export interface NeedPodsInput {
  namespace: string;
  /** The Service's name. */
  name: string;
  /** The port's name ('' for a single unnamed port). */
  port: string;
  /** The Service's metadata.uid, when known: ties the Event to this Service and not a namesake. */
  uid?: string;
  /** This node's name (the Event's source host and reporting instance). */
  node: string;
  /** RFC 3339 time. */
  time: string;
}

export function needPodsEvent(e: NeedPodsInput): Record<string, unknown> {
  const involvedObject: Record<string, string> = { apiVersion: 'v1', kind: 'Service', namespace: e.namespace, name: e.name };
  if (e.uid) involvedObject.uid = e.uid;
  return {
    apiVersion: 'v1',
    kind: 'Event',
    metadata: { generateName: `${e.name}.`, namespace: e.namespace },
    involvedObject,
    reason: NEED_PODS_REASON,
    // OpenShift's wording, which people grep for.
    message: `The service-port ${e.name}:${e.port} needs pods.`,
    type: 'Normal',
    source: { component: EVENT_COMPONENT, host: e.node },
    reportingComponent: EVENT_COMPONENT,
    reportingInstance: e.node,
    firstTimestamp: e.time,
    lastTimestamp: e.time,
    count: 1,
  };
}

/** `ns/name:port` (a service port key) -> its parts; undefined when it is not one. */
export function splitServicePortKey(key: string): { namespace: string; name: string; port: string } | undefined {
  const slash = key.indexOf('/');
  const colon = key.indexOf(':', slash + 1);
  if (slash <= 0 || colon < 0) return undefined;
  return { namespace: key.slice(0, slash), name: key.slice(slash + 1, colon), port: key.slice(colon + 1) };
}
