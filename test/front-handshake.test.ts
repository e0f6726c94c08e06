import { describe, expect, it } from 'vitest';
import { FrontHandshake, canonicalIP, httpReply, socksReply, type HandshakeStep } from '../src/core/front-handshake.js';
import { connectedReply, frontTarget, refusalReply } from '../src/core/front-target.js';
import { ServiceDirectory, type DirectoryUnit } from '../src/core/service-directory.js';

/**
 * The SOCKS/CONNECT front's handshake on byte vectors (RFC 1928 for SOCKS5, RFC 9110 9.3.6 for
 * CONNECT), and what a request reaches. The same requests through real curl are in
 * socks-front.test.ts.
 */

const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');
const text = (s: string): Buffer => Buffer.from(s, 'latin1');

/** Feeds `chunks` one after the other; every reply written along the way, and the last step. */
function feed(...chunks: Buffer[]): { replies: Buffer; last: HandshakeStep } {
  const h = new FrontHandshake();
  const replies: Buffer[] = [];
  let last: HandshakeStep = { kind: 'more' };
  for (const c of chunks) {
    last = h.push(c);
    if (last.reply) replies.push(last.reply);
  }
  return { replies: Buffer.concat(replies), last };
}

/** `05 01 00 03 <len> <name> <port>`: CONNECT to a domain name. */
function socksConnectName(name: string, port: number): Buffer {
  const p = Buffer.alloc(2);
  p.writeUInt16BE(port);
  return Buffer.concat([hex('05 01 00 03'), Buffer.from([name.length]), text(name), p]);
}

const GREETING = hex('05 01 00');
const NO_AUTH = hex('05 00');

describe('SOCKS5 handshake', () => {
  it('answers a no-authentication greeting, then reads a CONNECT to a domain name (curl --socks5-hostname)', () => {
    const h = new FrontHandshake();
    expect(h.push(GREETING)).toEqual({ kind: 'more', reply: NO_AUTH });
    expect(h.push(socksConnectName('web.default', 8080))).toEqual({ kind: 'request', request: { protocol: 'socks5', host: 'web.default', port: 8080 }, rest: Buffer.alloc(0) });
  });

  it('takes no-authentication among other methods', () => {
    expect(feed(hex('05 03 02 01 00')).last).toEqual({ kind: 'more', reply: NO_AUTH });
  });

  it('refuses with 0xFF when the client offers no acceptable method, or none at all', () => {
    expect(feed(hex('05 01 02')).last).toEqual({ kind: 'refuse', reply: hex('05 ff'), reason: expect.stringContaining('no method') });
    expect(feed(hex('05 00')).last).toMatchObject({ kind: 'refuse', reply: hex('05 ff') });
  });

  it('reads IPv4 and IPv6 destinations; IPv6 in RFC 5952 text', () => {
    expect(feed(GREETING, hex('05 01 00 01 0a 60 00 0a 00 50')).last).toMatchObject({ kind: 'request', request: { protocol: 'socks5', host: '10.96.0.10', port: 80 } });
    expect(feed(GREETING, hex('05 01 00 04 fd00 0000 0000 0000 0000 0000 0000 0010 01bb')).last).toMatchObject({ kind: 'request', request: { host: 'fd00::10', port: 443 } });
    expect(feed(GREETING, hex('05 01 00 04 2001 0db8 0000 0000 0001 0000 0000 0001 0016')).last).toMatchObject({ kind: 'request', request: { host: '2001:db8::1:0:0:1', port: 22 } });
  });

  it('hands on the bytes the client sent after its request in the same packet', () => {
    const { replies, last } = feed(Buffer.concat([GREETING, socksConnectName('web.default', 80), text('GET / HTTP/1.1\r\n')]));
    expect(replies).toEqual(NO_AUTH);
    expect(last).toMatchObject({ kind: 'request', request: { host: 'web.default', port: 80 }, rest: text('GET / HTTP/1.1\r\n') });
  });

  it('gives the same answer fed one byte at a time', () => {
    const all = Buffer.concat([GREETING, socksConnectName('api.shop.svc.cluster.local', 9090)]);
    const { replies, last } = feed(...[...all].map((b) => Buffer.from([b])));
    expect(replies).toEqual(NO_AUTH);
    expect(last).toEqual({ kind: 'request', request: { protocol: 'socks5', host: 'api.shop.svc.cluster.local', port: 9090 }, rest: Buffer.alloc(0) });
  });

  it('answers BIND and UDP ASSOCIATE with 0x07 command not supported', () => {
    expect(feed(GREETING, hex('05 02 00 01 7f 00 00 01 00 50')).last).toMatchObject({ kind: 'refuse', reply: hex('05 07 00 01 00000000 0000') });
    expect(feed(Buffer.concat([GREETING, hex('05 03 00 01 00 00 00 00 00 00')])).last).toMatchObject({ kind: 'refuse', reply: hex('05 00 05 07 00 01 00000000 0000') });
  });

  it('answers an unknown address type with 0x08, a wrong version with 0x01, an empty name with 0x04', () => {
    expect(feed(GREETING, hex('05 01 00 09 00')).last).toMatchObject({ kind: 'refuse', reply: hex('05 08 00 01 00000000 0000') });
    expect(feed(GREETING, hex('04 01 00 01')).last).toMatchObject({ kind: 'refuse', reply: hex('05 01 00 01 00000000 0000') });
    expect(feed(GREETING, hex('05 01 00 03 00 00 50')).last).toMatchObject({ kind: 'refuse', reply: hex('05 04 00 01 00000000 0000') });
  });

  it('rejects SOCKS4 with its own reply, and closes on anything that is neither protocol', () => {
    expect(feed(hex('04 01 00 50 7f 00 00 01 00')).last).toMatchObject({ kind: 'refuse', reply: hex('00 5b 0000 00000000') });
    // A TLS ClientHello: the client thought this was the Service.
    expect(feed(hex('16 03 01 00 a5')).last).toMatchObject({ kind: 'refuse', reply: Buffer.alloc(0) });
  });

  it('takes nothing once it has answered', () => {
    const h = new FrontHandshake();
    h.push(hex('05 01 02'));
    expect(() => h.push(GREETING)).toThrow(/after the handshake ended/);
  });
});

