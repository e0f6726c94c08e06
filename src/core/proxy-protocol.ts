import { ipToBigInt, isIPv4 } from './address.js';
import { ProxyError } from './errors.js';

/**
 * The PROXY protocol version 2 header (HAProxy's doc/proxy-protocol.txt, section 2.2): the binary
 * block a proxy sends first on a connection to tell the server who the client is and what the
 * client connected to. Pure: the addresses come in as text, as Node's sockets give them.
 *
 * Layout, all multi-byte fields in network byte order:
 *   12 bytes  signature  0D 0A 0D 0A 00 0D 0A 51 55 49 54 0A
 *    1 byte   0x21       version 2 (high nibble), command PROXY (low nibble)
 *    1 byte   0x11       AF_INET + STREAM (TCP over IPv4), or 0x21: AF_INET6 + STREAM
 *    2 bytes  length of what follows: 12 (IPv4) or 36 (IPv6)
 *   then the source address, the destination address, the source port, the destination port.
 *
 * No TLVs: the addresses are all a server needs to see the client, and each TLV is bytes and work
 * on every connection.
 */

export const PROXY_V2_SIGNATURE: readonly number[] = [0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a];
/** The same as a typed array: set() copies it as one block. */
const SIGNATURE_BYTES = Uint8Array.from(PROXY_V2_SIGNATURE);
const VERSION_2_PROXY = 0x21;
const TCP_OVER_IPV4 = 0x11;
const TCP_OVER_IPV6 = 0x21;
/** 16 + 12 and 16 + 36. */
export const PROXY_V2_IPV4_LENGTH = 28;
export const PROXY_V2_IPV6_LENGTH = 52;

/** One proxied TCP connection as the client made it. */
export interface ProxiedConnection {
  /** The client's address and port. */
  sourceAddress: string;
  sourcePort: number;
  /** What the client connected to (the Service's address as the client saw it). */
  destinationAddress: string;
  destinationPort: number;
}

/**
 * The header for one connection. IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`, as a dual-stack
 * socket reports IPv4 peers) count as IPv4, so two IPv4 ends give the short AF_INET form; when the
 * two ends are of different families, both go as IPv6, the IPv4 one mapped (the spec has one family
 * for both addresses). Throws ProxyError INTERNAL for text that is not an IP address or a port
 * outside 0-65535: the addresses come from the kernel, so that is a bug.
 */
export function proxyV2Header(c: ProxiedConnection): Uint8Array {
  const src = addressBytes(c.sourceAddress);
  const dst = addressBytes(c.destinationAddress);
  checkPort(c.sourcePort);
  checkPort(c.destinationPort);
  const v4 = src.length === 4 && dst.length === 4;
  const out = new Uint8Array(v4 ? PROXY_V2_IPV4_LENGTH : PROXY_V2_IPV6_LENGTH);
  out.set(SIGNATURE_BYTES);
  out[12] = VERSION_2_PROXY;
  out[13] = v4 ? TCP_OVER_IPV4 : TCP_OVER_IPV6;
  out[15] = v4 ? 12 : 36; // out[14], the length's high byte, stays 0
  const width = v4 ? 4 : 16;
  putAddress(out, 16, src, width);
  putAddress(out, 16 + width, dst, width);
  const ports = 16 + 2 * width;
  out[ports] = c.sourcePort >>> 8;
  out[ports + 1] = c.sourcePort & 0xff;
  out[ports + 2] = c.destinationPort >>> 8;
  out[ports + 3] = c.destinationPort & 0xff;
  return out;
}

/** `bytes` (4 or 16 long) at `at`, `width` wide: an IPv4 address in an IPv6 field is mapped (::ffff:a.b.c.d). */
function putAddress(out: Uint8Array, at: number, bytes: Uint8Array, width: number): void {
  if (bytes.length === width) {
    out.set(bytes, at);
    return;
  }
  out[at + 10] = 0xff;
  out[at + 11] = 0xff;
  out.set(bytes, at + 12);
}

/** 4 bytes for IPv4 (an IPv4-mapped IPv6 address included), 16 for IPv6. */
function addressBytes(text: string): Uint8Array {
  if (isIPv4(text)) return v4Bytes(text);
  // A scope (fe80::1%eth0) names an interface of this host: it has no place on the wire.
  const percent = text.indexOf('%');
  const ip = percent < 0 ? text : text.slice(0, percent);
  const parsed = ipToBigInt(ip);
  if (parsed?.family !== 6) throw new ProxyError('INTERNAL', `PROXY protocol header: ${JSON.stringify(text)} is not an IP address`);
  const out = new Uint8Array(16);
  let v = parsed.value;
  for (let i = 15; i >= 0; i--) {
    out[i] = Number(v & 0xffn);
    v >>= 8n;
  }
  return isV4Mapped(out) ? out.slice(12) : out;
}

/** Precondition: isIPv4(text). */
function v4Bytes(text: string): Uint8Array {
  const out = new Uint8Array(4);
  let octet = 0;
  let value = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x2e) {
      out[octet++] = value;
      value = 0;
    } else {
      value = value * 10 + (c - 0x30);
    }
  }
  out[octet] = value;
  return out;
}

function isV4Mapped(b: Uint8Array): boolean {
  for (let i = 0; i < 10; i++) if (b[i] !== 0) return false;
  return b[10] === 0xff && b[11] === 0xff;
}

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ProxyError('INTERNAL', `PROXY protocol header: port ${port} is not 0-65535`);
}
