import type { StickyUpdate } from '../core/balancer/load-balancer.js';

/** Sticky entries of one unit's balancer, as they travel between worker processes. */
export interface UnitStickyUpdates {
  unit: string;
  updates: StickyUpdate[];
}

/**
 * A unit set whose ClientIP affinity is shared with sibling worker processes (`--workers`):
 * entries made, moved or used here go out through takeStickyUpdates(); the siblings' come in
 * through mergeSticky().
 */
export interface AffinityShare {
  /** What changed since the last call, per unit. */
  takeStickyUpdates(): UnitStickyUpdates[];
  mergeSticky(batches: readonly UnitStickyUpdates[]): void;
  /** Every live entry: what a new sibling starts from. */
  stickyEntries(): UnitStickyUpdates[];
}
