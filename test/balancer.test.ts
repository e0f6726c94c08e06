import { describe, expect, it } from 'vitest';
import { RoundRobinBalancer, roundRobinFactory } from '../src/core/balancer/round-robin.js';
import type { Clock, RandomSource } from '../src/core/clock.js';
import { type AffinityPolicy, type Endpoint, toEndpoint } from '../src/core/model.js';
import { seeded } from './helpers/seeded.js';

/** A clock that moves only when the test says so; counts reads to show the None path skips it. */
class FakeClock implements Clock {
  ms = 0;
  reads = 0;
  now(): number {
    this.reads++;
    return this.ms;
  }
  advanceSeconds(s: number): void {
    this.ms += s * 1000;
  }
}

/** With Fisher-Yates, a source just below 1 always swaps an element with itself: no shuffle. */
const identity: RandomSource = () => 0.999999;

function counting(source: RandomSource): RandomSource & { calls: number } {
  const f = Object.assign(() => {
    f.calls++;
    return source();
  }, { calls: 0 });
  return f;
}

const ep = (last: number, port = 80): Endpoint => toEndpoint({ ip: `10.0.0.${last}`, port });
const [A, B, C, D] = [ep(1), ep(2), ep(3), ep(4)] as [Endpoint, Endpoint, Endpoint, Endpoint];
const clientIP = (policyTimeout: number): AffinityPolicy => ({ type: 'ClientIP', timeoutSeconds: policyTimeout });
const NONE: AffinityPolicy = { type: 'None', timeoutSeconds: 10800 };

function setup(random: RandomSource = identity) {
  const clock = new FakeClock();
  const lb = new RoundRobinBalancer({ clock, random });
  /** The addrs of `n` picks for one client, without a reset. */
  const picks = (n: number, ip = '192.168.0.1') =>
    Array.from({ length: n }, () => lb.nextEndpoint(ip, false)?.addr);
  return { clock, lb, picks };
}

const addrs = (eps: readonly Endpoint[]) => eps.map((e) => e.addr);

