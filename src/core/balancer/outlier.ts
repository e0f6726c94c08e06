/**
 * Passive health: Envoy's outlier detection, fed by what connections see rather than by probes.
 * An endpoint whose dials fail several times in a row (refused, timed out, reset before any byte)
 * is set aside for a while, twice as long each time it is set aside again, up to a cap, and taken
 * back when that time is up. Where Envoy counts 5xx answers this counts connect failures: a
 * proxy of bytes sees no status codes. The names follow Envoy's OutlierDetection fields.
 */
export interface OutlierPolicy {
  /** Failed dials in a row that set an endpoint aside (Envoy's consecutive_5xx); 0 turns passive health off. */
  consecutiveFailures: number;
  /** How long the first setting aside lasts (base_ejection_time). */
  baseEjectionMs: number;
  /** The longest a setting aside lasts, however often it repeats (max_ejection_time). */
  maxEjectionMs: number;
  /**
   * At most this share of a port's endpoints set aside at once (max_ejection_percent), and always
   * at least one, as Envoy does. When every endpoint is set aside all are used all the same.
   */
  maxEjectionPercent: number;
}

/**
 * Envoy's defaults, but for the share: connect failures are this node's own view of an endpoint,
 * not an answer a bad deploy could make every endpoint give, and a port whose endpoints are all set
 * aside uses them all anyway, so no share can empty a Service.
 */
export const DEFAULT_OUTLIER_POLICY: Readonly<OutlierPolicy> = Object.freeze({
  consecutiveFailures: 5,
  baseEjectionMs: 30_000,
  maxEjectionMs: 300_000,
  maxEjectionPercent: 100,
});

/** What passive health keeps per endpoint. Times are the balancer clock's milliseconds. */
export interface OutlierState {
  consecutiveFailures: number;
  /** Set aside until then; 0 when in use. */
  ejectedUntil: number;
  /** How many times in a row it has been set aside: the doubling's exponent. */
  ejections: number;
  /** When it was last taken back (or -Infinity): a long healthy stretch forgets past ejections. */
  returnedAt: number;
}

export function freshOutlierState(): OutlierState {
  return { consecutiveFailures: 0, ejectedUntil: 0, ejections: 0, returnedAt: -Infinity };
}

/**
 * How long the next setting aside lasts: base, doubled per earlier one, up to the cap. An endpoint
 * that stayed in use for a whole max-ejection-time since it was last taken back starts from base
 * again (Envoy lowers its multiplier while a host stays healthy; this is that, without a timer).
 */
export function nextEjectionMs(policy: OutlierPolicy, state: OutlierState, now: number): { ms: number; ejections: number } {
  const ejections = now - state.returnedAt > policy.maxEjectionMs ? 1 : state.ejections + 1;
  const ms = Math.min(policy.maxEjectionMs, policy.baseEjectionMs * 2 ** Math.min(ejections - 1, 30));
  return { ms, ejections };
}

/** How many of `endpoints` may be set aside at once: the share, rounded down, and at least one. */
export function maxEjected(policy: OutlierPolicy, endpoints: number): number {
  return Math.max(1, Math.floor((endpoints * policy.maxEjectionPercent) / 100));
}
