import { ipFamily } from './address.js';

/**
 * The handshake of the SOCKS/CONNECT front (`--socks-bind-address`): bytes in, a request or a
 * refusal out, and the replies' bytes. Pure: the adapter (io/front/front-server.ts) owns the
 * socket, the clock and the dial.
 *
 * One port speaks two protocols, told apart by the first byte: 0x05 opens a SOCKS5 greeting
 * (RFC 1928), an ASCII letter an HTTP request line (RFC 9110 9.3.6, CONNECT). SOCKS5 is served as
 * far as a Service needs: method 0x00 (no authentication) only, command CONNECT only, the three
 * address types. A SOCKS4 client (first byte 0x04) gets SOCKS4's "rejected" reply, so it fails at
 * once rather than waiting; anything else is closed without a word.
 *
 * Bounded in size: a SOCKS5 message is at most 262 bytes by construction; an HTTP request head
 * past `maxHeaderBytes` is refused (431). Bounded in time by the adapter.
 */

export type FrontProtocol = 'socks5' | 'http';

/** A destination as the client named it: a name (any text) or an IP address, and a port. */
export interface FrontRequest {
  protocol: FrontProtocol;
  host: string;
  port: number;
}

export type HandshakeStep =
  /** Not complete yet: write `reply` when there is one (the SOCKS5 method selection), read on. */
  | { kind: 'more'; reply?: Buffer }
  /**
   * Complete: write `reply` first when there is one, then resolve and dial. `rest` holds what the
   * client sent after its request in the same read: it belongs to the destination.
   */
  | { kind: 'request'; request: FrontRequest; rest: Buffer; reply?: Buffer }
  /** Write `reply` (perhaps empty), then close. `reason` is for the debug log. */
  | { kind: 'refuse'; reply: Buffer; reason: string };

/** RFC 1928 section 6, REP. */
export const SOCKS_REPLY = {
  succeeded: 0x00,
  generalFailure: 0x01,
  notAllowed: 0x02,
  hostUnreachable: 0x04,
  connectionRefused: 0x05,
  commandNotSupported: 0x07,
  addressTypeNotSupported: 0x08,
} as const;

const SOCKS5 = 0x05;
const SOCKS4 = 0x04;
const METHOD_NO_AUTH = 0x00;
const NO_ACCEPTABLE_METHOD = 0xff;
const CMD_CONNECT = 0x01;
const ATYP_IPV4 = 0x01;
const ATYP_DOMAIN = 0x03;
const ATYP_IPV6 = 0x04;

export const DEFAULT_MAX_HEADER_BYTES = 4096;

type Phase = 'start' | 'socks-greeting' | 'socks-request' | 'http' | 'done';

export class FrontHandshake {
  private phase: Phase = 'start';
  private buffered: Buffer = Buffer.alloc(0);
  private readonly maxHeaderBytes: number;

  constructor(opts: { maxHeaderBytes?: number } = {}) {
    this.maxHeaderBytes = opts.maxHeaderBytes ?? DEFAULT_MAX_HEADER_BYTES;
  }

  /** Feeds the next chunk the client sent. Not to be called once a request or a refusal was returned. */
  push(chunk: Buffer): HandshakeStep {
    if (this.phase === 'done') throw new Error('FrontHandshake: push after the handshake ended');
    this.buffered = this.buffered.length === 0 ? chunk : Buffer.concat([this.buffered, chunk]);
    const step = this.advance();
    if (step.kind !== 'more') this.phase = 'done';
    return step;
  }

  private advance(): HandshakeStep {
    let methodReply: Buffer | undefined;
    for (;;) {
      const b = this.buffered;
      if (b.length === 0) return more(methodReply);
      switch (this.phase) {
        case 'start': {
          const first = b[0]!;
          if (first === SOCKS5) this.phase = 'socks-greeting';
          else if (first === SOCKS4) return refuse(Buffer.from([0x00, 0x5b, 0, 0, 0, 0, 0, 0]), 'SOCKS4 is not served (SOCKS5 is)');
          else if (isLetter(first)) this.phase = 'http';
          else return refuse(Buffer.alloc(0), `neither SOCKS5 nor HTTP (first byte 0x${first.toString(16).padStart(2, '0')})`);
          continue;
        }
        case 'socks-greeting': {
          // VER NMETHODS METHODS...
          if (b.length < 2) return more(methodReply);
          const n = b[1]!;
          if (b.length < 2 + n) return more(methodReply);
          if (!b.subarray(2, 2 + n).includes(METHOD_NO_AUTH)) return refuse(Buffer.from([SOCKS5, NO_ACCEPTABLE_METHOD]), 'SOCKS5: the client offers no method without authentication');
          methodReply = Buffer.from([SOCKS5, METHOD_NO_AUTH]);
          this.buffered = b.subarray(2 + n);
          this.phase = 'socks-request';
          continue;
        }
        case 'socks-request':
          return this.socksRequest(b, methodReply);
        case 'http':
          return this.httpRequest(b);
        default:
          throw new Error(`FrontHandshake: phase ${this.phase}`);
      }
    }
  }

