/**
 * Lets one event through per interval and counts the ones it held back. For log lines that a
 * flood (descriptor exhaustion, session reclaim under load) could otherwise repeat thousands of
 * times a second.
 */
export class RateLimiter {
  private last = -Infinity;
  private held = 0;

  constructor(
    private readonly intervalMs: number,
    private readonly now: () => number,
  ) {}

  /** Undefined when this event is held back; otherwise how many were held back since the last one let through. */
  take(): number | undefined {
    const t = this.now();
    if (t - this.last < this.intervalMs) {
      this.held++;
      return undefined;
    }
    this.last = t;
    const held = this.held;
    this.held = 0;
    return held;
  }
}
