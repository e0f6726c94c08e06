import { ipFamily, type IPFamily } from '../address.js';
import type { ProxyUnit } from '../units.js';

/** Which IP families a service port is served in, by `servicePort` key. */
export type FamilyHints = ReadonlyMap<string, readonly IPFamily[]>;

/** The families of a unit's addressed portals (ClusterIPs, externalIPs, load-balancer IPs). */
export function portalFamilies(unit: ProxyUnit): IPFamily[] {
  const found = new Set<IPFamily>();
  for (const p of unit.portals) {
    const f = p.ip ? ipFamily(p.ip) : undefined;
    if (f) found.add(f);
  }
  return [...found].sort();
}

/**
 * The families a unit is served in. A node port carries no address of its own: its families are
 * the Service's. The external half of a split service port may hold nothing but a node port; it
 * then takes the families of its sibling half (same `servicePort`) from `hints`, and IPv4 when
 * no sibling is known.
 */
export function unitFamilies(unit: ProxyUnit, hints: FamilyHints): IPFamily[] {
  const own = portalFamilies(unit);
  if (own.length > 0) return own;
  const sibling = hints.get(unit.servicePort);
  return sibling && sibling.length > 0 ? [...sibling] : [4];
}

/** Family hints from a set of units: the union of each service port's addressed families. */
export function familyHints(units: Iterable<ProxyUnit>): Map<string, IPFamily[]> {
  const hints = new Map<string, IPFamily[]>();
  for (const u of units) {
    const own = portalFamilies(u);
    if (own.length === 0) continue;
    const merged = new Set([...(hints.get(u.servicePort) ?? []), ...own]);
    hints.set(u.servicePort, [...merged].sort());
  }
  return hints;
}

/**
 * What a portal knows of each service port's families: learnt from units as they are opened (a
 * node-port-only half may be opened before its sibling is synced), and replaced by what runs at
 * every sync. Both portals that program the node keep one.
 */
export class FamilyBook {
  private hints = new Map<string, IPFamily[]>();

  /** Adds what these units say, keeping what is known of others. */
  learn(units: readonly ProxyUnit[]): void {
    for (const [key, families] of familyHints(units)) this.hints.set(key, families);
  }

  /** Forgets everything but what these (the running) units say. */
  replace(units: Iterable<ProxyUnit>): void {
    this.hints = familyHints(units);
  }

  familiesOf(unit: ProxyUnit): IPFamily[] {
    return unitFamilies(unit, this.hints);
  }
}
