import { isOwnChain } from './chains.js';
import { splitWords, type SavedTables } from './iptables-save.js';

/**
 * The proxy port each unit had in the run whose rules are still installed, read back from an
 * iptables-save dump (render-iptables.ts writes the unit's id as each rule's comment). A restart
 * that binds the same ports again keeps the conntrack entries of ongoing flows valid: a UDP client
 * sending steadily keeps its entry alive, and the entry keeps pointing at the port it was NATed to
 * when it was created.
 */

function valueAfter(words: readonly string[], option: string): string | undefined {
  const i = words.indexOf(option);
  return i >= 0 ? words[i + 1] : undefined;
}

function portNumber(text: string | undefined): number | undefined {
  if (text === undefined || !/^\d{1,5}$/.test(text)) return undefined;
  const port = Number(text);
  return port >= 1 && port <= 65535 ? port : undefined;
}

/** `REDIRECT --to-ports N`, or `DNAT --to-destination ADDR:N` / `[ADDR]:N`. */
function natPort(words: readonly string[]): number | undefined {
  const ports = valueAfter(words, '--to-ports');
  if (ports !== undefined) return portNumber(ports);
  const dest = valueAfter(words, '--to-destination');
  const m = dest === undefined ? null : /:(\d+)$/.exec(dest);
  return portNumber(m?.[1]);
}

/**
 * Unit id -> proxy port, from the rules of our nat chains (the roots, where an earlier version
 * wrote every rule, and the trees below them; IPv4 or IPv6 dump alike). The first port seen for an
 * id wins: the rules of one run agree. Only NAT rules count: a unit that had none (its portals
 * could not be programmed) has no flows whose conntrack entries a port of its own would keep.
 */
export function previousProxyPorts(saved: SavedTables, into: Map<string, number> = new Map()): Map<string, number> {
  for (const r of saved.get('nat')?.rules ?? []) {
    if (!isOwnChain('nat', r.chain) || !r.spec.includes('--comment')) continue;
    const words = splitWords(r.spec);
    const comment = valueAfter(words, '--comment');
    const port = natPort(words);
    if (comment !== undefined && port !== undefined && !into.has(comment)) into.set(comment, port);
  }
  return into;
}
