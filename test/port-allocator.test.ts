import { describe, expect, it } from 'vitest';
import { roundRobinFactory } from '../src/core/balancer/round-robin.js';
import { systemClock, type RandomSource } from '../src/core/clock.js';
import { PortAllocator, formatPortRange, parsePortRange } from '../src/core/port-allocator.js';
import { ProxyError, UsageError } from '../src/core/errors.js';
import type { ProxyUnit } from '../src/core/units.js';
import { UdpReceiveBuffers } from '../src/io/net/udp-receive-buffers.js';
import { silentLogger } from '../src/log.js';
import { LocalUnitSet } from '../src/proxier/unit-set.js';
import { proxySocketFactory } from '../src/proxy-sockets.js';
import type { UnitOpen } from '../src/seams/unit-set.js';
import { freePort, freePortRun } from './helpers/net.js';
import { seeded } from './helpers/seeded.js';

/** Replays `values` in turn, repeating the last one. */
function sequence(...values: number[]): RandomSource {
  let i = 0;
  return () => values[Math.min(i++, values.length - 1)] ?? 0;
}

function usageError(fn: () => unknown): UsageError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(UsageError);
    expect((err as UsageError).code).toBe('USAGE');
    return err as UsageError;
  }
  throw new Error('expected a UsageError');
}

describe('parsePortRange', () => {
  it.each([
    ['', undefined],
    ['   ', undefined],
    ['0', undefined],
    ['0-0', undefined],
    ['0+0', undefined],
    ['8080', { base: 8080, size: 1 }],
    ['1', { base: 1, size: 1 }],
    ['65535', { base: 65535, size: 1 }],
    ['30000-30009', { base: 30000, size: 10 }],
    ['100-100', { base: 100, size: 1 }],
    ['1-65535', { base: 1, size: 65535 }],
    ['30000+9', { base: 30000, size: 10 }],
    ['100+0', { base: 100, size: 1 }],
    ['65530+5', { base: 65530, size: 6 }],
    [' 2000-2001 ', { base: 2000, size: 2 }],
    ['08080', { base: 8080, size: 1 }],
  ])('parses %j', (text, want) => {
    expect(parsePortRange(text)).toEqual(want);
  });

  const JUNK = 'expected a port (p), a range (a-b) or a start and offset (a+n)';

  it.each([
    ['abc', JUNK],
    ['100-', JUNK],
    ['-100', JUNK],
    ['100+', JUNK],
    ['100-200-300', JUNK],
    ['100-+5', JUNK],
    ['100+-5', JUNK],
    ['1.5', JUNK],
    ['100 - 200', JUNK],
    ['0x50', JUNK],
    ['70000', 'port 70000 is outside 1-65535'],
    ['1-70000', 'port 70000 is outside 1-65535'],
    ['0-100', 'port 0 is outside 1-65535'],
    ['0+5', 'port 0 is outside 1-65535'],
    ['65530+10', 'port 65540 is outside 1-65535'],
    ['200-100', 'end port 100 is before start port 200'],
  ])('rejects %j', (text, problem) => {
    const err = usageError(() => parsePortRange(text));
    expect(err.message).toBe(`proxy port range: invalid port range "${text}": ${problem}`);
  });

  it('names the setting it was given', () => {
    const err = usageError(() => parsePortRange('x', 'portRange'));
    expect(err.message).toBe('portRange: invalid port range "x": expected a port (p), a range (a-b) or a start and offset (a+n)');
  });

  it('round-trips through formatPortRange', () => {
    expect(formatPortRange({ base: 30000, size: 10 })).toBe('30000-30009');
    expect(formatPortRange({ base: 80, size: 1 })).toBe('80-80');
    for (const text of ['30000+9', '8080', '1-65535']) {
      const r = parsePortRange(text);
      if (r === undefined) throw new Error(`${text} parsed to undefined`);
      expect(parsePortRange(formatPortRange(r))).toEqual(r);
    }
  });
});

