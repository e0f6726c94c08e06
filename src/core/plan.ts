import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { hostPort } from './address.js';
import { categorizeEndpoints, lacksLocalEndpoints } from './endpoints.js';
import type { EndpointInfo, NodeInfo, Protocol, ServicePort } from './model.js';
import type { ReachPolicy } from './reach.js';
import { translateService } from './translate.js';
import { planUnits, type ProxyUnit } from './units.js';

/**
 * The plan: what one Service asks of this node, from its objects alone. Pure, so the sync loop
 * can run it wherever it lives (kube-proxy computes the same in syncProxyRules, per Service).
 */

/** What kube-proxy's healthCheckNodePort server answers for one Service. */
export interface ServiceHealth {
  /** `ns/name`. */
  service: string;
  healthCheckNodePort: number;
  /**
   * Distinct IPs of the Service's ready endpoints on this node, over all its ports, as kube-proxy
   * counts them (EndpointsMap.LocalReadyEndpoints): a pod serving two ports counts once.
   */
  localEndpoints: number;
}

/** Service ports whose Local internal or external traffic policy finds no endpoint on this node. */
export interface NoLocalCounts {
  internal: number;
  external: number;
}

/** A service port the dialer cannot carry (a UDP port through port-forward): listed, not served. */
export interface NotServedPort {
  servicePort: string;
  protocol: Protocol;
  reason: string;
}

export interface ServicePlan {
  units: ProxyUnit[];
  /** Ports left out because the dialer cannot carry them; absent when none. */
  notServed?: NotServedPort[];
  /** Set when the Service has a healthCheckNodePort. */
  health?: ServiceHealth;
  noLocal: NoLocalCounts;
  /** Why the whole Service is not proxied, when it is not. */
  skipped?: string;
  /** Things worth one log line each (an SCTP port, ...). */
  notices: string[];
}

const NOTHING: NoLocalCounts = Object.freeze({ internal: 0, external: 0 });

/**
 * Plans one Service (`key` is `ns/name`); an absent Service plans nothing. With a reach policy
 * (the dialer's: port-forward's), ports it cannot carry are listed as not served and endpoints it
 * cannot dial are left out of the balancers, each said once as a notice.
 */
export function planService(key: string, svc: V1Service | undefined, slices: readonly V1EndpointSlice[], node: NodeInfo, reach?: ReachPolicy): ServicePlan {
  if (svc === undefined) return { units: [], noLocal: NOTHING, notices: [] };
  const translated = translateService(svc, slices);
  if (translated.skipped !== undefined) return { units: [], noLocal: NOTHING, skipped: translated.skipped, notices: [] };
  const noLocal = { internal: 0, external: 0 };
  const units: ProxyUnit[] = [];
  const notices = [...translated.notices];
  const notServed: NotServedPort[] = [];
  let healthCheckNodePort = 0;
  let localIPs: Set<string> | undefined;
  for (const translatedPort of translated.ports) {
    const reached = reachable(translatedPort, reach, notices, notServed);
    if (reached === undefined) continue;
    const { sp, unreachable } = reached;
    const sets = categorizeEndpoints(sp, node);
    const lacks = lacksLocalEndpoints(sp, sets);
    if (lacks.internal) noLocal.internal++;
    if (lacks.external) noLocal.external++;
    if (sp.healthCheckNodePort > 0) {
      healthCheckNodePort = sp.healthCheckNodePort;
      localIPs ??= new Set();
      for (const ep of sp.endpoints) if (ep.ready && node.name !== '' && ep.nodeName === node.name) localIPs.add(ep.ip);
    }
    for (const u of planUnits(sp, sets)) units.push(unreachable.length > 0 ? { ...u, unreachable } : u);
  }
  const plan: ServicePlan = { units, noLocal, notices };
  if (notServed.length > 0) plan.notServed = notServed;
  if (healthCheckNodePort > 0) plan.health = { service: key, healthCheckNodePort, localEndpoints: localIPs?.size ?? 0 };
  return plan;
}

/**
 * The port as the dialer can serve it: undefined when it cannot at all (listed in `notServed`),
 * else with the endpoints it cannot dial taken out and listed with why. Each reason is a notice.
 */
function reachable(sp: ServicePort, reach: ReachPolicy | undefined, notices: string[], notServed: NotServedPort[]): { sp: ServicePort; unreachable: Array<{ endpoint: string; reason: string }> } | undefined {
  if (reach === undefined) return { sp, unreachable: [] };
  const why = reach.protocol(sp.protocol);
  if (why !== undefined) {
    notServed.push({ servicePort: sp.key, protocol: sp.protocol, reason: why });
    notices.push(`${sp.protocol} port "${sp.name.port}" is not served: ${why}`);
    return undefined;
  }
  const kept: EndpointInfo[] = [];
  const unreachable: Array<{ endpoint: string; reason: string }> = [];
  const byReason = new Map<string, string[]>();
  for (const ep of sp.endpoints) {
    const reason = reach.endpoint(ep);
    if (reason === undefined) {
      kept.push(ep);
      continue;
    }
    const addr = hostPort({ host: ep.ip, port: ep.port });
    unreachable.push({ endpoint: addr, reason });
    byReason.set(reason, [...(byReason.get(reason) ?? []), addr]);
  }
  for (const [reason, addrs] of byReason) notices.push(`port "${sp.name.port}": endpoint${addrs.length > 1 ? 's' : ''} ${addrs.join(', ')} left out: ${reason}`);
  return { sp: unreachable.length > 0 ? { ...sp, endpoints: kept } : sp, unreachable };
}

/**
 * The node-wide sums of the plans: Services with a health check node port, and the no-local
 * counts. Kept per Service and updated as each is planned, so a sync costs what changed, not what
 * exists (bench/README.md says what a recount after every sync cost at 10,000 Services).
 */
export class PlanTotals {
  private readonly health = new Map<string, ServiceHealth>();
  private readonly noLocal = new Map<string, NoLocalCounts>();
  private readonly totals: NoLocalCounts = { internal: 0, external: 0 };

  /** Records `plan` as the Service's current one (undefined: the Service is gone). */
  set(key: string, plan: ServicePlan | undefined): void {
    const old = this.noLocal.get(key);
    if (old) {
      this.totals.internal -= old.internal;
      this.totals.external -= old.external;
      this.noLocal.delete(key);
    }
    this.health.delete(key);
    if (plan === undefined) return;
    if (plan.noLocal.internal + plan.noLocal.external > 0) {
      this.totals.internal += plan.noLocal.internal;
      this.totals.external += plan.noLocal.external;
      this.noLocal.set(key, plan.noLocal);
    }
    if (plan.health) this.health.set(key, plan.health);
  }

  serviceHealth(): ServiceHealth[] {
    return [...this.health.values()];
  }

  noLocalEndpoints(): NoLocalCounts {
    return { ...this.totals };
  }
}
