import { describe, expect, it } from 'vitest';
import { BoundedFrequencyRunner, type RunnerTimers } from '../src/proxier/runner.js';

/** Manual timers: time moves only when the test says so. */
class FakeTimers implements RunnerTimers {
  t = 0;
  private seq = 0;
  private readonly timers = new Map<number, { due: number; fn: () => void }>();
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this.seq;
    this.timers.set(id, { due: this.t + ms, fn });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers.delete(h as number);
  }
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      const next = [...this.timers.entries()].sort((x, y) => x[1].due - y[1].due)[0];
      if (!next || next[1].due > end) break;
      this.timers.delete(next[0]);
      this.t = next[1].due;
      next[1].fn();
      await new Promise((r) => setImmediate(r));
    }
    this.t = end;
  }
}

describe('BoundedFrequencyRunner', () => {
  it('merges a burst into one run and keeps runs at least minInterval apart', async () => {
    const timers = new FakeTimers();
    const runs: Array<[number, boolean]> = [];
    const r = new BoundedFrequencyRunner(async (periodic) => void runs.push([timers.now(), periodic]), 1000, 30_000, timers);
    r.start();
    r.run();
    r.run();
    await timers.advance(0);
    expect(runs).toEqual([[0, false]]);
    r.run();
    r.run();
    r.run();
    await timers.advance(999);
    expect(runs).toHaveLength(1);
    await timers.advance(1);
    expect(runs).toEqual([[0, false], [1000, false]]);
  });

  it('runs at least once per maxInterval without being asked', async () => {
    const timers = new FakeTimers();
    const runs: Array<[number, boolean]> = [];
    const r = new BoundedFrequencyRunner(async (periodic) => void runs.push([timers.now(), periodic]), 1000, 30_000, timers);
    r.start();
    await timers.advance(65_000);
    expect(runs).toEqual([[30_000, true], [60_000, true]]);
    r.stop();
    await timers.advance(60_000);
    expect(runs).toHaveLength(2);
  });

  it('runs again after a run when asked during it', async () => {
    const timers = new FakeTimers();
    let release: () => void = () => {};
    let count = 0;
    const r = new BoundedFrequencyRunner(async () => {
      count++;
      if (count === 1) await new Promise<void>((res) => { release = res; });
    }, 10, 30_000, timers);
    r.start();
    r.run();
    await timers.advance(0);
    r.run();
    release();
    await r.idle();
    await timers.advance(10);
    expect(count).toBe(2);
  });

  it('still runs the periodic sync when changes keep arriving more often than maxInterval', async () => {
    const timers = new FakeTimers();
    const periodic: number[] = [];
    const r = new BoundedFrequencyRunner(async (p) => void (p && periodic.push(timers.now())), 1000, 30_000, timers);
    r.start();
    // A change every 20 s for 10 minutes: each would pre-empt the 30 s periodic timer.
    for (let t = 0; t < 600_000; t += 20_000) {
      r.run();
      await timers.advance(20_000);
    }
    r.stop();
    expect(periodic.length).toBeGreaterThanOrEqual(15);
    const gaps = periodic.slice(1).map((t, k) => t - (periodic[k] as number));
    expect(Math.max(...gaps)).toBeLessThanOrEqual(40_000);
  });
});
