import { describe, expect, it } from 'vitest';
import { isReservedLoopback, loopbackAddressFor } from '../src/core/loopback-address.js';

const none = (): boolean => false;

describe('loopback addresses per Service', () => {
  it('maps an IPv4 ClusterIP onto 127/8 by its low 24 bits', () => {
    expect(loopbackAddressFor('default/web', ['10.96.0.80'], none)).toBe('127.96.0.80');
    expect(loopbackAddressFor('default/dual', ['fd00::1', '10.96.3.4'], none)).toBe('127.96.3.4');
  });

  it('hashes the name into 127.128.0.0/9 for IPv6-only Services, stably', () => {
    const first = loopbackAddressFor('default/v6only', ['fd00::10'], none);
    expect(first).toMatch(/^127\.(1[2-9]\d|2[0-5]\d)\.\d+\.\d+$/);
    expect(loopbackAddressFor('default/v6only', ['fd00::10'], none)).toBe(first);
    expect(loopbackAddressFor('default/other', ['fd00::11'], none)).not.toBe(first);
  });

  it('never hands out 127.0.0.0/16 or network/broadcast-looking addresses', () => {
    expect(isReservedLoopback('127.0.0.1')).toBe(true);
    expect(isReservedLoopback('127.96.0.80')).toBe(false);
    // Not a dotted quad: never an address to hand out.
    expect(isReservedLoopback('127.96.80')).toBe(true);
    expect(loopbackAddressFor('default/a', ['10.0.0.1'], none)).not.toMatch(/^127\.0\./);
    expect(loopbackAddressFor('default/b', ['10.96.0.0'], none)).not.toBe('127.96.0.0');
  });

  it('probes past addresses another Service holds', () => {
    const taken = new Set(['127.96.0.80']);
    const addr = loopbackAddressFor('default/web2', ['10.96.0.80'], (x) => taken.has(x));
    expect(addr).not.toBe('127.96.0.80');
    taken.add(addr);
    expect(loopbackAddressFor('default/web3', ['10.96.0.80'], (x) => taken.has(x))).not.toBe(addr);
  });
});
