import { describe, expect, it } from 'vitest';
import { Backoff } from '../src/core/backoff.js';

describe('capped exponential backoff with jitter', () => {
  it('doubles from the initial delay up to the cap, and starts over after a reset', () => {
    const b = new Backoff({ initialMs: 800, maxMs: 30_000, jitter: 0 }, Math.random);
    const delays = Array.from({ length: 8 }, () => b.next());
    expect(delays).toEqual([800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000]);
    expect(b.failures).toBe(8);
    b.reset();
    expect(b.failures).toBe(0);
    expect(b.next()).toBe(800);
  });

  it('takes away at most the jitter fraction, so delays stay within [base * (1 - jitter), base] and under the cap', () => {
    let r = 0;
    const randoms = [0, 0.5, 0.999999];
    const b = new Backoff({ initialMs: 1000, maxMs: 4000, jitter: 0.5 }, () => randoms[r++ % randoms.length] as number);
    const delays = Array.from({ length: 6 }, () => b.next());
    expect(delays).toEqual([1000, 1500, 2000, 4000, 3000, 2000]);
    for (const d of delays) expect(d).toBeLessThanOrEqual(4000);
  });

  it('spreads retries at the cap (a fleet does not retry in step)', () => {
    let x = 0.1;
    const b = new Backoff({ initialMs: 100, maxMs: 1000, jitter: 0.5 }, () => (x = (x + 0.37) % 1));
    const atCap = Array.from({ length: 20 }, () => b.next()).slice(10);
    expect(new Set(atCap).size).toBeGreaterThan(1);
    for (const d of atCap) {
      expect(d).toBeGreaterThanOrEqual(500);
      expect(d).toBeLessThanOrEqual(1000);
    }
  });

  it('refuses nonsense bounds', () => {
    expect(() => new Backoff({ initialMs: 0, maxMs: 10 }, Math.random)).toThrow(RangeError);
    expect(() => new Backoff({ initialMs: 100, maxMs: 10 }, Math.random)).toThrow(RangeError);
  });
});
