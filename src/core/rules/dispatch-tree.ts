import type { IPFamily } from '../address.js';
import type { Protocol } from '../model.js';
import type { ChainRules } from './chains.js';

/**
 * Trees of chains that put each rule a few comparisons away from the root, instead of one rule per
 * Service in one chain that every new connection on the node is compared with in turn (netfilter
 * has no lookup tables for iptables rules; nftables has, see docs/portals.md).
 *
 * A tree is a root chain, a level of chains below it, and leaf chains holding the rules; each
 * level splits its traffic by a fixed part of the destination, so where a rule goes depends on the
 * rule alone, and adding or removing one rewrites its leaf (and its parents' lists only when a
 * leaf appears or goes): a sync writes a few small chains, not the whole table.
 *
 * - By portal address (ClusterIPs, externalIPs, load-balancer IPs): the last byte of the address,
 *   which the API server's random allocation spreads evenly. The root has one rule per low nibble
 *   (`-d 0.0.0.5/0.0.0.15`), the level below one per last byte (`-d 0.0.0.165/0.0.0.255`); a new
 *   connection meets at most 16 + 16 rules before its leaf, which holds 1/256 of the portals.
 * - By destination port (node ports, proxy ports): the root has one rule per protocol and block of
 *   1,024 ports in use (`-p tcp -m tcp --dport 30720:31743`), then, with two levels, one per block
 *   of 64 in use; a leaf holds the rules of at most 64 ports.
 *
 * Pure: entries in, chains out (`Map` of chain name to its rules as iptables-save prints them,
 * without `-A <chain> `), the root first and always present, the rest in a fixed order: depth
 * first, siblings in ascending order of what they match.
 *
 * addressPath and portPath say the same one leaf at a time, for a caller that keeps the trees
 * from one sync to the next and rewrites only the leaves that changed (incremental-render.ts).
 */

export interface AddressEntry {
  /** The last byte of the rule's destination address. */
  lastByte: number;
  spec: string;
}

export interface PortEntry {
  protocol: Protocol;
  port: number;
  spec: string;
}

function hex(value: number, digits: number): string {
  return value.toString(16).padStart(digits, '0');
}

/** `-d` matching addresses whose last byte, masked with `mask`, is `value`. */
function lastByteMatch(family: IPFamily, value: number, mask: number): string {
  return family === 4 ? `-d 0.0.0.${value}/0.0.0.${mask}` : `-d ::${value === 0 ? '' : value.toString(16)}/::${mask.toString(16)}`;
}

/** Appends `line` to `chain` in `out`, creating the chain where it is first used. */
function push(out: ChainRules, chain: string, line: string): void {
  const rules = out.get(chain);
  if (rules) rules.push(line);
  else out.set(chain, [line]);
}

/** Groups entries by a numeric key, keys ascending, entries in their given order. */
function groupBy<T>(entries: readonly T[], key: (e: T) => number): Array<[number, T[]]> {
  const groups = new Map<number, T[]>();
  for (const e of entries) {
    const k = key(e);
    const g = groups.get(k);
    if (g) g.push(e);
    else groups.set(k, [e]);
  }
  return [...groups.entries()].sort((a, b) => a[0] - b[0]);
}

/**
 * One chain on the way from a root down to a leaf: its name, the rule of its parent that jumps to
 * it, and where that rule sits among its siblings (ascending).
 */
export interface TreeStep {
  chain: string;
  jump: string;
  order: number;
}

/** The chains below the root an address tree files `lastByte` under, the leaf last (as addressTree does). */
export function addressPath(prefix: string, family: IPFamily, lastByte: number): TreeStep[] {
  const nibble = lastByte & 0x0f;
  const middle = `${prefix}${hex(nibble, 1)}`;
  const leaf = `${prefix}${hex(lastByte, 2)}`;
  return [
    { chain: middle, jump: `${lastByteMatch(family, nibble, 0x0f)} -j ${middle}`, order: nibble },
    { chain: leaf, jump: `${lastByteMatch(family, lastByte, 0xff)} -j ${leaf}`, order: lastByte },
  ];
}