  /** VER CMD RSV ATYP DST.ADDR DST.PORT (RFC 1928 section 4). */
  private socksRequest(b: Buffer, methodReply: Buffer | undefined): HandshakeStep {
    const withMethod = (step: HandshakeStep): HandshakeStep => {
      if (methodReply === undefined) return step;
      return { ...step, reply: Buffer.concat([methodReply, step.reply ?? Buffer.alloc(0)]) };
    };
    if (b.length < 4) return more(methodReply);
    if (b[0] !== SOCKS5) return withMethod(refuse(socksReply(SOCKS_REPLY.generalFailure), `SOCKS5: request version ${b[0]}`));
    // A command we do not serve (BIND, UDP ASSOCIATE) is answered before its address is read.
    if (b[1] !== CMD_CONNECT) return withMethod(refuse(socksReply(SOCKS_REPLY.commandNotSupported), `SOCKS5: command ${b[1]} is not served (CONNECT only)`));
    let host: string;
    let end: number;
    switch (b[3]) {
      case ATYP_IPV4:
        end = 4 + 4;
        if (b.length < end + 2) return more(methodReply);
        host = [...b.subarray(4, 8)].join('.');
        break;
      case ATYP_IPV6:
        end = 4 + 16;
        if (b.length < end + 2) return more(methodReply);
        host = ipv6Text(b.subarray(4, 20));
        break;
      case ATYP_DOMAIN: {
        if (b.length < 5) return more(methodReply);
        const len = b[4]!;
        end = 5 + len;
        if (b.length < end + 2) return more(methodReply);
        if (len === 0) return withMethod(refuse(socksReply(SOCKS_REPLY.hostUnreachable), 'SOCKS5: an empty domain name'));
        host = b.toString('latin1', 5, end);
        break;
      }
      default:
        return withMethod(refuse(socksReply(SOCKS_REPLY.addressTypeNotSupported), `SOCKS5: address type ${b[3]}`));
    }
    const port = b.readUInt16BE(end);
    // Copied out: the read buffer it came in is not kept.
    const rest = Buffer.from(b.subarray(end + 2));
    return withMethod({ kind: 'request', request: { protocol: 'socks5', host, port }, rest });
  }

  /** `CONNECT host:port HTTP/1.1`, header lines, an empty line (RFC 9112 section 3). */
  private httpRequest(b: Buffer): HandshakeStep {
    const headEnd = b.indexOf('\r\n\r\n');
    if (headEnd < 0) {
      if (b.length > this.maxHeaderBytes) return refuse(httpReply(431, 'the request head is too large'), `HTTP: request head over ${this.maxHeaderBytes} bytes`);
      return more();
    }
    if (headEnd + 4 > this.maxHeaderBytes) return refuse(httpReply(431, 'the request head is too large'), `HTTP: request head over ${this.maxHeaderBytes} bytes`);
    const line = b.toString('latin1', 0, b.indexOf('\r\n'));
    const m = /^([A-Za-z]+) (\S+) HTTP\/1\.[01]$/.exec(line);
    if (!m) return refuse(httpReply(400, 'not an HTTP/1.1 request line'), 'HTTP: malformed request line');
    const [, method, target] = m as unknown as [string, string, string];
    if (method !== 'CONNECT') return refuse(httpReply(405, `this is a CONNECT proxy to the cluster's Services: ${method} is not served`, ['Allow: CONNECT']), `HTTP: method ${method}`);
    const authority = parseAuthority(target);
    if (authority === undefined) return refuse(httpReply(400, `"${target}" is not host:port`), 'HTTP: CONNECT target is not host:port');
    const rest = Buffer.from(b.subarray(headEnd + 4));
    return { kind: 'request', request: { protocol: 'http', ...authority }, rest };
  }
}