describe('RoundRobinBalancer: round-robin', () => {
  it('returns undefined without endpoints, with or without affinity', () => {
    const { lb } = setup();
    expect(lb.nextEndpoint('1.1.1.1', false)).toBeUndefined();
    lb.setAffinity(clientIP(60));
    expect(lb.nextEndpoint('1.1.1.1', false)).toBeUndefined();
    lb.setEndpoints([A]);
    lb.setEndpoints([]);
    expect(lb.nextEndpoint('1.1.1.1', false)).toBeUndefined();
    expect(lb.endpoints).toEqual([]);
  });

  it('says whether picks use the client IP: only with ClientIP affinity', () => {
    const { lb } = setup();
    expect(lb.usesClientIP).toBe(false);
    lb.setAffinity(clientIP(60));
    expect(lb.usesClientIP).toBe(true);
    lb.setAffinity(NONE);
    expect(lb.usesClientIP).toBe(false);
  });

  it('cycles through the list in order', () => {
    const { lb, picks } = setup();
    lb.setEndpoints([A, B, C]);
    expect(addrs(lb.endpoints)).toEqual([A.addr, B.addr, C.addr]);
    expect(picks(7)).toEqual([A, B, C, A, B, C, A].map((e) => e.addr));
  });

  it('shuffles a new set with the injected random source (Fisher-Yates)', () => {
    // Source 0 swaps every position with index 0: [a,b,c] -> [c,b,a] -> [b,c,a].
    const { lb, picks } = setup(() => 0);
    lb.setEndpoints([A, B, C]);
    expect(addrs(lb.endpoints)).toEqual([B.addr, C.addr, A.addr]);
    expect(picks(3)).toEqual([B.addr, C.addr, A.addr]);
  });

  it('gives the same order for the same seed, and a permutation of the set', () => {
    const eps = Array.from({ length: 20 }, (_, i) => ep(i + 1));
    const one = setup(seeded(42)).lb;
    const two = setup(seeded(42)).lb;
    one.setEndpoints(eps);
    two.setEndpoints(eps);
    expect(addrs(one.endpoints)).toEqual(addrs(two.endpoints));
    expect(addrs(one.endpoints)).not.toEqual(addrs(eps));
    expect([...addrs(one.endpoints)].sort()).toEqual([...addrs(eps)].sort());
  });

  it('keeps order and index when the same set arrives again, in any order or with duplicates', () => {
    const random = counting(identity);
    const { lb, picks } = setup(random);
    lb.setEndpoints([A, B, C]);
    const before = lb.endpoints;
    const calls = random.calls;
    expect(picks(1)).toEqual([A.addr]);
    lb.setEndpoints([A, B, C]);
    lb.setEndpoints([C, A, B]);
    lb.setEndpoints([B, B, C, A, C]);
    lb.setEndpoints([toEndpoint({ ip: '10.0.0.2', port: 80 }), C, A]);
    expect(lb.endpoints).toBe(before);
    expect(random.calls).toBe(calls);
    expect(picks(3)).toEqual([B.addr, C.addr, A.addr]);
  });

  it('reshuffles and resets the index when the set changes', () => {
    const random = counting(identity);
    const { lb, picks } = setup(random);
    lb.setEndpoints([A, B, C]);
    expect(picks(2)).toEqual([A.addr, B.addr]);
    const calls = random.calls;
    lb.setEndpoints([A, B, C, D]);
    expect(random.calls).toBeGreaterThan(calls);
    expect(picks(2)).toEqual([A.addr, B.addr]);
    lb.setEndpoints([B, C, D]);
    expect(picks(1)).toEqual([B.addr]);
  });

  it('makes a first list into slots at its first use: a list replaced before any is never shuffled', () => {
    const random = counting(identity);
    const { lb, picks } = setup(random);
    lb.setEndpoints([A, B, C]);
    lb.setEndpoints([A, B, D]);
    lb.setEndpoints([D, B, D, A]); // the last list given is the one made into slots, duplicates dropped
    // Its load (GET /services) is read as it waits: nothing handed out, nothing set aside.
    expect(lb.load()).toEqual([D, B, A].map((e) => ({ addr: e.addr, active: 0, setAsideMs: 0 })));
    expect(random.calls).toBe(0);
    expect(picks(4)).toEqual([D.addr, B.addr, A.addr, D.addr]);
    expect(random.calls).toBeGreaterThan(0);
    // From then on a change applies at once: counts and health carry over.
    const calls = random.calls;
    lb.setEndpoints([A, B]);
    expect(random.calls).toBeGreaterThan(calls);
  });

  it('counts a same-size set with a different member as changed', () => {
    const { lb, picks } = setup();
    lb.setEndpoints([A, B, C]);
    picks(1);
    lb.setEndpoints([A, B, D]);
    expect(addrs(lb.endpoints)).toEqual([A.addr, B.addr, D.addr]);
    expect(picks(1)).toEqual([A.addr]);
  });

  it('drops duplicate addrs from a changed set so none gets a double share', () => {
    const { lb, picks } = setup();
    lb.setEndpoints([A, A, B, A]);
    expect(addrs(lb.endpoints)).toEqual([A.addr, B.addr]);
    expect(picks(4)).toEqual([A.addr, B.addr, A.addr, B.addr]);
  });

  it('drops duplicate addrs from a long set too (more than a few endpoints are deduplicated by table)', () => {
    const { lb, picks } = setup();
    const many = Array.from({ length: 20 }, (_, i) => ep(i + 1));
    lb.setEndpoints([...many, ...many.slice(0, 5), ep(4)]);
    expect(addrs(lb.endpoints)).toEqual(many.map((e) => e.addr));
    expect(new Set(picks(20)).size).toBe(20);
  });

  it('leaves the endpoints array handed out earlier untouched by a change', () => {
    const { lb } = setup(() => 0);
    lb.setEndpoints([A, B, C]);
    const snapshot = lb.endpoints;
    const copy = [...snapshot];
    lb.setEndpoints([A, B, C, D]);
    expect(snapshot).toEqual(copy);
  });

  it('never reads the clock without affinity (the per-connection path stays bare)', () => {
    const { lb, clock, picks } = setup();
    lb.setEndpoints([A, B]);
    picks(10);
    lb.nextEndpoint('1.1.1.1', true);
    expect(clock.reads).toBe(0);
  });

  it('is what the factory builds, and release changes nothing', () => {
    const lb = roundRobinFactory({ clock: new FakeClock(), random: identity });
    expect(lb).toBeInstanceOf(RoundRobinBalancer);
    lb.setEndpoints([A, B]);
    lb.release(A);
    expect(lb.nextEndpoint('1.1.1.1', false)).toEqual(A);
    lb.release(A);
    expect(lb.nextEndpoint('1.1.1.1', false)).toEqual(B);
  });
});

