/**
 * Upstream's BoundedFrequencyRunner (k8s.io/kubernetes/pkg/util/async): `run()` asks for a run;
 * runs happen at most once per `minIntervalMs` (bursts of requests merge into one) and at least
 * once per `maxIntervalMs` even when nobody asks. One run at a time; a request during a run
 * schedules another after it.
 */
export interface RunnerTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  now(): number;
}

/** The real timers, unref'd: the one place proxier/ reaches for the global ones (lint allows no other). */
export const realTimers: RunnerTimers = {
  setTimeout: (fn, ms) => {
    // eslint-disable-next-line no-restricted-globals -- the default the loop's parts are given
    const t = setTimeout(fn, ms);
    t.unref();
    return t;
  },
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
  now: () => performance.now(),
};

export class BoundedFrequencyRunner {
  /**
   * -Infinity: the first run after start is not held back by the minimum interval. Upstream's is
   * not either: its rate limiter is a token bucket that starts full (burstRuns tokens).
   */
  private lastRun = -Infinity;
  private lastPeriodicRun = -Infinity;
  private timer: unknown;
  private timerDue = Infinity;
  private running: Promise<void> | undefined;
  private pending = false;
  /** When a retry asked for during a run is due (Infinity: none). */
  private retryDue = Infinity;
  private stopped = true;

  constructor(
    private readonly fn: (periodic: boolean) => Promise<void>,
    private readonly minIntervalMs: number,
    private readonly maxIntervalMs: number,
    private readonly timers: RunnerTimers = realTimers,
  ) {}

  start(): void {
    this.stopped = false;
    this.lastPeriodicRun = this.timers.now();
    this.schedule(this.maxIntervalMs, true);
  }

  stop(): void {
    this.stopped = true;
    this.clear();
  }

  /** Ask for a run as soon as the minimum interval allows. */
  run(): void {
    if (this.stopped) return;
    if (this.running) {
      this.pending = true;
      return;
    }
    const wait = Math.max(0, this.lastRun + this.minIntervalMs - this.timers.now());
    this.schedule(wait, false);
  }

  /**
   * Ask for a run in `ms` at the latest (upstream RetryAfter): after a run that failed. A request
   * that comes sooner is served sooner, as usual.
   */
  retryAfter(ms: number): void {
    if (this.stopped) return;
    if (this.running) {
      this.retryDue = Math.min(this.retryDue, this.timers.now() + ms);
      return;
    }
    this.schedule(Math.max(ms, this.lastRun + this.minIntervalMs - this.timers.now()), false);
  }

  /** Resolves when the current run, if any, has finished. */
  async idle(): Promise<void> {
    while (this.running) await this.running;
  }

  private schedule(ms: number, periodic: boolean): void {
    const due = this.timers.now() + ms;
    if (this.timer !== undefined && due >= this.timerDue) return;
    this.clear();
    this.timerDue = due;
    this.timer = this.timers.setTimeout(() => {
      this.timer = undefined;
      this.timerDue = Infinity;
      void this.execute(periodic);
    }, ms);
  }

  private clear(): void {
    if (this.timer !== undefined) this.timers.clearTimeout(this.timer);
    this.timer = undefined;
    this.timerDue = Infinity;
  }

  private async execute(periodic: boolean): Promise<void> {
    if (this.stopped) return;
    this.clear();
    this.lastRun = this.timers.now();
    this.pending = false;
    // A request that arrived before the periodic timer replaced it: the run it gets is the periodic
    // one when that is due, or changes arriving more often than maxInterval would starve it.
    const isPeriodic = periodic || this.lastRun - this.lastPeriodicRun >= this.maxIntervalMs;
    if (isPeriodic) this.lastPeriodicRun = this.lastRun;
    this.running = this.fn(isPeriodic).finally(() => {
      this.running = undefined;
    });
    await this.running;
    if (this.stopped) return;
    const retryDue = this.retryDue;
    this.retryDue = Infinity;
    if (this.pending) this.run();
    else this.schedule(Math.max(0, this.lastPeriodicRun + this.maxIntervalMs - this.timers.now()), true);
    if (retryDue !== Infinity) this.schedule(Math.max(0, retryDue - this.timers.now(), this.lastRun + this.minIntervalMs - this.timers.now()), false);
  }
}
