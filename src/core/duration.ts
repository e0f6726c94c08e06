import { UsageError } from './errors.js';

/**
 * Go's time.ParseDuration, as kube-proxy's flags and config accept it: `250ms`, `30s`, `1m30s`,
 * `1.5h`, `0`. Returns milliseconds. Negative durations are refused (no flag of ours means one);
 * surrounding blanks are forgiven, where Go would refuse them.
 */
const UNIT_MS: Record<string, number> = {
  ns: 1e-6,
  us: 1e-3,
  'µs': 1e-3,
  'μs': 1e-3,
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
};

const PART = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)/y;

/** Go's longest Duration (2^63-1 ns, about 2,562,047 h): longer text is invalid there, and here. */
const GO_MAX_MS = Number(2n ** 63n - 1n) / 1e6;

export function parseDuration(text: string, what = 'duration'): number {
  const invalid = (): UsageError => new UsageError(`${what}: invalid duration "${text}" (expected a Go duration such as 250ms, 30s or 1m30s)`);
  const s = text.trim();
  // One sign, then Go's special case: a bare 0 (so +0 and -0 too) needs no unit.
  const negative = s.startsWith('-');
  const rest = negative || s.startsWith('+') ? s.slice(1) : s;
  if (rest === '0') return 0;
  if (rest === '' || negative) throw invalid();
  let total = 0;
  let pos = 0;
  while (pos < rest.length) {
    PART.lastIndex = pos;
    const m = PART.exec(rest);
    if (!m) throw invalid();
    total += Number(m[1]) * (UNIT_MS[m[2] as string] as number);
    pos = PART.lastIndex;
  }
  if (total > GO_MAX_MS) throw invalid();
  return total;
}

/** Formats milliseconds the way Go's Duration.String does: `250ms`, `30s`, `1m30s`, `1h0m0s`. */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  if (ms < 1000) {
    return `${trimFloat(ms)}ms`;
  }
  let seconds = ms / 1000;
  const h = Math.floor(seconds / 3600);
  seconds -= h * 3600;
  const m = Math.floor(seconds / 60);
  seconds -= m * 60;
  const sec = `${trimFloat(Math.round(seconds * 1e9) / 1e9)}s`;
  if (h > 0) return `${h}h${m}m${sec}`;
  if (m > 0) return `${m}m${sec}`;
  return sec;
}

function trimFloat(n: number): string {
  return Number.isInteger(n) ? String(n) : String(Number(n.toFixed(9)));
}
