import { UsageError } from './errors.js';

/**
 * Addresses, in one place: IP syntax, CIDRs, `host:port` as flags take it and as logs and keys
 * print it. Pure, so the core, the portals and the config all read addresses the same way.
 *
 * IP syntax is checked the way Kubernetes validation does (netutils.ParseIPSloppy's strict
 * sibling): dotted-decimal IPv4 without leading zeros, RFC 4291 IPv6 text with an optional
 * trailing dotted quad, and no zone (`%eth0`), which no Kubernetes address field accepts. node:net's
 * isIP would take a zone, and ipaddr.js's parse reads `010.96.0.1` as octal: neither fits input
 * validation.
 */

// --- IP syntax -------------------------------------------------------------------------------

export type IPFamily = 4 | 6;

const HEXTET = /^[0-9a-fA-F]{1,4}$/;
const DOT = 0x2e;
const ZERO = 0x30;
const NINE = 0x39;

/**
 * Four decimal octets, each `0` or 1-3 digits without a leading zero, at most 255. A loop over
 * the characters rather than split() and a regex per octet: every endpoint address of every
 * slice passes here, 100,000 of them at 10,000 Services.
 */
export function isIPv4(s: string): boolean {
  let i = 0;
  for (let octet = 0; octet < 4; octet++) {
    if (octet > 0) {
      if (s.charCodeAt(i) !== DOT) return false;
      i++;
    }
    const start = i;
    let value = 0;
    for (let c = s.charCodeAt(i); c >= ZERO && c <= NINE; c = s.charCodeAt(++i)) {
      value = value * 10 + (c - ZERO);
      if (i - start === 3) return false;
    }
    if (i === start || value > 255 || (i - start > 1 && s.charCodeAt(start) === ZERO)) return false;
  }
  return i === s.length;
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

// --- host:port --------------------------------------------------------------------------------

export interface HostPort {
  host: string;
  port: number;
}

/**
 * Parses a kube-proxy style bind address: `host:port`, `[v6]:port`, or (with a default port) a
 * bare IP. An empty host means all addresses. Throws UsageError naming `what`.
 */
export function parseHostPort(text: string, what: string, defaultPort?: number): HostPort {
  const s = text.trim();
  let host: string;
  let portText: string | undefined;
  const bracket = /^\[([^\]]+)\](?::(\d*))?$/.exec(s);
  if (bracket) {
    host = bracket[1] as string;
    portText = bracket[2];
  } else if (isIP(s)) {
    host = s;
  } else {
    const i = s.lastIndexOf(':');
    if (i < 0) throw new UsageError(`${what}: "${text}" is not host:port`);
    host = s.slice(0, i);
    portText = s.slice(i + 1);
  }
  if (host !== '' && !isIP(host) && host !== 'localhost') {
    throw new UsageError(`${what}: "${host}" in "${text}" is not an IP address`);
  }
  if (portText === undefined || portText === '') {
    if (defaultPort === undefined) throw new UsageError(`${what}: "${text}" has no port (expected host:port)`);
    return { host, port: defaultPort };
  }
  const port = Number(portText);
  if (!/^\d+$/.test(portText) || port > 65535) throw new UsageError(`${what}: port "${portText}" in "${text}" is not a port number (0-65535)`);
  return { host, port };
}

/** `host:port`, or `[host]:port` for IPv6: how every address with a port is printed and keyed. */
export function hostPort(a: { host: string; port: number }): string {
  return a.host.includes(':') ? `[${a.host}]:${a.port}` : `${a.host}:${a.port}`;
}

// --- CIDRs ------------------------------------------------------------------------------------
// Membership is computed here rather than with node:net's BlockList: core/ is pure, and a Cidr is
// plain data that crosses to workers. Addresses are compared as 32- or 128-bit integers; an IPv4
// address never belongs to an IPv6 CIDR or the other way round.

/** The address as an integer of its family's width; undefined when `ip` is not an address. */
export function ipToBigInt(ip: string): { family: IPFamily; value: bigint } | undefined {
  const family = ipFamily(ip);
  if (family === 4) return { family, value: v4Value(ip) };
  if (family === 6) return { family, value: v6Value(ip) };
  return undefined;
}

function v4Value(ip: string): bigint {
  return ip.split('.').reduce((acc, octet) => (acc << 8n) | BigInt(Number(octet)), 0n);
}

/** Precondition: `ip` is valid IPv6 text (ip.ts said so). */
function v6Value(ip: string): bigint {
  let text = ip;
  const tail: number[] = [];
  const lastColon = text.lastIndexOf(':');
  const last = text.slice(lastColon + 1);
  if (last.includes('.')) {
    // An embedded dotted quad fills the last two groups.
    const v = Number(v4Value(last));
    tail.push(v >>> 16, v & 0xffff);
    text = `${text.slice(0, lastColon + 1)}0`; // placeholder group, dropped below
  }
  const [head = '', rest] = text.split('::');
  const headGroups = head === '' ? [] : head.split(':');
  const restGroups = rest === undefined || rest === '' ? [] : rest.split(':');
  if (tail.length > 0) (rest === undefined ? headGroups : restGroups).pop();
  const written = headGroups.length + restGroups.length + tail.length;
  const zeros = rest === undefined ? 0 : 8 - written;
  const groups = [...headGroups.map((g) => parseInt(g, 16)), ...new Array<number>(zeros).fill(0), ...restGroups.map((g) => parseInt(g, 16)), ...tail];
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(g), 0n);
}

