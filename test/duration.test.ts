import { describe, expect, it } from 'vitest';
import { formatDuration, parseDuration } from '../src/core/duration.js';

describe('Go-style durations', () => {
  it.each([
    ['250ms', 250],
    ['30s', 30_000],
    ['1m30s', 90_000],
    ['1h', 3_600_000],
    ['1.5s', 1500],
    ['0', 0],
    ['500us', 0.5],
    ['2h45m', 9_900_000],
    // Go's edges: a signed zero, a trailing point, a leading one, the longest Duration.
    ['+0', 0],
    ['-0', 0],
    ['+1s', 1000],
    ['1.s', 1000],
    ['.5s', 500],
    ['2562047h', 2562047 * 3_600_000],
  ])('parses %s', (text, ms) => {
    expect(parseDuration(text)).toBe(ms);
  });

  it.each(['', '10', '-1s', '1x', 's', '1m30', 'ms', '+', '-', '.s', '+-1s', '2562048h'])('rejects %j naming the value', (text) => {
    expect(() => parseDuration(text, 'udp-timeout')).toThrow(/udp-timeout: invalid duration/);
  });

  it.each([
    [250, '250ms'],
    [30_000, '30s'],
    [90_000, '1m30s'],
    [3_600_000, '1h0m0s'],
    [0, '0s'],
  ])('formats %d ms as %s, as Go does', (ms, text) => {
    expect(formatDuration(ms)).toBe(text);
    expect(parseDuration(text)).toBe(ms);
  });
});