/** The leaf of an address tree `lastByte` is filed under (the last step of addressPath). */
export function addressLeaf(prefix: string, lastByte: number): string {
  return `${prefix}${hex(lastByte, 2)}`;
}

/** Leaf `<prefix><last byte, 2 hex digits>` below `<prefix><low nibble, 1 hex digit>` below `root`. */
export function addressTree(root: string, prefix: string, family: IPFamily, entries: readonly AddressEntry[]): ChainRules {
  const out: ChainRules = new Map([[root, []]]);
  for (const [nibble, inNibble] of groupBy(entries, (e) => e.lastByte & 0x0f)) {
    const middle = `${prefix}${hex(nibble, 1)}`;
    push(out, root, `${lastByteMatch(family, nibble, 0x0f)} -j ${middle}`);
    for (const [byte, inByte] of groupBy(inNibble, (e) => e.lastByte)) {
      const leaf = `${prefix}${hex(byte, 2)}`;
      push(out, middle, `${lastByteMatch(family, byte, 0xff)} -j ${leaf}`);
      for (const e of inByte) push(out, leaf, e.spec);
    }
  }
  return out;
}

const PROTOCOLS: readonly Protocol[] = ['TCP', 'UDP'];

function letterOf(protocol: Protocol): string {
  return protocol === 'TCP' ? 't' : 'u';
}

function portRange(protocol: Protocol, block: number, bits: number): string {
  const p = protocol.toLowerCase();
  const lo = block << bits;
  return `-p ${p} -m ${p} --dport ${lo}:${lo + (1 << bits) - 1}`;
}

/**
 * Blocks of 1,024 ports below `root` (`<prefix><t|u><block, 2 hex digits>`); with `levels` 2,
 * blocks of 64 below those (`<prefix><t|u><block, 3 hex digits>`), which then hold the rules.
 */
export function portTree(root: string, prefix: string, entries: readonly PortEntry[], levels: 1 | 2): ChainRules {
  const out: ChainRules = new Map([[root, []]]);
  for (const protocol of PROTOCOLS) {
    const letter = letterOf(protocol);
    for (const [block, inBlock] of groupBy(entries.filter((e) => e.protocol === protocol), (e) => e.port >> 10)) {
      const upper = `${prefix}${letter}${hex(block, 2)}`;
      push(out, root, `${portRange(protocol, block, 10)} -j ${upper}`);
      if (levels === 1) {
        for (const e of inBlock) push(out, upper, e.spec);
        continue;
      }
      for (const [small, inSmall] of groupBy(inBlock, (e) => e.port >> 6)) {
        const leaf = `${prefix}${letter}${hex(small, 3)}`;
        push(out, upper, `${portRange(protocol, small, 6)} -j ${leaf}`);
        for (const e of inSmall) push(out, leaf, e.spec);
      }
    }
  }
  return out;
}

/**
 * The chains below the root a port tree of `levels` files `port` of `protocol` under, the leaf
 * last (as portTree does): TCP's blocks before UDP's, each ascending.
 */
export function portPath(prefix: string, protocol: Protocol, port: number, levels: 1 | 2): TreeStep[] {
  const letter = letterOf(protocol);
  const block = port >> 10;
  const upper = `${prefix}${letter}${hex(block, 2)}`;
  // A port's block of 1,024 is below 64: TCP's blocks take orders 0-63, UDP's 64-127.
  const steps: TreeStep[] = [{ chain: upper, jump: `${portRange(protocol, block, 10)} -j ${upper}`, order: PROTOCOLS.indexOf(protocol) * 64 + block }];
  if (levels === 2) {
    const small = port >> 6;
    const leaf = `${prefix}${letter}${hex(small, 3)}`;
    steps.push({ chain: leaf, jump: `${portRange(protocol, small, 6)} -j ${leaf}`, order: small });
  }
  return steps;
}

/** The leaf of a port tree `port` is filed under (the last step of portPath). */
export function portLeaf(prefix: string, protocol: Protocol, port: number, levels: 1 | 2): string {
  return levels === 1 ? `${prefix}${letterOf(protocol)}${hex(port >> 10, 2)}` : `${prefix}${letterOf(protocol)}${hex(port >> 6, 3)}`;
}
