/**
 * Mark and sweep over a map of entries kept from one sync to the next: each entry remembers the
 * round that last saw it, and a round drops the entries it did not see. A round costs what it
 * touched; the pass over the whole map that finds the unseen ones runs only when some entry was
 * not seen (at 10,000 Services, a sync that changed nothing touches every unit and drops none).
 * Pure; the keepers of per-unit state across syncs share it (the iptables portal's proxy ports,
 * its incremental render, the family book).
 */

export interface Seen {
  /** The round that last saw the entry (0: none yet). */
  seen: number;
}

export class SweepRounds {
  private round = 0;
  /** Entries seen in this round, each once: made in it, or marked. */
  private marked = 0;

  /** Starts a round. */
  begin(): void {
    this.round++;
    this.marked = 0;
  }

  /** The round for an entry made in it (counted as seen). */
  fresh(): number {
    this.marked++;
    return this.round;
  }

  /** Marks an entry seen in this round: false when this round has seen it already. */
  mark(entry: Seen): boolean {
    if (entry.seen === this.round) return false;
    entry.seen = this.round;
    this.marked++;
    return true;
  }

  /** Drops from `entries` what this round did not see, telling `dropped` of each first. */
  sweep<K, E extends Seen>(entries: Map<K, E>, dropped?: (entry: E) => void): void {
    if (this.marked === entries.size) return;
    for (const [key, entry] of entries) {
      if (entry.seen === this.round) continue;
      dropped?.(entry);
      entries.delete(key);
    }
  }
}
