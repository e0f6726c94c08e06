import { JUMPS, OWN_CHAINS, emptyChains, isOwnChain, type Jump, type Table, type TableChains } from './chains.js';

/**
 * Reading `iptables-save` output and planning edits from it, pure. The plans only ever delete
 * rules and chains that the dump shows, so a transaction built from a fresh dump does not fail on
 * "no such rule"; anything that changed in between fails the whole transaction, which the caller
 * retries after a new dump.
 */

export interface SavedRule {
  chain: string;
  /** Everything after `-A <chain> `, exactly as saved: valid as the spec of a `-D <chain>` line. */
  spec: string;
  /** The `-j`/`-g` target, if any. */
  target?: string;
}

export interface SavedTable {
  chains: Set<string>;
  rules: SavedRule[];
}

export type SavedTables = Map<string, SavedTable>;

/** Splits one saved rule into words the way iptables-restore does: double quotes group, `\` escapes. */
export function splitWords(line: string): string[] {
  const words: string[] = [];
  let word = '';
  let inWord = false;
  let quoted = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i] as string;
    if (c === '\\' && i + 1 < line.length) {
      word += line[++i];
      inWord = true;
    } else if (c === '"') {
      quoted = !quoted;
      inWord = true;
    } else if (!quoted && (c === ' ' || c === '\t')) {
      if (inWord) words.push(word);
      word = '';
      inWord = false;
    } else {
      word += c;
      inWord = true;
    }
  }
  if (inWord) words.push(word);
  return words;
}

function targetOf(words: readonly string[]): string | undefined {
  for (let i = 0; i < words.length - 1; i++) {
    if (words[i] === '-j' || words[i] === '-g') return words[i + 1];
  }
  return undefined;
}

/**
 * The target of a saved rule. A dump holds a rule per Service and more, so the common case is
 * read without splitting the line into words: without a backslash, quotes are plain pairs, and
 * whatever follows the last one is outside them.
 */
function ruleTarget(spec: string): string | undefined {
  if (spec.includes('\\')) return targetOf(splitWords(spec));
  const quote = spec.lastIndexOf('"');
  const found = / -[jg] (\S+)/.exec(` ${spec.slice(quote + 1)}`)?.[1];
  // A target with quoted options of its own (`-j LOG --log-prefix "..."`) comes before the last quote.
  return found !== undefined || quote < 0 ? found : targetOf(splitWords(spec));
}

export function parseIptablesSave(text: string): SavedTables {
  const tables: SavedTables = new Map();
  let current: SavedTable | undefined;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line.startsWith('*')) {
      current = { chains: new Set(), rules: [] };
      tables.set(line.slice(1), current);
    } else if (!current || line === '' || line.startsWith('#') || line === 'COMMIT') {
      continue;
    } else if (line.startsWith(':')) {
      const name = line.slice(1).split(' ')[0];
      if (name) current.chains.add(name);
    } else if (line.startsWith('-A ')) {
      const chain = line.slice(3).split(' ')[0] ?? '';
      const spec = line.slice(3 + chain.length + 1);
      const rule: SavedRule = { chain, spec };
      const target = ruleTarget(spec);
      if (target !== undefined) rule.target = target;
      current.rules.push(rule);
    }
  }
  return tables;
}

/** Edits (`-I`, `-A`, `-D` lines) per table that leave exactly one jump of each of ours in place. */
export type JumpPlan = Record<Table, string[]>;

export function jumpLine(j: Jump, op: '-I' | '-A'): string {
  return op === '-I' ? `-I ${j.from} 1 ${j.matches} -j ${j.to}` : `-A ${j.from} ${j.matches} -j ${j.to}`;
}

/**
 * Compares the dump with JUMPS: a missing jump is added (top or bottom), duplicates, jumps whose
 * matches differ from ours (an earlier version's) and jumps into any chain of ours from anywhere
 * else are deleted. A jump present once, as we write it, is left where it is, even if someone
 * inserted rules above it: moving it every period would fight whoever did.
 */
export function planJumps(saved: SavedTables): JumpPlan {
  const plan: JumpPlan = { nat: [], filter: [] };
  for (const table of ['nat', 'filter'] as const) {
    const rules = saved.get(table)?.rules ?? [];
    const wanted = JUMPS.filter((j) => j.table === table);
    const seen = new Set<Jump>();
    const deletes: string[] = [];
    const inserts: string[] = [];
    const appends: string[] = [];
    for (const r of rules) {
      if (r.target === undefined || !isOwnChain(table, r.target) || isOwnChain(table, r.chain)) continue;
      const j = wanted.find((w) => w.from === r.chain && w.to === r.target && r.spec === `${w.matches} -j ${w.to}`);
      if (j && !seen.has(j)) seen.add(j);
      else deletes.push(`-D ${r.chain} ${r.spec}`);
    }
    for (const j of wanted) {
      if (seen.has(j)) continue;
      if (j.position === 'top') inserts.unshift(jumpLine(j, '-I'));
      else appends.push(jumpLine(j, '-A'));
    }
    plan[table] = [...deletes, ...inserts, ...appends];
  }
  return plan;
}

/** The jumps a fresh install adds: what planJumps answers for an empty dump. */
export function freshJumps(): JumpPlan {
  return planJumps(new Map());
}

/**
 * An iptables-restore payload removing every trace of ours the dump shows (jumps first, then our
 * chains, the trees below the roots included, flushed before deleted), or '' when there is
 * nothing to remove.
 */
export function planRemoval(saved: SavedTables): string {
  const out: string[] = [];
  for (const table of ['nat', 'filter'] as const) {
    const t = saved.get(table);
    if (!t) continue;
    const lines: string[] = [];
    for (const r of t.rules) {
      if (r.target !== undefined && isOwnChain(table, r.target) && !isOwnChain(table, r.chain)) lines.push(`-D ${r.chain} ${r.spec}`);
    }
    const present = [...OWN_CHAINS[table].filter((c) => t.chains.has(c)), ...[...t.chains].filter((c) => !OWN_CHAINS[table].includes(c) && isOwnChain(table, c)).sort()];
    for (const c of present) lines.push(`-F ${c}`);
    for (const c of present) lines.push(`-X ${c}`);
    if (lines.length > 0) out.push(`*${table}`, ...lines, 'COMMIT');
  }
  return out.length > 0 ? `${out.join('\n')}\n` : '';
}

/** Our chains as the dump shows them: each with its rules, in order (empty maps when none are there). */
export function chainsInDump(saved: SavedTables): TableChains {
  const out = emptyChains();
  for (const table of ['nat', 'filter'] as const) {
    const t = saved.get(table);
    if (!t) continue;
    for (const c of t.chains) if (isOwnChain(table, c)) out[table].set(c, []);
    for (const r of t.rules) out[table].get(r.chain)?.push(r.spec);
  }
  return out;
}

/** Whether the dump holds anything of ours: a chain, or a jump into one. */
export function hasOurs(saved: SavedTables): boolean {
  return planRemoval(saved) !== '';
}
