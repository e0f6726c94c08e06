import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { categorizeEndpoints, lacksLocalEndpoints } from './endpoints.js';
import type { NodeInfo } from './model.js';
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

export interface ServicePlan {
  units: ProxyUnit[];
  /** Set when the Service has a healthCheckNodePort. */
  health?: ServiceHealth;
  noLocal: NoLocalCounts;
  /** Why the whole Service is not proxied, when it is not. */
  skipped?: string;
  /** Things worth one log line each (an SCTP port, ...). */
  notices: string[];
}

const NOTHING: NoLocalCounts = Object.freeze({ internal: 0, external: 0 });

/** Plans one Service (`key` is `ns/name`); an absent Service plans nothing. */
export function planService(key: string, svc: V1Service | undefined, slices: readonly V1EndpointSlice[], node: NodeInfo): ServicePlan {
  if (svc === undefined) return { units: [], noLocal: NOTHING, notices: [] };
  const translated = translateService(svc, slices);
  if (translated.skipped !== undefined) return { units: [], noLocal: NOTHING, skipped: translated.skipped, notices: [] };
  const noLocal = { internal: 0, external: 0 };
  const units: ProxyUnit[] = [];
  let healthCheckNodePort = 0;
  let localIPs: Set<string> | undefined;
  for (const sp of translated.ports) {
    const sets = categorizeEndpoints(sp, node);
    const lacks = lacksLocalEndpoints(sp, sets);
    if (lacks.internal) noLocal.internal++;
    if (lacks.external) noLocal.external++;
    if (sp.healthCheckNodePort > 0) {
      healthCheckNodePort = sp.healthCheckNodePort;
      localIPs ??= new Set();
      for (const ep of sp.endpoints) if (ep.ready && node.name !== '' && ep.nodeName === node.name) localIPs.add(ep.ip);
    }
    for (const u of planUnits(sp, sets)) units.push(u);
  }
  const plan: ServicePlan = { units, noLocal, notices: translated.notices };
  if (healthCheckNodePort > 0) plan.health = { service: key, healthCheckNodePort, localEndpoints: localIPs?.size ?? 0 };
  return plan;
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