function more(reply?: Buffer): HandshakeStep {
  return reply === undefined ? { kind: 'more' } : { kind: 'more', reply };
}

function refuse(reply: Buffer, reason: string): HandshakeStep {
  return { kind: 'refuse', reply, reason };
}

function isLetter(c: number): boolean {
  return (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a);
}

/** `host:port` or `[v6]:port` (RFC 9110 7.2 authority-form), port 1-65535. */
function parseAuthority(target: string): { host: string; port: number } | undefined {
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(target);
  if (!m) return undefined;
  const port = Number(m[3]);
  if (port < 1 || port > 65535) return undefined;
  return { host: (m[1] ?? m[2])!, port };
}

/** RFC 5952 text for 16 bytes (the WHATWG URL parser prints IPv6 that way: lower case, longest zero run as `::`). */
function ipv6Text(bytes: Buffer): string {
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(bytes.readUInt16BE(i).toString(16));
  return new URL(`http://[${groups.join(':')}]/`).hostname.slice(1, -1);
}

/** 16 bytes for IPv6 text that ipFamily accepted (an embedded dotted quad included). */
function ipv6Bytes(text: string): Buffer {
  const canonical = new URL(`http://[${text}]/`).hostname.slice(1, -1);
  const [head, tail] = canonical.split('::') as [string, string | undefined];
  const groups = (s: string | undefined): number[] => (s === undefined || s === '' ? [] : s.split(':').map((g) => parseInt(g, 16)));
  const h = groups(head);
  const t = groups(tail);
  const all = tail === undefined ? h : [...h, ...new Array<number>(8 - h.length - t.length).fill(0), ...t];
  const out = Buffer.alloc(16);
  all.forEach((g, i) => out.writeUInt16BE(g, i * 2));
  return out;
}

/** An IP address in the form the directory keys it by: IPv6 as RFC 5952 text, IPv4 as given. */
export function canonicalIP(text: string): string {
  return ipFamily(text) === 6 ? ipv6Text(ipv6Bytes(text)) : text;
}

/**
 * A SOCKS5 reply (RFC 1928 section 6): VER REP RSV ATYP BND.ADDR BND.PORT. `bound` is the address
 * the front connected from; a refusal carries 0.0.0.0:0.
 */
export function socksReply(code: number, bound?: { host: string; port: number }): Buffer {
  const family = bound === undefined ? 4 : ipFamily(bound.host);
  let addr: Buffer;
  if (bound !== undefined && family === 6) addr = Buffer.concat([Buffer.from([ATYP_IPV6]), ipv6Bytes(bound.host)]);
  else if (bound !== undefined && family === 4) addr = Buffer.from([ATYP_IPV4, ...bound.host.split('.').map(Number)]);
  else addr = Buffer.from([ATYP_IPV4, 0, 0, 0, 0]);
  const port = Buffer.alloc(2);
  port.writeUInt16BE(bound?.port ?? 0, 0);
  return Buffer.concat([Buffer.from([SOCKS5, code, 0x00]), addr, port]);
}

const REASONS: Record<number, string> = {
  200: 'Connection established',
  400: 'Bad Request',
  403: 'Forbidden',
  404: 'Not Found',
  405: 'Method Not Allowed',
  431: 'Request Header Fields Too Large',
  502: 'Bad Gateway',
};

/** An HTTP/1.1 response head; a refusal carries a one-line text body and closes the connection. */
export function httpReply(status: number, body?: string, headers: readonly string[] = []): Buffer {
  const head = [`HTTP/1.1 ${status} ${REASONS[status] ?? 'Error'}`, ...headers];
  if (status === 200) return Buffer.from(`${head.join('\r\n')}\r\n\r\n`, 'latin1');
  const text = `${body ?? REASONS[status] ?? 'Error'}\n`;
  head.push('Content-Type: text/plain; charset=utf-8', `Content-Length: ${Buffer.byteLength(text)}`, 'Connection: close');
  return Buffer.concat([Buffer.from(`${head.join('\r\n')}\r\n\r\n`, 'latin1'), Buffer.from(text)]);
}
