import { addressKey } from '../address.js';
import type { ProxyUnit } from '../units.js';

/**
 * The bind portal's bookkeeping, pure: which Service addresses must be local to this node, and
 * what to add to and remove from its interface to get there. Addresses are keyed by addressKey,
 * so `fd00::a` and `fd00:0::a` are one address.
 */

/** Address key -> the address as first written. */
export type AddressSet = ReadonlyMap<string, string>;

/** The addresses a unit listens on directly: ClusterIPs, externalIPs and load-balancer IPs. */
export function addressedIPs(unit: ProxyUnit): string[] {
  return unit.portals.filter((p) => p.kind !== 'nodePort' && p.ip !== '').map((p) => p.ip);
}

/** Every address these units listen on directly. */
export function wantedAddresses(units: Iterable<ProxyUnit>): Map<string, string> {
  const wanted = new Map<string, string>();
  for (const unit of units) for (const ip of addressedIPs(unit)) wanted.set(addressKey(ip), ip);
  return wanted;
}

/** What to add to `present` and remove from it so that it holds exactly `wanted`. */
export function addressChanges(wanted: AddressSet, present: AddressSet): { add: string[]; remove: string[] } {
  return {
    add: [...wanted].filter(([k]) => !present.has(k)).map(([, ip]) => ip),
    remove: [...present].filter(([k]) => !wanted.has(k)).map(([, ip]) => ip),
  };
}

/** The addresses of these units that `present` lacks. */
export function missingAddresses(units: Iterable<ProxyUnit>, present: AddressSet): string[] {
  return addressChanges(wantedAddresses(units), present).add;
}
