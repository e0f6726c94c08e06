import type { RandomSource } from '../clock.js';
import type { Endpoint } from '../model.js';

/**
 * Decisions that several worker processes must make alike without asking each other: the order
 * round-robin walks an endpoint set in, and a new ClientIP client's first endpoint. Each is a pure
 * function of the node's seed (the same in every worker, drawn afresh at every start, so nodes do
 * not all agree with one another) and of what is being decided.
 */

/** FNV-1a over a string's UTF-16 code units from `seed`, then murmur3's finalizer for avalanche. */
export function hash32(text: string, seed: number): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return mix32(h);
}

/** murmur3's fmix32: every input bit flips about half the output bits. */
export function mix32(x: number): number {
  let h = x >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** mulberry32: a small seeded generator, good enough to shuffle a list the same way twice. */
export function seededRandom(seed: number): RandomSource {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The random source that shuffles one endpoint set: the same for the same set (in any order) and
 * seed, whichever worker asks and whatever sets it saw before.
 */
export function orderRandom(endpoints: Iterable<Endpoint>, seed: number): RandomSource {
  const addrs = [...endpoints].map((e) => e.addr).sort();
  return seededRandom(hash32(addrs.join(','), seed));
}

/**
 * Rendezvous (highest random weight) hashing: the endpoint a client IP ranks first, or with
 * `after`, the one ranked next below `after` (wrapping to the first), so successive resets after
 * failed dials walk the client's ranking through every endpoint. Adding an endpoint moves only the
 * clients that rank it first; removing one moves only its own clients.
 * Precondition: `endpoints` is not empty.
 */
export function rendezvousPick(clientIP: string, endpoints: readonly Endpoint[], seed: number, after?: string): Endpoint {
  const clientSeed = hash32(clientIP, seed);
  let best: Endpoint | undefined;
  let bestScore = -1;
  let afterScore = Infinity;
  if (after !== undefined) {
    for (const ep of endpoints) {
      if (ep.addr === after) afterScore = score(ep, clientSeed);
    }
  }
  let top: Endpoint = endpoints[0] as Endpoint;
  let topScore = -1;
  for (const ep of endpoints) {
    const s = score(ep, clientSeed);
    if (s > topScore) {
      topScore = s;
      top = ep;
    }
    if (after !== undefined && afterScore !== Infinity && s < afterScore && s > bestScore) {
      bestScore = s;
      best = ep;
    }
  }
  return best ?? top;
}

/** An endpoint's weight for one client. Equal weights (one pair in 2^32) go to the first in list order, which the workers share. */
function score(ep: Endpoint, clientSeed: number): number {
  return hash32(ep.addr, clientSeed);
}