export interface Cidr {
  family: IPFamily;
  base: bigint;
  prefix: number;
  text: string;
}

/** Parses `a.b.c.d/n` or `v6/n` (the address part checked as isIP does); undefined when malformed. */
export function parseCidr(text: string): Cidr | undefined {
  const [ip, bits, ...extra] = text.trim().split('/');
  if (ip === undefined || bits === undefined || extra.length > 0 || !/^\d+$/.test(bits)) return undefined;
  const addr = ipToBigInt(ip);
  if (!addr) return undefined;
  const width = addr.family === 4 ? 32 : 128;
  const prefix = Number(bits);
  if (prefix > width) return undefined;
  return { family: addr.family, base: addr.value & mask(prefix, width), prefix, text: text.trim() };
}

function mask(prefix: number, width: number): bigint {
  const all = (1n << BigInt(width)) - 1n;
  return prefix === 0 ? 0n : (all >> BigInt(width - prefix)) << BigInt(width - prefix);
}

/**
 * A CIDR as iptables-save writes it back: the network address (host bits cleared), IPv6 in RFC
 * 5952's form (lower case, the longest run of two or more zero groups as `::`), and the prefix.
 * Rules must be rendered so, or every sync would find them different from what the node holds.
 */
export function cidrText(cidr: Cidr): string {
  return `${bitsText(cidr.family, cidr.base)}/${cidr.prefix}`;
}

/**
 * An address as iptables-save (and conntrack) write it back: IPv4 as given (ipFamily takes
 * dotted decimal without leading zeros only), IPv6 as inet_ntop writes it (see bitsText).
 * Anything that is not an address is returned as it is.
 */
export function ipText(ip: string): string {
  if (!ip.includes(':')) return ip;
  const addr = ipToBigInt(ip);
  return addr === undefined || addr.family === 4 ? ip : bitsText(6, addr.value);
}

/**
 * IPv4 dotted; IPv6 in RFC 5952's form (lower case, the longest run of two or more zero groups as
 * `::`), except that, as inet_ntop, an IPv4-mapped (`::ffff:a.b.c.d`) or IPv4-compatible
 * (`::a.b.c.d`) address ends with a dotted quad.
 */
function bitsText(family: IPFamily, v: bigint): string {
  const quad = (x: bigint): string => `${Number((x >> 24n) & 255n)}.${Number((x >> 16n) & 255n)}.${Number((x >> 8n) & 255n)}.${Number(x & 255n)}`;
  if (family === 4) return quad(v);
  const groups = Array.from({ length: 8 }, (_, i) => Number((v >> BigInt(112 - 16 * i)) & 0xffffn));
  let best = { at: -1, len: 1 };
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > best.len) best = { at: i, len: j - i };
    i = j === i ? i + 1 : j;
  }
  if (best.at === 0 && (best.len === 6 || (best.len === 5 && groups[5] === 0xffff))) return `::${best.len === 5 ? 'ffff:' : ''}${quad(v & 0xffffffffn)}`;
  const hex = groups.map((g) => g.toString(16));
  return best.at < 0 ? hex.join(':') : `${hex.slice(0, best.at).join(':')}::${hex.slice(best.at + best.len).join(':')}`;
}

/**
 * The ranges of one family, parsed (malformed ones dropped): a load balancer's source ranges
 * apply to its addresses of their own family only, as kube-proxy keeps them apart.
 */
export function cidrsOfFamily(ranges: readonly string[], family: IPFamily | undefined): Cidr[] {
  const out: Cidr[] = [];
  for (const text of ranges) {
    const cidr = parseCidr(text);
    if (cidr !== undefined && cidr.family === family) out.push(cidr);
  }
  return out;
}

/**
 * Whether a client address is within any of `ranges` (CIDRs; malformed ones match nothing). An
 * IPv4 client seen on a dual-stack socket (`::ffff:a.b.c.d`) is matched as IPv4.
 */
export function sourceFilter(ranges: readonly string[]): (ip: string) => boolean {
  const cidrs = ranges.map(parseCidr).filter((c): c is Cidr => c !== undefined);
  return (ip) => {
    const plain = ip.startsWith('::ffff:') && isIPv4(ip.slice(7)) ? ip.slice(7) : ip;
    return cidrs.some((c) => cidrContains(c, plain));
  };
}

export function cidrContains(cidr: Cidr, ip: string): boolean {
  const addr = ipToBigInt(ip);
  if (!addr || addr.family !== cidr.family) return false;
  const width = cidr.family === 4 ? 32 : 128;
  return (addr.value & mask(cidr.prefix, width)) === cidr.base;
}

/** IPv6 link-local (fe80::/10): such addresses need a zone, so no portal uses them. */
export function isLinkLocalV6(ip: string): boolean {
  const addr = ipToBigInt(ip);
  return addr?.family === 6 && addr.value >> 118n === 0x3fan;
}

/** A key equal for every spelling of one address (`fd00::a` and `fd00:0:0::A`); the text itself when not an address. */
export function addressKey(ip: string): string {
  const addr = ipToBigInt(ip);
  return addr ? `${addr.family}:${addr.value.toString(16)}` : ip;
}

/** A CIDR given by the user (a flag or config field): throws UsageError naming `what`. */
export function parseCidrFlag(text: string, what: string): Cidr {
  const cidr = parseCidr(text);
  if (cidr === undefined) throw new UsageError(`${what}: "${text}" is not a CIDR (expected e.g. 10.96.0.0/12)`);
  return cidr;
}
