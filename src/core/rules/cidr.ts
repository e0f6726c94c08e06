import { ipFamily, type IPFamily } from '../ip.js';

/**
 * CIDR membership, pure (core may not use node:net's BlockList). Addresses are compared as
 * 32- or 128-bit integers; an IPv4 address never belongs to an IPv6 CIDR or the other way round.
 */

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

/** Parses `a.b.c.d/n` or `v6/n`; undefined when malformed (config.ts validated user input already). */
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