describe('HTTP CONNECT handshake', () => {
  it('reads CONNECT host:port as curl -p -x sends it, and hands on what follows the head', () => {
    const head = 'CONNECT web.default:8080 HTTP/1.1\r\nHost: web.default:8080\r\nUser-Agent: curl/7.88.1\r\nProxy-Connection: Keep-Alive\r\n\r\n';
    expect(feed(text(`${head}GET / HTTP/1.1\r\n`)).last).toEqual({ kind: 'request', request: { protocol: 'http', host: 'web.default', port: 8080 }, rest: text('GET / HTTP/1.1\r\n') });
    expect(feed(...[...text(head)].map((b) => Buffer.from([b]))).last).toMatchObject({ kind: 'request', request: { host: 'web.default', port: 8080 }, rest: Buffer.alloc(0) });
  });

  it('reads a bracketed IPv6 target, and HTTP/1.0', () => {
    expect(feed(text('CONNECT [fd00::10]:443 HTTP/1.0\r\n\r\n')).last).toMatchObject({ kind: 'request', request: { host: 'fd00::10', port: 443 } });
  });

  it('answers another method with 405 and Allow: CONNECT', () => {
    const { last } = feed(text('GET http://web.default:8080/ HTTP/1.1\r\nHost: web.default:8080\r\n\r\n'));
    expect(last.kind).toBe('refuse');
    const reply = last.reply!.toString('latin1');
    expect(reply).toBe("HTTP/1.1 405 Method Not Allowed\r\nAllow: CONNECT\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 69\r\nConnection: close\r\n\r\nthis is a CONNECT proxy to the cluster's Services: GET is not served\n");
  });

  it('answers a target that is not host:port, or a malformed request line, with 400', () => {
    for (const line of ['CONNECT web.default HTTP/1.1', 'CONNECT web.default:0 HTTP/1.1', 'CONNECT web.default:65536 HTTP/1.1', 'CONNECT [web]:80 HTTP/1.1', 'CONNECT web.default:80 HTTP/2', 'CONNECT  web.default:80 HTTP/1.1']) {
      expect(feed(text(`${line}\r\n\r\n`)).last.reply?.toString('latin1'), line).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    }
  });

  it('refuses a request head over the limit with 431, as soon as the limit is passed', () => {
    const h = new FrontHandshake({ maxHeaderBytes: 64 });
    expect(h.push(text('CONNECT web.default:80 HTTP/1.1\r\n'))).toEqual({ kind: 'more' });
    const step = h.push(text(`X-Padding: ${'a'.repeat(64)}`));
    expect(step.kind).toBe('refuse');
    expect(step.reply?.toString('latin1')).toMatch(/^HTTP\/1\.1 431 Request Header Fields Too Large\r\n/);
    // Complete but too long is refused the same way.
    expect(new FrontHandshake({ maxHeaderBytes: 64 }).push(text(`CONNECT web.default:80 HTTP/1.1\r\nX: ${'a'.repeat(40)}\r\n\r\n`)).reply?.toString('latin1')).toMatch(/^HTTP\/1\.1 431 /);
  });
});