describe('PortAllocator', () => {
  const range = { base: 30000, size: 10 };

  it('returns 0 (let the kernel pick) without a range, and ignores release', () => {
    const pa = new PortAllocator(undefined, sequence(0.5));
    expect(pa.allocateNext()).toBe(0);
    expect(pa.allocateNext()).toBe(0);
    pa.release(0);
    pa.release(30000);
    pa.markInUse(30000);
    expect(pa.inUse()).toBe(0);
  });

  it('claim takes a wanted port only if it is a free port of the range; without a range any port', () => {
    const pa = new PortAllocator(range, sequence(0.5));
    expect(pa.claim(30005)).toBe(true);
    expect(pa.claim(30005)).toBe(false);
    expect(pa.claim(40000)).toBe(false);
    expect(pa.inUse()).toBe(1);
    expect(pa.allocateNext()).toBe(30006);
    pa.release(30005);
    expect(pa.claim(30005)).toBe(true);
    const none = new PortAllocator(undefined, sequence(0.5));
    expect(none.claim(40000)).toBe(true);
    expect(none.claim(0)).toBe(false);
    expect(none.inUse()).toBe(0);
  });

  it('starts at a random offset and scans forward past taken ports', () => {
    const pa = new PortAllocator(range, sequence(0.5));
    expect(pa.allocateNext()).toBe(30005);
    expect(pa.allocateNext()).toBe(30006);
    expect(pa.allocateNext()).toBe(30007);
    expect(pa.inUse()).toBe(3);
  });

  it('wraps around to the start of the range', () => {
    const pa = new PortAllocator(range, sequence(0.95));
    expect(pa.allocateNext()).toBe(30009);
    expect(pa.allocateNext()).toBe(30000);
  });

  it('copes with a source that returns exactly 1', () => {
    const pa = new PortAllocator(range, sequence(1));
    expect(pa.allocateNext()).toBe(30009);
  });

  it('hands out every port of the range once, then throws PORT_RANGE_EXHAUSTED', () => {
    const pa = new PortAllocator(range, seeded(7));
    const got = Array.from({ length: 10 }, () => pa.allocateNext());
    expect([...got].sort()).toEqual(Array.from({ length: 10 }, (_, i) => 30000 + i));
    expect(pa.inUse()).toBe(10);
    let err: unknown;
    try {
      pa.allocateNext();
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ProxyError);
    expect((err as ProxyError).code).toBe('PORT_RANGE_EXHAUSTED');
    expect((err as ProxyError).message).toContain('30000-30009');
  });

  it('spreads ports: a seeded source does not hand them out in order', () => {
    const pa = new PortAllocator({ base: 40000, size: 1000 }, seeded(1));
    const got = Array.from({ length: 5 }, () => pa.allocateNext());
    expect(got).not.toEqual([40000, 40001, 40002, 40003, 40004]);
    expect(new Set(got).size).toBe(5);
  });

  it('reuses a released port', () => {
    const pa = new PortAllocator({ base: 5000, size: 2 }, sequence(0));
    expect(pa.allocateNext()).toBe(5000);
    expect(pa.allocateNext()).toBe(5001);
    pa.release(5000);
    expect(pa.inUse()).toBe(1);
    expect(pa.allocateNext()).toBe(5000);
    expect(() => pa.allocateNext()).toThrow(ProxyError);
  });

  it('ignores releasing 0, a port outside the range, or a free port', () => {
    const pa = new PortAllocator(range, sequence(0));
    pa.allocateNext();
    pa.release(0);
    pa.release(29999);
    pa.release(30010);
    pa.release(30005);
    pa.release(30000.5);
    expect(pa.inUse()).toBe(1);
    pa.release(30000);
    pa.release(30000);
    expect(pa.inUse()).toBe(0);
  });

  it('skips ports marked in use by another process until released', () => {
    const pa = new PortAllocator(range, sequence(0.5));
    pa.markInUse(30005);
    pa.markInUse(30005);
    pa.markInUse(30006);
    pa.markInUse(12345);
    expect(pa.inUse()).toBe(2);
    expect(pa.allocateNext()).toBe(30007);
    pa.release(30005);
    expect(pa.allocateNext()).toBe(30005);
    expect(pa.inUse()).toBe(3);
  });

  it('keeps an allocated port taken when it is also marked (bind failed with EADDRINUSE)', () => {
    const pa = new PortAllocator({ base: 6000, size: 2 }, sequence(0));
    const p = pa.allocateNext();
    pa.markInUse(p);
    expect(pa.inUse()).toBe(1);
    expect(pa.allocateNext()).toBe(6001);
  });
});

