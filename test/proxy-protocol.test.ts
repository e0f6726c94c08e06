import { describe, expect, it } from 'vitest';
import { ProxyError } from '../src/core/errors.js';
import { portalDestinations } from '../src/core/portal-destination.js';
import { proxyV2Header } from '../src/core/proxy-protocol.js';

/**
 * Golden bytes for the PROXY protocol v2 header, written out by hand from HAProxy's
 * doc/proxy-protocol.txt (section 2.2): the 12-byte signature, 0x21 (version 2, PROXY), 0x11 or
 * 0x21 (TCP over IPv4 or IPv6), the address block's length, then source address, destination
 * address, source port, destination port, all in network byte order.
 */
const SIGNATURE = '0d0a0d0a000d0a515549540a';
const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');

describe('proxyV2Header', () => {
  it('TCP over IPv4: 28 bytes', () => {
    const h = proxyV2Header({ sourceAddress: '192.0.2.1', sourcePort: 56324, destinationAddress: '10.96.0.10', destinationPort: 80 });
    expect(hex(h)).toBe(`${SIGNATURE}21` + '11' + '000c' + 'c0000201' + '0a60000a' + 'dc04' + '0050');
    expect(h.length).toBe(28);
  });

  it('TCP over IPv6: 52 bytes', () => {
    const h = proxyV2Header({ sourceAddress: '2001:db8::7', sourcePort: 1, destinationAddress: 'fd00::a', destinationPort: 65535 });
    expect(hex(h)).toBe(`${SIGNATURE}21` + '21' + '0024' + '20010db8000000000000000000000007' + 'fd00000000000000000000000000000a' + '0001' + 'ffff');
    expect(h.length).toBe(52);
  });

  it('IPv4-mapped IPv6 ends (a dual-stack socket\'s view of IPv4 peers) are IPv4, in either spelling', () => {
    const plain = proxyV2Header({ sourceAddress: '192.0.2.1', sourcePort: 56324, destinationAddress: '10.96.0.10', destinationPort: 80 });
    expect(proxyV2Header({ sourceAddress: '::ffff:192.0.2.1', sourcePort: 56324, destinationAddress: '::FFFF:10.96.0.10', destinationPort: 80 })).toEqual(plain);
    expect(proxyV2Header({ sourceAddress: '::ffff:c000:201', sourcePort: 56324, destinationAddress: '10.96.0.10', destinationPort: 80 })).toEqual(plain);
  });

  it('ends of different families go as IPv6, the IPv4 one mapped', () => {
    const h = proxyV2Header({ sourceAddress: '192.0.2.1', sourcePort: 56324, destinationAddress: 'fd00::a', destinationPort: 80 });
    expect(hex(h)).toBe(`${SIGNATURE}21` + '21' + '0024' + '00000000000000000000ffffc0000201' + 'fd00000000000000000000000000000a' + 'dc04' + '0050');
    const back = proxyV2Header({ sourceAddress: '::1', sourcePort: 80, destinationAddress: '127.0.0.1', destinationPort: 8080 });
    expect(hex(back)).toBe(`${SIGNATURE}21` + '21' + '0024' + '00000000000000000000000000000001' + '00000000000000000000ffff7f000001' + '0050' + '1f90');
  });

  it('drops an IPv6 scope, which names an interface of this host', () => {
    const scoped = proxyV2Header({ sourceAddress: 'fe80::1%eth0', sourcePort: 1, destinationAddress: 'fe80::2', destinationPort: 2 });
    expect(scoped).toEqual(proxyV2Header({ sourceAddress: 'fe80::1', sourcePort: 1, destinationAddress: 'fe80::2', destinationPort: 2 }));
  });

  it.each([
    [{ sourceAddress: 'client', sourcePort: 1, destinationAddress: '10.0.0.1', destinationPort: 2 }],
    [{ sourceAddress: '10.0.0.1', sourcePort: 1, destinationAddress: '', destinationPort: 2 }],
    [{ sourceAddress: '10.0.0.1', sourcePort: 70000, destinationAddress: '10.0.0.2', destinationPort: 2 }],
    [{ sourceAddress: '10.0.0.1', sourcePort: 1, destinationAddress: '10.0.0.2', destinationPort: -1 }],
  ])('throws INTERNAL for what the kernel cannot have given: %j', (c) => {
    let caught: unknown;
    try {
      proxyV2Header(c);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(ProxyError);
    expect((caught as ProxyError).code).toBe('INTERNAL');
  });
});

describe('portalDestinations (a connection NATed to a proxy port)', () => {
  it('names the one portal of each family', () => {
    expect(portalDestinations([{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }, { kind: 'clusterIP', ip: 'fd00::10', port: 80 }])).toEqual({
      4: { host: '10.96.0.10', port: 80 },
      6: { host: 'fd00::10', port: 80 },
    });
  });

  it('leaves out a family with several portals, and both when a node port (every node address) is one', () => {
    expect(portalDestinations([{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }, { kind: 'externalIP', ip: '192.0.2.7', port: 80 }, { kind: 'clusterIP', ip: 'fd00::10', port: 80 }])).toEqual({ 6: { host: 'fd00::10', port: 80 } });
    expect(portalDestinations([{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }, { kind: 'nodePort', ip: '', port: 30080 }])).toEqual({});
  });
});
