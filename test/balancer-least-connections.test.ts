import { describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import type { Clock, RandomSource } from '../src/core/clock.js';
import { type Endpoint, toEndpoint } from '../src/core/model.js';
import { seeded } from './helpers/seeded.js';

const clock: Clock = { now: () => 0 };
/** With Fisher-Yates, a source just below 1 always swaps an element with itself: no shuffle. */
const identity: RandomSource = () => 0.999999;
const ep = (last: number): Endpoint => toEndpoint({ ip: `10.0.0.${last}`, port: 80 });
const [A, B, C, D] = [ep(1), ep(2), ep(3), ep(4)] as [Endpoint, Endpoint, Endpoint, Endpoint];

function leastConnections(endpoints: Endpoint[] = [A, B, C], random: RandomSource = identity): RoundRobinBalancer {
  const lb = new RoundRobinBalancer({ clock, random });
  lb.setAlgorithm('least-connections');
  lb.setEndpoints(endpoints);
  return lb;
}

const pick = (lb: RoundRobinBalancer, ip = '1.1.1.1'): string => lb.nextEndpoint(ip, false)?.addr ?? 'none';
const active = (lb: RoundRobinBalancer): Record<string, number> => Object.fromEntries(lb.load().map((l) => [l.addr, l.active]));

describe('RoundRobinBalancer: least-connections', () => {
  it('takes ties round-robin', () => {
    const lb = leastConnections();
    const picked = [pick(lb), pick(lb), pick(lb)];
    expect(picked).toEqual([A.addr, B.addr, C.addr]);
    for (const a of picked) lb.release(toEndpoint({ ip: a.split(':')[0] as string, port: 80 }));
    expect([pick(lb), pick(lb), pick(lb)]).toEqual([A.addr, B.addr, C.addr]);
  });

  it('sends new connections away from an endpoint that holds long-lived ones', () => {
    const lb = leastConnections();
    // Two long-lived connections on A.
    const long = [lb.nextEndpoint('x', false), lb.nextEndpoint('x', false), lb.nextEndpoint('x', false), lb.nextEndpoint('x', false)];
    expect(long.map((e) => e?.addr)).toEqual([A.addr, B.addr, C.addr, A.addr]);
    lb.release(B);
    lb.release(C);
    const short: string[] = [];
    for (let i = 0; i < 8; i++) {
      const e = lb.nextEndpoint('x', false) as Endpoint;
      short.push(e.addr);
      lb.release(e);
    }
    expect(short).toEqual([B.addr, C.addr, B.addr, C.addr, B.addr, C.addr, B.addr, C.addr]);
    expect(active(lb)).toEqual({ [A.addr]: 2, [B.addr]: 0, [C.addr]: 0 });
  });

  it('counts through a change of the set, and forgets a departed endpoint once released', () => {
    const lb = leastConnections([A, B]);
    const a = lb.nextEndpoint('x', false) as Endpoint;
    expect(a).toEqual(A);
    lb.setEndpoints([B, C]);
    expect(active(lb)).toEqual({ [B.addr]: 0, [C.addr]: 0 });
    // A comes back while its connection still runs: the count is still there.
    lb.setEndpoints([A, B, C]);
    expect(active(lb)[A.addr]).toBe(1);
    lb.release(a);
    expect(active(lb)[A.addr]).toBe(0);
    lb.release(a); // a double release must not go negative
    expect(active(lb)[A.addr]).toBe(0);
  });

  it('keeps counts exact across a switch of algorithm', () => {
    const lb = new RoundRobinBalancer({ clock, random: identity });
    lb.setEndpoints([A, B, C]);
    const first = lb.nextEndpoint('x', false) as Endpoint;
    lb.nextEndpoint('x', false);
    lb.setAlgorithm('least-connections');
    expect(pick(lb)).toBe(C.addr);
    lb.release(first);
    expect(pick(lb)).toBe(A.addr);
    expect(active(lb)).toEqual({ [A.addr]: 1, [B.addr]: 1, [C.addr]: 1 });
  });

  it('lets ClientIP affinity win', () => {
    const lb = leastConnections();
    lb.setAffinity({ type: 'ClientIP', timeoutSeconds: 60 });
    expect(pick(lb, 'c1')).toBe(A.addr);
    expect(pick(lb, 'c1')).toBe(A.addr);
    expect(pick(lb, 'c1')).toBe(A.addr);
    expect(pick(lb, 'c2')).toBe(B.addr);
    expect(active(lb)).toEqual({ [A.addr]: 3, [B.addr]: 1, [C.addr]: 0 });
  });

  it('always picks an endpoint with the fewest connections, over a random stream of opens and closes', () => {
    const random = seeded(7);
    const lb = leastConnections([A, B, C, D], random);
    const open: Endpoint[] = [];
    for (let i = 0; i < 2000; i++) {
      if (open.length > 0 && random() < 0.45) {
        const [closed] = open.splice(Math.floor(random() * open.length), 1);
        lb.release(closed as Endpoint);
        continue;
      }
      const fewest = Math.min(...lb.load().map((l) => l.active));
      const e = lb.nextEndpoint('x', false) as Endpoint;
      open.push(e);
      expect(active(lb)[e.addr]).toBe(fewest + 1);
    }
    const byAddr = new Map<string, number>();
    for (const e of open) byAddr.set(e.addr, (byAddr.get(e.addr) ?? 0) + 1);
    expect(active(lb)).toEqual(Object.fromEntries([A, B, C, D].map((e) => [e.addr, byAddr.get(e.addr) ?? 0])));
  });
});

describe('RoundRobinBalancer: a retry avoids the endpoint that failed', () => {
  const clock = { now: () => 0 };
  const dead = toEndpoint({ ip: '10.0.0.1', port: 80 });
  const live = toEndpoint({ ip: '10.0.0.2', port: 80 });

  it.each(['least-connections', 'round-robin'] as const)('%s: retries alternate while another endpoint is usable; alone, it is taken again', (algorithm) => {
    const lb = new RoundRobinBalancer({ clock, random: () => 0.5 });
    lb.setAlgorithm(algorithm);
    lb.setEndpoints([dead, live]);
    // A long-lived connection on `live`: the least-connections pick is `dead` (none).
    lb.nextEndpoint('', false);
    lb.nextEndpoint('', false);
    lb.release(dead);
    let ep = lb.nextEndpoint('', false) as Endpoint;
    const picks: string[] = [];
    for (let attempt = 0; attempt < 4; attempt++) {
      picks.push(ep.addr);
      lb.release(ep);
      ep = lb.nextEndpoint('', true, ep) as Endpoint;
    }
    expect(new Set(picks.slice(0, 2)).size).toBe(2);
    expect(picks.every((p, i) => i === 0 || p !== picks[i - 1])).toBe(true);
    const alone = new RoundRobinBalancer({ clock, random: () => 0.5 });
    alone.setAlgorithm(algorithm);
    alone.setEndpoints([dead]);
    expect(alone.nextEndpoint('', true, dead)?.addr).toBe(dead.addr);
  });

  it('ClientIP affinity: the re-stick avoids the endpoint that failed', () => {
    const lb = new RoundRobinBalancer({ clock, random: () => 0.5 });
    lb.setAlgorithm('least-connections');
    lb.setAffinity({ type: 'ClientIP', timeoutSeconds: 60 });
    lb.setEndpoints([dead, live]);
    const first = lb.nextEndpoint('10.1.0.1', false) as Endpoint;
    lb.release(first);
    const retry = lb.nextEndpoint('10.1.0.1', true, first) as Endpoint;
    expect(retry.addr).not.toBe(first.addr);
    expect(lb.nextEndpoint('10.1.0.1', false)?.addr).toBe(retry.addr);
  });
});

