import { describe, expect, it } from 'vitest';
import { cidrText, isIPv4, isIPv6, parseCidr, parseCidrFlag, parseHostPort, sourceFilter } from '../src/core/address.js';
import { seeded } from './helpers/seeded.js';

describe('IP syntax', () => {
  it.each(['10.96.0.1', '127.0.0.1', '0.0.0.0', '255.255.255.255'])('%s is IPv4', (s) => expect(isIPv4(s)).toBe(true));
  it.each(['10.96.0', '256.1.1.1', '01.2.3.4', 'a.b.c.d', '1.2.3.4.5'])('%s is not IPv4', (s) => expect(isIPv4(s)).toBe(false));
  it('agrees with the regex it replaced on 20,000 random near-addresses', () => {
    const rand = seeded(11);
    const oracle = (t: string): boolean => {
      const parts = t.split('.');
      return parts.length === 4 && parts.every((p) => /^(?:0|[1-9]\d{0,2})$/.test(p) && Number(p) <= 255);
    };
    const alphabet = '0123456789....x ';
    for (let n = 0; n < 20_000; n++) {
      const len = Math.floor(rand() * 18);
      let t = '';
      for (let k = 0; k < len; k++) t += alphabet[Math.floor(rand() * alphabet.length)] as string;
      if (rand() < 0.3) t = [0, 1, 2, 3].map(() => String(Math.floor(rand() * 300))).join('.');
      expect(isIPv4(t), t).toBe(oracle(t));
    }
  });
  it.each(['::1', '::', 'fd00::10', '2001:db8::1:2:3:4', '1:2:3:4:5:6:7:8', '::ffff:10.0.0.1'])('%s is IPv6', (s) => expect(isIPv6(s)).toBe(true));
  it.each(['1::2::3', ':::', '1:2:3:4:5:6:7:8:9', 'fd00::g', '12345::1', '1.2.3.4'])('%s is not IPv6', (s) => expect(isIPv6(s)).toBe(false));
});

describe('host:port', () => {
  it('parses IPv4, IPv6 and empty hosts', () => {
    expect(parseHostPort('127.0.0.1:10249', 'x')).toEqual({ host: '127.0.0.1', port: 10249 });
    expect(parseHostPort('[::1]:10256', 'x')).toEqual({ host: '::1', port: 10256 });
    expect(parseHostPort(':8080', 'x')).toEqual({ host: '', port: 8080 });
    expect(parseHostPort('0.0.0.0', 'x', 10256)).toEqual({ host: '0.0.0.0', port: 10256 });
    expect(parseHostPort('::', 'x', 10256)).toEqual({ host: '::', port: 10256 });
  });

  it('names the flag in its errors', () => {
    expect(() => parseHostPort('127.0.0.1:99999', 'metrics-bind-address')).toThrow(/metrics-bind-address: port "99999"/);
    expect(() => parseHostPort('example.com:80', 'metrics-bind-address')).toThrow(/not an IP address/);
    expect(() => parseHostPort('127.0.0.1', 'metrics-bind-address')).toThrow(/has no port/);
  });
});

describe('CIDR', () => {
  it('parses both families and rejects junk', () => {
    expect(parseCidrFlag('10.96.0.0/12', 'x')).toMatchObject({ text: '10.96.0.0/12', prefix: 12, family: 4 });
    expect(parseCidrFlag('fd00::/108', 'x')).toMatchObject({ text: 'fd00::/108', prefix: 108, family: 6 });
    for (const bad of ['10.96.0.0', '10.96.0.0/33', 'fd00::/129', 'x/8', '10.0.0.0/8/1']) {
      expect(() => parseCidrFlag(bad, 'service-cluster-ip-range')).toThrow(/service-cluster-ip-range/);
    }
  });
  // What iptables-save and ip6tables-save wrote back for each, in a namespace (iptables 1.8.9):
  // host bits cleared, RFC 5952 for IPv6 (the first of two equal runs of zeros compressed).
  it.each([
    ['10.1.2.3/8', '10.0.0.0/8'],
    ['203.0.113.5/32', '203.0.113.5/32'],
    ['2001:0DB8::1/32', '2001:db8::/32'],
    ['fd00:0:0:1::/64', 'fd00:0:0:1::/64'],
    ['1:0:0:2:0:0:0:3/128', '1:0:0:2::3/128'],
    ['2001:db8:0:0:1:0:0:1/128', '2001:db8::1:0:0:1/128'],
    ['::1/128', '::1/128'],
    ['1::/16', '1::/16'],
    ['2001:db8:0:1:1:1:1:1/128', '2001:db8:0:1:1:1:1:1/128'],
  ])('writes %s as iptables-save does: %s', (text, saved) => {
    expect(cidrText(parseCidr(text)!)).toBe(saved);
  });

  it('filters clients by source ranges, IPv4 seen on a dual-stack socket included; a malformed range matches nothing', () => {
    const allowed = sourceFilter(['203.0.113.0/24', 'fd00:1::/64', 'not-a-cidr']);
    expect(['203.0.113.9', '::ffff:203.0.113.9', 'fd00:1::5'].map(allowed)).toEqual([true, true, true]);
    expect(['203.0.114.9', '::ffff:203.0.114.9', 'fd00:2::5', '', 'not-a-cidr'].map(allowed)).toEqual([false, false, false, false, false]);
  });
});