describe('RoundRobinBalancer: client-IP affinity', () => {
  function sticky(timeoutSeconds = 60, random: RandomSource = identity) {
    const s = setup(random);
    s.lb.setAffinity(clientIP(timeoutSeconds));
    s.lb.setEndpoints([A, B, C]);
    return s;
  }

  it('keeps each client on its endpoint while other clients round-robin', () => {
    const { lb, picks } = sticky();
    expect(picks(3, '1.1.1.1')).toEqual([A.addr, A.addr, A.addr]);
    expect(picks(2, '2.2.2.2')).toEqual([B.addr, B.addr]);
    expect(picks(1, '3.3.3.3')).toEqual([C.addr]);
    expect(picks(1, '4.4.4.4')).toEqual([A.addr]);
    expect(lb.nextEndpoint('2.2.2.2', false)).toEqual(B);
  });

  it('slides the timeout: each use restarts it', () => {
    const { clock, picks } = sticky(10);
    expect(picks(1)).toEqual([A.addr]);
    for (let i = 0; i < 5; i++) {
      clock.advanceSeconds(9);
      expect(picks(1)).toEqual([A.addr]);
    }
    clock.advanceSeconds(10);
    expect(picks(1)).toEqual([B.addr]);
  });

  it('replaces an entry found expired on lookup, at exactly the timeout', () => {
    const { clock, picks } = sticky(10);
    expect(picks(1)).toEqual([A.addr]);
    clock.advanceSeconds(9.999);
    expect(picks(1)).toEqual([A.addr]);
    clock.advanceSeconds(10);
    expect(picks(1)).toEqual([B.addr]);
    // The replacement is sticky in turn.
    clock.advanceSeconds(5);
    expect(picks(2)).toEqual([B.addr, B.addr]);
  });

  it('drops expired entries on a sweep and keeps fresh ones', () => {
    const { lb, clock, picks } = sticky(10);
    picks(1, 'old');
    clock.advanceSeconds(6);
    picks(1, 'fresh');
    clock.advanceSeconds(5);
    lb.cleanupStaleStickySessions();
    // A longer timeout would revive an entry that was merely expired; a swept one is gone.
    lb.setAffinity(clientIP(1000));
    expect(picks(1, 'fresh')).toEqual([B.addr]);
    expect(picks(1, 'old')).toEqual([C.addr]);
  });

  it('drops the entries of an endpoint that left the set, and keeps the others', () => {
    const { lb, picks } = sticky();
    expect(picks(1, 'on-a')).toEqual([A.addr]);
    expect(picks(1, 'on-b')).toEqual([B.addr]);
    lb.setEndpoints([B, C, D]);
    expect(picks(1, 'on-a')).toEqual([B.addr]);
    expect(picks(1, 'on-a')).toEqual([B.addr]);
    expect(picks(1, 'on-b')).toEqual([B.addr]);
  });

  it('hands out the current endpoint object for a surviving entry', () => {
    const { lb } = sticky();
    expect(lb.nextEndpoint('c', false)).toEqual(A);
    const A2: Endpoint = { ...A, nodeName: 'node-1' };
    lb.setEndpoints([A2, D]);
    expect(lb.nextEndpoint('c', false)).toEqual(A2);
  });

  it('re-picks on sessionAffinityReset and sticks to the new endpoint', () => {
    const { lb, picks } = sticky();
    expect(picks(1)).toEqual([A.addr]);
    expect(lb.nextEndpoint('192.168.0.1', true)).toEqual(B);
    expect(picks(2)).toEqual([B.addr, B.addr]);
    // A reset for a client with no entry just picks the next one.
    expect(lb.nextEndpoint('9.9.9.9', true)).toEqual(C);
  });

  it('applies a shorter timeout to existing entries', () => {
    const { lb, clock, picks } = sticky(100);
    expect(picks(1)).toEqual([A.addr]);
    clock.advanceSeconds(20);
    lb.setAffinity(clientIP(10));
    expect(picks(1)).toEqual([B.addr]);
  });

  it('applies a longer timeout to existing entries', () => {
    const { lb, clock, picks } = sticky(10);
    expect(picks(1)).toEqual([A.addr]);
    clock.advanceSeconds(15);
    lb.setAffinity(clientIP(100));
    lb.cleanupStaleStickySessions();
    expect(picks(1)).toEqual([A.addr]);
  });

  it.each([
    ['affinity first', (lb: RoundRobinBalancer) => { lb.setAffinity(clientIP(30)); lb.setEndpoints([A, B, C]); }],
    ['endpoints first', (lb: RoundRobinBalancer) => { lb.setEndpoints([A, B, C]); lb.setAffinity(clientIP(30)); }],
  ])('keeps the Service timeout whatever arrives first (%s)', (_name, apply) => {
    const { lb, clock, picks } = setup();
    apply(lb);
    lb.setEndpoints([C, B, A, D]); // a later slice update must not reset the policy
    expect(picks(1)).toEqual([C.addr]);
    clock.advanceSeconds(29);
    expect(picks(1)).toEqual([C.addr]);
    clock.advanceSeconds(30);
    expect(picks(1)).toEqual([B.addr]);
  });

  it('drops all entries when switched to None, and does not revive them', () => {
    const { lb, picks } = sticky();
    expect(picks(1, 'x')).toEqual([A.addr]);
    lb.setAffinity(NONE);
    expect(picks(3, 'x')).toEqual([B.addr, C.addr, A.addr]);
    lb.setAffinity(clientIP(60));
    expect(picks(2, 'x')).toEqual([B.addr, B.addr]);
  });

  it('treats a timeout of 0 as unset: the 10800 s default', () => {
    const { clock, picks } = sticky(0);
    expect(picks(1)).toEqual([A.addr]);
    clock.advanceSeconds(10799);
    expect(picks(1)).toEqual([A.addr]);
    clock.advanceSeconds(10800);
    expect(picks(1)).toEqual([B.addr]);
  });
});