describe('replies', () => {
  it('SOCKS5 success carries the bound address, IPv4 or IPv6', () => {
    expect(socksReply(0, { host: '127.0.0.1', port: 40000 })).toEqual(hex('05 00 00 01 7f000001 9c40'));
    expect(socksReply(0, { host: '::1', port: 80 })).toEqual(hex('05 00 00 04 00000000000000000000000000000001 0050'));
    expect(socksReply(0, { host: '::ffff:127.0.0.1', port: 80 })).toEqual(hex('05 00 00 04 00000000000000000000ffff7f000001 0050'));
  });

  it('HTTP success is 200 Connection established, with no body', () => {
    expect(httpReply(200).toString('latin1')).toBe('HTTP/1.1 200 Connection established\r\n\r\n');
  });
});

describe('what a request reaches', () => {
  function unit(service: string, portName: string, port: number, clusterIPs: string[], protocol = 'TCP'): DirectoryUnit {
    return { service, servicePort: `${service}:${portName}`, protocol, portals: clusterIPs.map((ip) => ({ kind: 'clusterIP' as const, ip, port })) };
  }
  const units = [unit('default/web', 'http', 80, ['10.96.0.10', 'fd00::10']), unit('kube-system/kube-dns', 'dns', 53, ['10.96.0.53'], 'UDP')];
  // The loopback portal's answer: 10.96.0.10 is served at 127.96.0.10.
  const directory = new ServiceDirectory({ domain: 'cluster.local', units: () => units, clientAddresses: (_s, ips) => ips.map((ip) => (ip.includes(':') ? ip : ip.replace(/^10\./, '127.'))) });
  const resolve = directory.resolve.bind(directory);
  const target = (protocol: 'socks5' | 'http', host: string, port: number) => frontTarget({ protocol, host, port }, resolve, 'cluster.local');

  it('resolves a Service by any of its names, in any case, or by ClusterIP, to where the proxy serves it', () => {
    for (const host of ['web.default', 'web.default.svc', 'web.default.svc.cluster.local', 'WEB.Default.svc.cluster.local.', '10.96.0.10']) {
      expect(target('socks5', host, 80), host).toEqual({ kind: 'dial', host: '127.96.0.10', port: 80 });
    }
    expect(target('http', 'FD00:0:0::10', 80)).toEqual({ kind: 'dial', host: 'fd00::10', port: 80 });
    expect(canonicalIP('FD00:0:0::10')).toBe('fd00::10');
  });

  it('refuses names outside the cluster domain as not allowed, and what no Service has as unreachable', () => {
    expect(target('socks5', 'www.example.org', 80)).toEqual({ kind: 'refuse', why: 'outside' });
    expect(target('socks5', 'localhost', 80)).toEqual({ kind: 'refuse', why: 'outside' });
    // Two labels have the shape of svc.ns.
    expect(target('socks5', 'example.org', 80)).toEqual({ kind: 'refuse', why: 'unknown' });
    expect(target('socks5', 'nope.default.svc.cluster.local', 80)).toEqual({ kind: 'refuse', why: 'unknown' });
    expect(target('socks5', 'web.default', 81)).toEqual({ kind: 'refuse', why: 'unknown' });
    expect(target('socks5', '10.96.0.10', 81)).toEqual({ kind: 'refuse', why: 'unknown' });
    expect(target('socks5', '192.0.2.1', 80)).toEqual({ kind: 'refuse', why: 'unknown' });
    // A UDP port is not reached through a TCP tunnel.
    expect(target('socks5', 'kube-dns.kube-system', 53)).toEqual({ kind: 'refuse', why: 'unknown' });
  });

  it('answers each refusal with its protocol\'s code', () => {
    const socks = { protocol: 'socks5' as const, host: 'x', port: 1 };
    expect(refusalReply(socks, 'outside', 'cluster.local')).toEqual(hex('05 02 00 01 00000000 0000'));
    expect(refusalReply(socks, 'unknown', 'cluster.local')).toEqual(hex('05 04 00 01 00000000 0000'));
    expect(refusalReply(socks, 'unavailable', 'cluster.local')).toEqual(hex('05 05 00 01 00000000 0000'));
    const http = { protocol: 'http' as const, host: 'x', port: 1 };
    expect(refusalReply(http, 'outside', 'cluster.local').toString()).toMatch(/^HTTP\/1\.1 403 Forbidden\r\n/);
    expect(refusalReply(http, 'unknown', 'cluster.local').toString()).toMatch(/^HTTP\/1\.1 404 Not Found\r\n/);
    expect(refusalReply(http, 'unavailable', 'cluster.local').toString()).toMatch(/^HTTP\/1\.1 502 Bad Gateway\r\n/);
    expect(connectedReply(socks, { host: '127.0.0.1', port: 1 })).toEqual(hex('05 00 00 01 7f000001 0001'));
    expect(connectedReply(http, { host: '127.0.0.1', port: 1 }).toString()).toBe('HTTP/1.1 200 Connection established\r\n\r\n');
  });
});
