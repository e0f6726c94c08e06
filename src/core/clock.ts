/** The clock and random source the core is given; tests pass fakes (STYLE habit 2). */
export interface Clock {
  /** Milliseconds, monotonic enough for timeouts. A function property: it is passed around unbound. */
  now: () => number;
}

export type RandomSource = () => number;

export const systemClock: Clock = { now: () => performance.now() };
