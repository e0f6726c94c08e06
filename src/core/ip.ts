/**
 * IP address syntax, checked the way Kubernetes validation does (netutils.ParseIPSloppy's strict
 * sibling): dotted-decimal IPv4 without leading zeros, RFC 4291 IPv6 text with an optional
 * trailing dotted quad, and no zone (`%eth0`), which no Kubernetes address field accepts.
 * Pure, so core/ can use it where node:net's isIP is off limits.
 */

export type IPFamily = 4 | 6;

const OCTET = /^(?:0|[1-9]\d{0,2})$/;
const HEXTET = /^[0-9a-fA-F]{1,4}$/;

export function isIPv4(s: string): boolean {
  const parts = s.split('.');
  if (parts.length !== 4) return false;
  return parts.every((p) => OCTET.test(p) && Number(p) <= 255);
}

export function isIPv6(s: string): boolean {
  if (!s.includes(':')) return false;
  const halves = s.split('::');
  if (halves.length > 2) return false;
  const head = halves[0] === '' ? [] : (halves[0] ?? '').split(':');
  const tail = halves.length === 2 ? (halves[1] === '' ? [] : (halves[1] ?? '').split(':')) : [];
  const groups = [...head, ...tail];
  // A trailing dotted quad stands for two 16-bit groups (e.g. ::ffff:192.0.2.1); it must end the
  // text, so `1.2.3.4::` is not one.
  let width = groups.length;
  const last = groups[groups.length - 1];
  if (last !== undefined && last.includes('.') && !s.endsWith('::')) {
    if (!isIPv4(last)) return false;
    groups.pop();
    width += 1;
  }
  if (!groups.every((g) => HEXTET.test(g))) return false;
  // With `::`, at least one group is elided; without it, all eight must be written.
  return halves.length === 2 ? width <= 7 : width === 8;
}

/** 4 or 6 for a valid address, undefined otherwise. */
export function ipFamily(s: string): IPFamily | undefined {
  if (isIPv4(s)) return 4;
  if (isIPv6(s)) return 6;
  return undefined;
}

export function isIP(s: string): boolean {
  return ipFamily(s) !== undefined;
}
