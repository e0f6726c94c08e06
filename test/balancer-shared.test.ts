import { describe, expect, it } from 'vitest';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { rendezvousPick } from '../src/core/balancer/shared-order.js';
import type { StickyUpdate } from '../src/core/balancer/load-balancer.js';
import { toEndpoint, type AffinityPolicy, type Endpoint } from '../src/core/model.js';

/**
 * Balancers of several worker processes serving one service port (`--workers`): they agree
 * without a round trip per connection.
 */

const SEED = 0x5eed;

function ep(addr: string): Endpoint {
  const [ip = '', port = '0'] = addr.split(':');
  return { ip, port: Number(port), addr };
}

const eps = (...addrs: string[]): Endpoint[] => addrs.map(ep);

function clock(): { now: () => number; advance(ms: number): void } {
  let t = 1000;
  return { now: () => t, advance: (ms) => { t += ms; } };
}

function worker(index: number, c = clock(), touchShareMs?: number): { b: RoundRobinBalancer; news: () => number } {
  let news = 0;
  const b = new RoundRobinBalancer({
    clock: c,
    // Unseeded randomness must not matter once `shared` is given.
    random: Math.random,
    shared: { seed: SEED, worker: index, onStickyChange: () => news++, ...(touchShareMs === undefined ? {} : { touchShareMs }) },
  });
  return { b, news: () => news };
}

const CLIENT_IP: AffinityPolicy = { type: 'ClientIP', timeoutSeconds: 10 };

describe('round-robin across workers', () => {
  it('every worker walks a set in the same order, whatever order the set came in', () => {
    const set = eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80', '10.0.0.4:80', '10.0.0.5:80');
    const a = worker(0).b;
    const b = worker(0).b;
    a.setEndpoints(set);
    b.setEndpoints([...set].reverse());
    expect(b.endpoints.map((e) => e.addr)).toEqual(a.endpoints.map((e) => e.addr));
  });

  it('N workers start at N different endpoints, and each is strict round-robin on its own', () => {
    const set = eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80', '10.0.0.4:80');
    const workers = [0, 1, 2, 3].map((i) => worker(i).b);
    for (const w of workers) w.setEndpoints(set);
    const firsts = workers.map((w) => w.nextEndpoint('', false)?.addr);
    expect(new Set(firsts).size).toBe(4);
    // Per worker: over 4k connections each endpoint gets exactly k.
    for (const w of workers) {
      const counts = new Map<string, number>();
      for (let i = 0; i < 40; i++) {
        const a = w.nextEndpoint('', false)?.addr as string;
        counts.set(a, (counts.get(a) ?? 0) + 1);
      }
      expect([...counts.values()]).toEqual([10, 10, 10, 10]);
    }
  });
});

