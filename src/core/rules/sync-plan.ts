import type { TableChains } from './chains.js';
import type { JumpPlan } from './iptables-save.js';

/**
 * One iptables-restore `--noflush` transaction that takes our chains from what the node holds
 * (`current`: what the last sync wrote, or what a dump shows) to `desired`, and applies the jump
 * fixes of a dump. Pure.
 *
 * Only chains whose rules differ are written: declaring a chain (`:NAME - [0:0]`) creates it or
 * empties it, and its rules follow, so each written chain is replaced whole and nothing can
 * double. Chains no longer wanted are emptied and deleted last, once their parents (written in
 * the same transaction) no longer jump to them; declaring them first makes the deletion work
 * whether or not they still exist. No other chain is touched. Returns '' when there is nothing
 * to do.
 *
 * The trees of dispatch-tree.ts keep these transactions small: adding a Service changes its
 * leaf chain in each tree it appears in, and a parent's list of jumps only when a leaf appears or
 * goes. And the plan costs what changed when `current` is the previous render of an
 * IncrementalRender (incremental-render.ts): a chain it did not render again is the same array,
 * passed over without comparing its rules. Against a dump, every rule is compared.
 */
export function planSync(desired: TableChains, current: TableChains, jumps: JumpPlan): string {
  // Pieces, joined once: at 10,000 Services a full write is megabytes, and a string per line
  // (each then copied again into the whole) cost more than the rest of the plan.
  const out: string[] = [];
  for (const table of ['nat', 'filter'] as const) {
    const now = current[table];
    const changed = [...desired[table]].filter(([chain, rules]) => !sameRules(rules, now.get(chain)));
    const removed = [...now.keys()].filter((chain) => !desired[table].has(chain));
    if (changed.length === 0 && removed.length === 0 && jumps[table].length === 0) continue;
    out.push('*', table, '\n');
    for (const [chain] of changed) out.push(':', chain, ' - [0:0]\n');
    for (const chain of removed) out.push(':', chain, ' - [0:0]\n');
    for (const jump of jumps[table]) out.push(jump, '\n');
    for (const [chain, rules] of changed) {
      const append = `-A ${chain} `;
      for (const rule of rules) out.push(append, rule, '\n');
    }
    for (const chain of removed) out.push('-X ', chain, '\n');
    out.push('COMMIT\n');
  }
  return out.join('');
}

export function sameRules(a: readonly string[], b: readonly string[] | undefined): boolean {
  // The incremental render hands back the very array of a chain that did not change.
  if (a === b) return true;
  if (b === undefined || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
