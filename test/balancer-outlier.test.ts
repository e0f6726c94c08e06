import { describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { DEFAULT_OUTLIER_POLICY, maxEjected, type OutlierPolicy } from '../src/core/balancer/outlier.js';
import type { Clock, RandomSource } from '../src/core/clock.js';
import { type Endpoint, toEndpoint } from '../src/core/model.js';

class FakeClock implements Clock {
  ms = 1_000_000;
  reads = 0;
  now = (): number => {
    this.reads++;
    return this.ms;
  };
}

const identity: RandomSource = () => 0.999999;
const ep = (last: number): Endpoint => toEndpoint({ ip: `10.0.0.${last}`, port: 80 });
const [A, B, C] = [ep(1), ep(2), ep(3)] as [Endpoint, Endpoint, Endpoint];
const POLICY: OutlierPolicy = { consecutiveFailures: 3, baseEjectionMs: 10_000, maxEjectionMs: 35_000, maxEjectionPercent: 100 };

function setup(policy: OutlierPolicy = POLICY, endpoints: Endpoint[] = [A, B, C]) {
  const clock = new FakeClock();
  const lb = new RoundRobinBalancer({ clock, random: identity, outlier: policy });
  lb.setEndpoints(endpoints);
  const picks = (n: number): string[] => Array.from({ length: n }, () => {
    const e = lb.nextEndpoint('1.1.1.1', false) as Endpoint;
    lb.release(e);
    return e.addr;
  });
  /** `n` failed dials of `e` in a row: whether the last one set it aside. */
  const fail = (e: Endpoint, n: number): boolean => {
    let ejected = false;
    for (let i = 0; i < n; i++) ejected = lb.reportDial(e, false);
    return ejected;
  };
  const setAside = (): Record<string, number> => Object.fromEntries(lb.load().filter((l) => l.setAsideMs > 0).map((l) => [l.addr, l.setAsideMs]));
  return { clock, lb, picks, fail, setAside };
}

describe('RoundRobinBalancer: passive health', () => {
  it('sets an endpoint aside after consecutive failures, and takes it back when the time is up', () => {
    const { clock, picks, fail, setAside } = setup();
    expect(fail(B, 2)).toBe(false);
    expect(picks(3)).toEqual([A.addr, B.addr, C.addr]);
    expect(fail(B, 1)).toBe(true);
    expect(setAside()).toEqual({ [B.addr]: 10_000 });
    expect(picks(4)).toEqual([A.addr, C.addr, A.addr, C.addr]);
    clock.ms += 9_999;
    expect(picks(2)).toEqual([A.addr, C.addr]);
    clock.ms += 1;
    expect(picks(3)).toEqual([A.addr, B.addr, C.addr]);
    expect(setAside()).toEqual({});
  });

  it('needs the failures in a row: a success starts the count again', () => {
    const { lb, fail, setAside } = setup();
    fail(A, 2);
    lb.reportDial(A, true);
    expect(fail(A, 2)).toBe(false);
    expect(fail(A, 1)).toBe(true);
    expect(setAside()).toHaveProperty(A.addr);
  });

  it('doubles the time on repeat, up to the cap, and starts again after a long healthy stretch', () => {
    const { clock, lb, fail, setAside } = setup();
    const durations: number[] = [];
    for (let i = 0; i < 4; i++) {
      fail(A, 3);
      const ms = setAside()[A.addr] as number;
      durations.push(ms);
      clock.ms += ms;
      lb.nextEndpoint('x', false); // a pick takes it back
    }
    expect(durations).toEqual([10_000, 20_000, 35_000, 35_000]);
    clock.ms += 35_001;
    fail(A, 3);
    expect(setAside()[A.addr]).toBe(10_000);
  });

  it('uses every endpoint when every one is set aside: no Service is emptied', () => {
    const { picks, fail, setAside } = setup();
    fail(A, 3);
    fail(B, 3);
    expect(picks(2)).toEqual([C.addr, C.addr]);
    expect(fail(C, 3)).toBe(true);
    expect(Object.keys(setAside())).toHaveLength(3);
    expect(picks(3).sort()).toEqual([A.addr, B.addr, C.addr]);
  });

  it('sets aside at most the share, and always one', () => {
    expect(maxEjected({ ...POLICY, maxEjectionPercent: 10 }, 3)).toBe(1);
    expect(maxEjected({ ...POLICY, maxEjectionPercent: 50 }, 5)).toBe(2);
    const { clock, lb, fail, setAside } = setup({ ...POLICY, maxEjectionPercent: 34 });
    expect(fail(A, 3)).toBe(true);
    expect(fail(B, 5)).toBe(false);
    expect(Object.keys(setAside())).toEqual([A.addr]);
    // Once A is back, B's next failure sets it aside: it kept failing meanwhile.
    clock.ms += 10_000;
    lb.nextEndpoint('x', false);
    expect(fail(B, 1)).toBe(true);
  });

  it('ignores failures of an endpoint already set aside, and of one that left', () => {
    const { lb, fail, setAside } = setup();
    fail(A, 3);
    const before = setAside();
    expect(fail(A, 10)).toBe(false);
    expect(setAside()).toEqual(before);
    expect(lb.reportDial(ep(9), false)).toBe(false);
  });

  it('moves a sticky client off an endpoint that was set aside', () => {
    const { lb, fail } = setup();
    lb.setAffinity({ type: 'ClientIP', timeoutSeconds: 60 });
    expect(lb.nextEndpoint('c', false)).toEqual(A);
    fail(A, 3);
    expect(lb.nextEndpoint('c', false)).toEqual(B);
    expect(lb.nextEndpoint('c', false)).toEqual(B);
  });

  it('is off with consecutiveFailures 0', () => {
    const { fail, setAside } = setup({ ...POLICY, consecutiveFailures: 0 });
    expect(fail(A, 100)).toBe(false);
    expect(setAside()).toEqual({});
  });

  it('keeps health across an unchanged set and a changed one, and forgets an endpoint that left', () => {
    const { lb, fail, setAside } = setup();
    fail(A, 3);
    lb.setEndpoints([C, B, A]);
    lb.setEndpoints([A, B, C, ep(4)]);
    expect(Object.keys(setAside())).toEqual([A.addr]);
    lb.setEndpoints([B, C]);
    lb.setEndpoints([A, B, C]);
    expect(setAside()).toEqual({});
  });

  it('reads the clock only while something is set aside, and a success report looks nothing up while nothing fails', () => {
    const { clock, lb, picks } = setup();
    picks(10);
    lb.reportDial(A, true);
    expect(clock.reads).toBe(0);
  });

  it('defaults to Envoy\'s times', () => {
    expect(DEFAULT_OUTLIER_POLICY).toMatchObject({ consecutiveFailures: 5, baseEjectionMs: 30_000, maxEjectionMs: 300_000 });
  });
});

describe('a pod IP reused by a new pod', () => {
  it('is a new endpoint: neither the old pod\'s ejection nor its sticky clients carry over', () => {
    let ms = 0;
    const lb = new RoundRobinBalancer({ clock: { now: () => ms }, random: () => 0.5 });
    lb.setAffinity({ type: 'ClientIP', timeoutSeconds: 3600 });
    const old = toEndpoint({ ip: '10.3.0.1', port: 80, targetPod: { namespace: 'd', name: 'web-old' } });
    const other = toEndpoint({ ip: '10.3.0.2', port: 80, targetPod: { namespace: 'd', name: 'web-other' } });
    lb.setEndpoints([old, other]);
    // Sticky clients on each, then the old pod fails five dials in a row: set aside.
    const clients = Array.from({ length: 20 }, (_, i) => `192.168.9.${i + 1}`);
    const stuck = new Map(clients.map((c) => [c, lb.nextEndpoint(c, false)?.addr]));
    for (let i = 0; i < 5; i++) lb.reportDial(old, false);
    expect(lb.load().find((l) => l.addr === old.addr)?.setAsideMs).toBeGreaterThan(0);
    ms += 1000;
    const fresh = toEndpoint({ ip: '10.3.0.1', port: 80, targetPod: { namespace: 'd', name: 'web-new' } });
    lb.setEndpoints([fresh, other]);
    expect(lb.load().find((l) => l.addr === fresh.addr)?.setAsideMs).toBe(0);
    // The other pod's clients stay; the old pod's are picked afresh (they may land anywhere).
    for (const c of clients) if (stuck.get(c) === other.addr) expect(lb.nextEndpoint(c, false)?.addr).toBe(other.addr);
    expect(lb.endpoints.find((e) => e.addr === fresh.addr)?.targetPod?.name).toBe('web-new');
  });
});

