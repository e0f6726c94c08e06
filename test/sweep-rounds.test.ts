import { describe, expect, it } from 'vitest';
import { SweepRounds, type Seen } from '../src/core/sweep-rounds.js';

describe('SweepRounds', () => {
  it('keeps what a round saw or made, drops the rest (telling of each), and tells a second sighting', () => {
    const rounds = new SweepRounds();
    const entries = new Map<string, Seen & { name: string }>();
    rounds.begin();
    for (const name of ['a', 'b', 'c']) entries.set(name, { name, seen: rounds.fresh() });
    rounds.sweep(entries, () => expect.unreachable('a round that made every entry drops none'));
    expect([...entries.keys()]).toEqual(['a', 'b', 'c']);

    rounds.begin();
    expect(rounds.mark(entries.get('a') as Seen)).toBe(true);
    expect(rounds.mark(entries.get('a') as Seen)).toBe(false); // the same key twice in one round
    entries.set('d', { name: 'd', seen: rounds.fresh() });
    const dropped: string[] = [];
    rounds.sweep(entries, (e) => dropped.push(e.name));
    expect(dropped.sort()).toEqual(['b', 'c']);
    expect([...entries.keys()].sort()).toEqual(['a', 'd']);

    // Entries from before any round (seen 0, e.g. read from a dump) go at the first sweep that misses them.
    const fromDump = new Map<string, Seen>([['x', { seen: 0 }]]);
    rounds.begin();
    rounds.sweep(fromDump);
    expect(fromDump.size).toBe(0);
  });
});