describe('PortAllocator quarantine', () => {
  it('keeps a quarantined port from allocateNext until releaseQuarantined, but lets its own unit claim it again', () => {
    const pa = new PortAllocator({ base: 7000, size: 1 }, sequence(0));
    expect(pa.allocateNext()).toBe(7000);
    pa.quarantine(7000);
    expect(pa.inUse()).toBe(1);
    expect(() => pa.allocateNext()).toThrow(/1 of them freed in this sync, free from the next/);
    expect(pa.claim(7000)).toBe(true);
    pa.quarantine(7000);
    pa.releaseQuarantined();
    expect(pa.inUse()).toBe(0);
    expect(pa.allocateNext()).toBe(7000);
    // Released (or marked by another process) meanwhile: the quarantine's end leaves it alone.
    pa.quarantine(7000);
    pa.markInUse(7000);
    pa.releaseQuarantined();
    expect(pa.inUse()).toBe(1);
  });
});

describe('proxy ports of a unit set', () => {
  const unit = (id: string): ProxyUnit => ({ id, servicePort: id, service: id.split(':')[0] as string, protocol: 'TCP', scope: 'all', portals: [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }], endpoints: [], affinity: { type: 'None', timeoutSeconds: 0 } });
  const open = (id: string): UnitOpen => ({ unit: unit(id), listen: [{ host: '127.0.0.1', port: 0, proxyPort: true, portals: [] }] });
  const unitSet = (portAllocator: PortAllocator): LocalUnitSet => {
    const logger = silentLogger();
    return new LocalUnitSet({
      logger,
      balancerFactory: roundRobinFactory,
      socketFactory: proxySocketFactory({ udpIdleTimeoutMs: 1000, maxUdpSessions: 10, reusePort: true, tcpKeepAliveMs: 15_000, tcpIdleTimeoutMs: 0, holdMaxPerServicePort: 10, holdMaxPerNode: 10 }, logger, new UdpReceiveBuffers({ logger })),
      portAllocator,
      clock: systemClock,
      random: Math.random,
      bindAddress: '127.0.0.1',
      sweepIntervalMs: 1000,
    });
  };

  it("does not hand a port closed in a batch to another unit of the same batch (the portal still points it at the closed one's)", async () => {
    const port = await freePort('127.0.0.1');
    const units = unitSet(new PortAllocator({ base: port, size: 1 }, Math.random));
    try {
      await units.apply({ close: [], recreate: [], open: [open('default/a:http')], update: [] });
      expect(units.views()[0]?.proxyPort).toBe(port);
      const swap = await units.apply({ close: ['default/a:http'], recreate: [], open: [open('default/b:http')], update: [] });
      expect(swap.listenErrors).toBe(1);
      expect(units.views()).toEqual([{ unit: unit('default/b:http') }]);
      // The next batch (the portal was synced after the one before): now it may.
      const next = await units.apply({ close: [], recreate: [], open: [], update: [] });
      expect(next.rebound).toBe(1);
      expect(units.views()[0]?.proxyPort).toBe(port);
    } finally {
      await units.shutdown(0);
    }
  });

  it("keeps a batch's preferred ports for their units: an earlier unit of the batch does not take a later one's", async () => {
    // Under a hand-over the old process still listens on the preferred port (SO_REUSEPORT), so a
    // bind would succeed for whichever unit asked first and split that port's traffic.
    // Both ports of the range must be free: below the ephemeral range, where no test's outgoing connection lands.
    const base = await freePortRun(2, '127.0.0.1');
    // A source that always starts the scan at the range's first port: the one `b` prefers.
    const units = unitSet(new PortAllocator({ base, size: 2 }, () => 0));
    try {
      await units.apply({ close: [], recreate: [], open: [open('default/a:http'), { ...open('default/b:http'), preferredProxyPort: base }], update: [] });
      const ports = new Map(units.views().map((v) => [v.unit.id, v.proxyPort]));
      expect(ports.get('default/b:http')).toBe(base);
      expect(ports.get('default/a:http')).toBe(base + 1);
    } finally {
      await units.shutdown(0);
    }
  });
});
