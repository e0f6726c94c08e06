import { ipFamily, type IPFamily } from '../address.js';
import { SweepRounds } from '../sweep-rounds.js';
import type { ProxyUnit } from '../units.js';

/** Which IP families a service port is served in, by `servicePort` key. */
export type FamilyHints = ReadonlyMap<string, readonly IPFamily[]>;

/**
 * Units are never changed once made (a changed Service is a new unit), and every sync asks each
 * unit's families several times over; at 10,000 Services, checking the address syntax each time
 * was a noticeable part of a sync.
 */
const knownFamilies = new WeakMap<ProxyUnit, readonly IPFamily[]>();

/** The families of a unit's addressed portals (ClusterIPs, externalIPs, load-balancer IPs) and those it carries for its node port. */
export function portalFamilies(unit: ProxyUnit): readonly IPFamily[] {
  const known = knownFamilies.get(unit);
  if (known) return known;
  const found = new Set<IPFamily>();
  for (const p of unit.portals) {
    const f = p.ip ? ipFamily(p.ip) : undefined;
    if (f) found.add(f);
  }
  // An external half with a node port serves it in the Service's families, as planned.
  for (const f of unit.families ?? []) found.add(f);
  const families = Object.freeze([...found].sort());
  knownFamilies.set(unit, families);
  return families;
}

const IPV4_ONLY: readonly IPFamily[] = Object.freeze([4]);

/**
 * The families a unit is served in. A node port carries no address of its own: its families are
 * the Service's. The external half of a split service port may hold nothing but a node port; it
 * then takes the families of its sibling half (same `servicePort`) from `hints`, and IPv4 when
 * no sibling is known.
 */
export function unitFamilies(unit: ProxyUnit, hints: FamilyHints): readonly IPFamily[] {
  const own = portalFamilies(unit);
  if (own.length > 0) return own;
  const sibling = hints.get(unit.servicePort);
  return sibling && sibling.length > 0 ? sibling : IPV4_ONLY;
}

/** Family hints from a set of units: the union of each service port's addressed families. */
export function familyHints(units: Iterable<ProxyUnit>): Map<string, readonly IPFamily[]> {
  const hints = new Map<string, readonly IPFamily[]>();
  for (const u of units) {
    const own = portalFamilies(u);
    if (own.length === 0) continue;
    const known = hints.get(u.servicePort);
    // Most service ports are one unit: merge only for the second half of a split one.
    hints.set(u.servicePort, known === undefined ? own : [...new Set([...known, ...own])].sort());
  }
  return hints;
}

/**
 * What a portal knows of each service port's families: learnt from units as they are opened (a
 * node-port-only half may be opened before its sibling is synced), and replaced by what runs at
 * every sync. Both portals that program the node keep one.
 *
 * `replace` gives what familyHints of the running units gives, but looks again only at the
 * service ports whose units changed: at 10,000 Services, a new map of every service port at
 * every sync was a good part of a sync that changed nothing.
 */
export class FamilyBook {
  private readonly hints = new Map<string, readonly IPFamily[]>();
  /** The units `replace` was last given, by id (unique among running units), and the call that last saw each. */
  private readonly running = new Map<string, { unit: ProxyUnit; seen: number }>();
  private readonly rounds = new SweepRounds();
  /** The same units by service port: one, or the two halves of a split one. */
  private readonly byServicePort = new Map<string, ProxyUnit[]>();
  /** Service ports `learn` wrote since the last `replace`: looked at again there. */
  private readonly learnt = new Set<string>();

  /** Adds what these units say, keeping what is known of others. */
  learn(units: readonly ProxyUnit[]): void {
    for (const [key, families] of familyHints(units)) {
      this.hints.set(key, families);
      this.learnt.add(key);
    }
  }

  /** Forgets everything but what these (the running) units say. */
  replace(units: Iterable<ProxyUnit>): void {
    this.rounds.begin();
    const changed = new Set(this.learnt);
    this.learnt.clear();
    for (const u of units) {
      const before = this.running.get(u.id);
      if (before?.unit === u) {
        this.rounds.mark(before);
        continue;
      }
      if (before !== undefined) {
        this.rounds.mark(before);
        this.unfile(before.unit);
        changed.add(before.unit.servicePort);
        before.unit = u;
      } else {
        this.running.set(u.id, { unit: u, seen: this.rounds.fresh() });
      }
      const siblings = this.byServicePort.get(u.servicePort);
      if (siblings) {
        siblings.push(u);
        changed.add(u.servicePort);
      } else {
        // The service port's only unit (most are; every one at a first sync): its own families.
        this.byServicePort.set(u.servicePort, [u]);
        const own = portalFamilies(u);
        if (own.length > 0) this.hints.set(u.servicePort, own);
        else this.hints.delete(u.servicePort);
      }
    }
    this.rounds.sweep(this.running, ({ unit }) => {
      this.unfile(unit);
      changed.add(unit.servicePort);
    });
    for (const key of changed) {
      const families = this.hintOf(key);
      if (families === undefined) this.hints.delete(key);
      else this.hints.set(key, families);
    }
  }

  /** What familyHints says of one service port's running units (without a map per service port: a first sync asks for every one). */
  private hintOf(key: string): readonly IPFamily[] | undefined {
    let hint: readonly IPFamily[] | undefined;
    for (const u of this.byServicePort.get(key) ?? []) {
      const own = portalFamilies(u);
      if (own.length === 0) continue;
      hint = hint === undefined ? own : [...new Set([...hint, ...own])].sort();
    }
    return hint;
  }

  private unfile(u: ProxyUnit): void {
    const siblings = (this.byServicePort.get(u.servicePort) ?? []).filter((s) => s !== u);
    if (siblings.length > 0) this.byServicePort.set(u.servicePort, siblings);
    else this.byServicePort.delete(u.servicePort);
  }

  familiesOf(unit: ProxyUnit): readonly IPFamily[] {
    return unitFamilies(unit, this.hints);
  }

  /** What is known of every service port, for a render of the units `replace` was given. */
  get known(): FamilyHints {
    return this.hints;
  }
}
