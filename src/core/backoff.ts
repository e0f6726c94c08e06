import type { RandomSource } from './clock.js';

/**
 * Capped exponential backoff with jitter, for re-listing and re-watching after API errors
 * (client-go's reflector backs off from 800 ms, doubling, to a cap of 30 s).
 *
 * Jitter takes away up to `jitter` of each delay ("equal jitter"): delays fall in
 * [base * (1 - jitter), base] and never exceed the cap. A fleet of proxies that lost the same
 * API server therefore spreads its retries even after all of them have reached the cap, which a
 * jitter added on top of a capped base would not do once clamped.
 */
export interface BackoffOptions {
  initialMs: number;
  maxMs: number;
  /** Growth per failure; default 2. */
  factor?: number;
  /** Fraction of each delay that is random, 0..1; default 0.5. */
  jitter?: number;
}

export const DEFAULT_BACKOFF: Required<BackoffOptions> = { initialMs: 800, maxMs: 30_000, factor: 2, jitter: 0.5 };

export class Backoff {
  private readonly opts: Required<BackoffOptions>;
  private base: number;
  private count = 0;

  constructor(opts: Partial<BackoffOptions>, private readonly random: RandomSource) {
    this.opts = { ...DEFAULT_BACKOFF, ...opts };
    if (!(this.opts.initialMs > 0) || !(this.opts.maxMs >= this.opts.initialMs)) {
      throw new RangeError(`backoff: need 0 < initialMs <= maxMs, got ${this.opts.initialMs} and ${this.opts.maxMs}`);
    }
    this.base = this.opts.initialMs;
  }

  /** Failures since the last reset. */
  get failures(): number {
    return this.count;
  }

  /** The delay before the next attempt; each call counts one more failure. */
  next(): number {
    const base = this.base;
    this.count++;
    this.base = Math.min(this.opts.maxMs, base * this.opts.factor);
    const jitter = Math.min(1, Math.max(0, this.opts.jitter));
    return Math.round(base * (1 - jitter * this.random()));
  }

  /** An attempt succeeded: the next failure starts from the initial delay again. */
  reset(): void {
    this.base = this.opts.initialMs;
    this.count = 0;
  }
}