describe('ClientIP affinity across workers', () => {
  it("a new client gets the same endpoint from every worker (its rendezvous pick)", () => {
    const set = eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80');
    const ws = [worker(0).b, worker(1).b, worker(2).b];
    for (const w of ws) {
      w.setAffinity(CLIENT_IP);
      w.setEndpoints(set);
    }
    for (let c = 1; c <= 50; c++) {
      const ip = `192.168.0.${c}`;
      const picks = new Set(ws.map((w) => w.nextEndpoint(ip, false)?.addr));
      expect(picks.size).toBe(1);
    }
  });

  it('a client keeps its endpoint on a worker that never saw it, after the endpoint set grew, once the first worker\'s entry is merged', () => {
    const two = eps('10.0.0.1:80', '10.0.0.2:80');
    const three = eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80');
    // A client whose rendezvous pick moves to the new endpoint.
    let ip = '';
    for (let c = 1; c < 255 && ip === ''; c++) {
      const candidate = `192.168.1.${c}`;
      if (rendezvousPick(candidate, three, SEED).addr === '10.0.0.3:80') ip = candidate;
    }
    expect(ip).not.toBe('');
    const a = worker(0);
    const b = worker(1);
    for (const w of [a.b, b.b]) {
      w.setAffinity(CLIENT_IP);
      w.setEndpoints(two);
    }
    const first = a.b.nextEndpoint(ip, false)?.addr;
    expect(a.news()).toBe(1);
    const updates = a.b.takeStickyUpdates();
    expect(updates).toMatchObject([{ clientIP: ip, addr: first }]);
    for (const w of [a.b, b.b]) w.setEndpoints(three);
    // Without the relay, worker b would pick the new endpoint for this client.
    const lone = worker(1).b;
    lone.setAffinity(CLIENT_IP);
    lone.setEndpoints(three);
    expect(lone.nextEndpoint(ip, false)?.addr).toBe('10.0.0.3:80');
    b.b.mergeSticky(updates);
    expect(b.b.nextEndpoint(ip, false)?.addr).toBe(first);
    expect(a.b.nextEndpoint(ip, false)?.addr).toBe(first);
  });

  it('between two choices for one client, the newer wins on both workers', () => {
    const set = eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80');
    const c = clock();
    const a = worker(0, c);
    const b = worker(1, c);
    for (const w of [a.b, b.b]) {
      w.setAffinity(CLIENT_IP);
      w.setEndpoints(set);
    }
    const ip = '192.168.2.7';
    const first = b.b.nextEndpoint(ip, false)?.addr;
    c.advance(5);
    // a's dial of the client's endpoint failed: a reset walks on down the client's ranking.
    a.b.nextEndpoint(ip, false);
    const moved = a.b.nextEndpoint(ip, true)?.addr;
    expect(moved).not.toBe(first);
    const fromA = a.b.takeStickyUpdates();
    const fromB = b.b.takeStickyUpdates();
    b.b.mergeSticky(fromA);
    a.b.mergeSticky(fromB);
    expect(a.b.nextEndpoint(ip, false)?.addr).toBe(moved);
    expect(b.b.nextEndpoint(ip, false)?.addr).toBe(moved);
  });

  it('successive resets walk every endpoint of the client\'s ranking', () => {
    const set = eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80', '10.0.0.4:80');
    const { b } = worker(0);
    b.setAffinity(CLIENT_IP);
    b.setEndpoints(set);
    const seen = [b.nextEndpoint('192.168.3.3', false)?.addr];
    for (let i = 0; i < 3; i++) seen.push(b.nextEndpoint('192.168.3.3', true)?.addr);
    expect(new Set(seen).size).toBe(4);
  });

  it('expiry is the node\'s: a client used on another worker stays sticky here', () => {
    const set = eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80');
    const c = clock();
    const a = worker(0, c);
    const b = worker(1, c);
    for (const w of [a.b, b.b]) {
      w.setAffinity(CLIENT_IP);
      w.setEndpoints(set);
    }
    const ip = '192.168.4.4';
    const first = a.b.nextEndpoint(ip, false)?.addr;
    b.b.mergeSticky(a.b.takeStickyUpdates());
    // The client keeps coming back through worker a only; a tells b at most once a second.
    for (let s = 0; s < 9; s++) {
      c.advance(1500);
      a.b.nextEndpoint(ip, false);
      b.b.mergeSticky(a.b.takeStickyUpdates());
    }
    b.b.cleanupStaleStickySessions();
    expect(b.b.stickyEntries().map((u) => u.clientIP)).toEqual([ip]);
    expect(b.b.nextEndpoint(ip, false)?.addr).toBe(first);
    // Then it stops coming: gone from both after the timeout (10 s).
    c.advance(10_001);
    a.b.cleanupStaleStickySessions();
    b.b.cleanupStaleStickySessions();
    expect(a.b.stickyEntries()).toEqual([]);
    expect(b.b.stickyEntries()).toEqual([]);
  });

  it('tells the siblings of an entry in use at most once per touchShareMs, and of a new one at once', () => {
    const c = clock();
    const a = worker(0, c, 1000);
    a.b.setAffinity(CLIENT_IP);
    a.b.setEndpoints(eps('10.0.0.1:80', '10.0.0.2:80'));
    a.b.nextEndpoint('192.168.5.5', false);
    expect(a.b.takeStickyUpdates()).toHaveLength(1);
    for (let i = 0; i < 10; i++) {
      c.advance(50);
      a.b.nextEndpoint('192.168.5.5', false);
    }
    expect(a.b.takeStickyUpdates()).toHaveLength(0);
    c.advance(600);
    a.b.nextEndpoint('192.168.5.5', false);
    const touched: StickyUpdate[] = a.b.takeStickyUpdates();
    expect(touched).toMatchObject([{ clientIP: '192.168.5.5', idleMs: 0 }]);
  });

  it('ignores entries for endpoints it does not have, and everything when affinity is off', () => {
    const { b } = worker(1);
    b.setAffinity(CLIENT_IP);
    b.setEndpoints(eps('10.0.0.1:80'));
    b.mergeSticky([{ clientIP: '192.168.6.6', addr: '10.0.0.9:80', idleMs: 0, assignedAgoMs: 0 }]);
    expect(b.stickyEntries()).toEqual([]);
    b.setAffinity({ type: 'None', timeoutSeconds: 0 });
    b.mergeSticky([{ clientIP: '192.168.6.6', addr: '10.0.0.1:80', idleMs: 0, assignedAgoMs: 0 }]);
    expect(b.stickyEntries()).toEqual([]);
  });
});

describe('rendezvous hashing', () => {
  it('adding an endpoint moves only the clients that rank it first', () => {
    const before = eps('10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80');
    const after = [...before, ep('10.0.0.4:80')];
    let moved = 0;
    for (let c = 0; c < 400; c++) {
      const ip = `172.16.${c >> 8}.${c & 255}`;
      const a = rendezvousPick(ip, before, SEED).addr;
      const b = rendezvousPick(ip, after, SEED).addr;
      if (a !== b) {
        moved++;
        expect(b).toBe('10.0.0.4:80');
      }
    }
    // About a quarter of the clients, not a reshuffle of all of them.
    expect(moved).toBeGreaterThan(50);
    expect(moved).toBeLessThan(160);
  });
});

describe('shared balancing: a set that keeps coming back', () => {
  it('spreads low-rate traffic over every endpoint when a pod\'s readiness flaps', () => {
    const eps = [1, 2, 3, 4, 5, 6].map((i) => toEndpoint({ ip: `10.2.0.${i}`, port: 80 }));
    const workers = [0, 1].map((worker) => new RoundRobinBalancer({ clock: { now: () => 0 }, random: () => 0.5, shared: { seed: 12345, worker, onStickyChange: () => undefined } }));
    const count = new Map<string, number>(eps.map((e) => [e.addr, 0]));
    // The sixth pod flaps: 5 and 6 endpoints in turn, one connection per worker in between.
    for (let phase = 0; phase < 1000; phase++) {
      for (const lb of workers) {
        lb.setEndpoints(phase % 2 === 0 ? eps.slice(0, 5) : eps);
        const got = lb.nextEndpoint('', false) as Endpoint;
        count.set(got.addr, (count.get(got.addr) ?? 0) + 1);
        lb.release(got);
      }
    }
    // 2,000 connections: each endpoint near its share (~366; the sixth ~183), none starved.
    for (const n of count.values()) expect(n).toBeGreaterThan(100);
  });
});

