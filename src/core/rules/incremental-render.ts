import type { IPFamily } from '../address.js';
import type { PortalAddress, Protocol } from '../model.js';
import { portalKey, type ProxyUnit } from '../units.js';
import {
  NODEPORT_CONTAINER,
  NODEPORT_HOST,
  NODEPORT_NON_LOCAL,
  PORTALS_CONTAINER,
  PORTALS_HOST,
  PROXY_PORTS_GUARD,
  TREE_PREFIX,
  type ChainRules,
  type Table,
} from './chains.js';
import { addressLeaf, addressPath, portLeaf, portPath, type TreeStep } from './dispatch-tree.js';
import { familyHints, portalFamilies, unitFamilies } from './families.js';
import { acceptRule, compareIds, guardRule, hostRootJump, multiportRuns, renderContext, renderIptablesRules, type IptablesRenderInput, type RenderedRules } from './render-iptables.js';
import { sameRules } from './sync-plan.js';
import { SweepRounds } from '../sweep-rounds.js';
import { unitRules, type UnitRulesContext } from './unit-rules.js';

/**
 * The iptables portal's rules for one family, kept from one sync to the next so that a sync costs
 * what changed rather than what is installed. Pure (state, no I/O).
 *
 * Each render gives exactly what renderIptablesRules gives for the same input (the tests hold it
 * to that over sequences of changes); what differs is the work. Every unit's rules are kept, and
 * so are the trees of dispatch-tree.ts: each leaf knows the units with rules in it, each chain
 * its rules as last rendered. A render looks at each unit once (is it the same unit object, or
 * one of the same shape, on the same proxy port, in the same families?), and renders anew only
 * the units that changed, the leaves they leave or enter, and the parents of leaves that appear
 * or go. Every chain that did not change is the very same array as in the previous render, so
 * planSync, given the previous render as what the node holds, passes over it without comparing a
 * rule: adding one Service renders the few chains on its way instead of every chain.
 *
 * Whether the node holds the previous render is the caller's business: after a failed restore
 * the portal compares with a dump instead, which compares every rule (the full plan).
 */

type Layout = 'address' | 'port' | 'multiport';

interface TreeDef {
  table: Table;
  root: string;
  /** address: rules by portal address; port: rules by node port (two levels); multiport: ports, one level. */
  layout: Layout;
  /** A host root: its first rule sends the traffic the arriving traffic's rules serve to this root. */
  hostOf?: string;
  /** multiport: the rule for a run of ports. */
  multiport?: (family: IPFamily, protocol: Protocol, ports: string) => string;
}

/** The trees, in the order renderIptablesRules lists their chains. */
const TREES: readonly TreeDef[] = [
  { table: 'nat', root: PORTALS_CONTAINER, layout: 'address' },
  { table: 'nat', root: PORTALS_HOST, layout: 'address', hostOf: PORTALS_CONTAINER },
  { table: 'nat', root: NODEPORT_CONTAINER, layout: 'port' },
  { table: 'nat', root: NODEPORT_HOST, layout: 'port', hostOf: NODEPORT_CONTAINER },
  { table: 'filter', root: PROXY_PORTS_GUARD, layout: 'multiport', multiport: guardRule },
  { table: 'filter', root: NODEPORT_NON_LOCAL, layout: 'multiport', multiport: (_family, protocol, ports) => acceptRule(protocol, ports) },
];
/** Indexes into TREES. */
const PC = 0;
const PH = 1;
const NC = 2;
const NH = 3;
const PP = 4;
const NL = 5;

function prefixOf(tree: number): string {
  return TREE_PREFIX[(TREES[tree] as TreeDef).root] as string;
}

/** A unit's rules (or, in a multiport tree, its ports) in one leaf, in the unit's order. */
interface Part {
  /** The unit's id. */
  id: string;
  tree: number;
  leaf: string;
  protocol: Protocol;
  /** What the leaf is filed by: a portal address's last byte, or a port. */
  at: number;
  /** Rules (address and port trees) or ports (multiport trees). */
  items: Array<string | number>;
}

interface UnitEntry {
  unit: ProxyUnit;
  proxyPort: number;
  families: readonly IPFamily[];
  /** Whether `families` are the unit's own (it has addressed portals), not its sibling's. */
  ownFamilies: boolean;
  parts: Part[];
  error: string | undefined;
  /** The render that last saw the unit (SweepRounds). */
  seen: number;
}

interface TreeNode {
  chain: string;
  tree: number;
  /** Undefined for a root. */
  parent: TreeNode | undefined;
  /** The parent's rule that jumps here, and its place among its siblings. */
  step: TreeStep | undefined;
  leaf: boolean;
  protocol: Protocol;
  /** Below a chain that is not a leaf. */
  children: Map<string, TreeNode>;
  /** `children` in order; undefined once they change. */
  ordered: TreeNode[] | undefined;
  /** In a leaf, the parts of the units with rules in it (an array: cheaper to fill than a map, and emptied one by one). */
  members: Part[];
  rules: string[];
  /** Taken out of its tree (a leaf with no rules left, a chain with no leaf left). */
  gone: boolean;
}

export class IncrementalRender {
  private context = '';
  private readonly rounds = new SweepRounds();
  private readonly units = new Map<string, UnitEntry>();
  /** Every chain of every tree but the roots, by name. */
  private readonly nodes = new Map<string, TreeNode>();
  private roots: TreeNode[] = [];
  private readonly errors = new Map<string, string>();
  /** Chains to render again at the end of this render. */
  private readonly dirty = new Set<TreeNode>();
  /** Leaf names by tree and what files a rule there, made once (a first render asks for tens of thousands). */
  private readonly leafNames = new Map<number, string>();

  render(input: IptablesRenderInput): RenderedRules {
    const ctx = renderContext(input);
    // A node-port destination of undefined is every local address; none at all is no node ports.
    const key = `${ctx.family}|${ctx.bindAddress}|${ctx.hostIP}|${ctx.nodePortDests.length}:${ctx.nodePortDests.map((d) => d ?? '*').join(',')}`;
    // Another family or another address in the rules: every unit's rules change, start afresh.
    if (key !== this.context || this.roots.length === 0) this.reset(key);
    this.rounds.begin();
    const hints = input.hints ?? familyHints(input.targets.map((t) => t.unit));
    for (const { unit, proxyPort } of input.targets) {
      if (proxyPort === undefined) continue;
      const entry = this.units.get(unit.id);
      // Most units of most syncs: the same object on the same port. Its families are its own
      // portals' (units never change) unless it has no address, when its sibling's may have.
      if (entry !== undefined && entry.unit === unit && entry.proxyPort === proxyPort && entry.ownFamilies && this.rounds.mark(entry)) continue;
      const families = unitFamilies(unit, hints);
      if (entry === undefined) {
        this.file(ctx, { unit, proxyPort, families, ownFamilies: portalFamilies(unit).length > 0, parts: [], error: undefined, seen: this.rounds.fresh() });
      } else if (!this.rounds.mark(entry)) {
        // Two units of one id: never from the unit set (a map by id), but the seam does not
        // promise it. The full render lists both; keep nothing from this one.
        this.reset('');
        return renderIptablesRules(input);
      } else if (entry.proxyPort === proxyPort && sameFamilies(entry.families, families) && (entry.unit === unit || sameShape(entry.unit, unit))) {
        entry.unit = unit;
      } else {
        this.withdraw(entry);
        this.file(ctx, { unit, proxyPort, families, ownFamilies: portalFamilies(unit).length > 0, parts: [], error: undefined, seen: entry.seen });
      }
    }
    this.rounds.sweep(this.units, (entry) => this.withdraw(entry));
    for (const node of this.dirty) if (!node.gone) this.renderChain(ctx, node);
    this.dirty.clear();
    return { chains: this.chains(), errors: this.errorList() };
  }

  /** Drop everything kept (the family is not on the node any more): the next render starts afresh. */
  forget(): void {
    this.reset('');
    this.roots = [];
  }

  private reset(context: string): void {
    this.context = context;
    this.units.clear();
    this.nodes.clear();
    this.errors.clear();
    this.dirty.clear();
    this.roots = TREES.map((def, tree) => {
      const root = newNode(def.root, tree, undefined, undefined, false, 'TCP');
      this.dirty.add(root);
      return root;
    });
  }

  /** Adds a unit's rules to the leaves they belong in (a unit not in them yet). */
  private file(ctx: UnitRulesContext, entry: UnitEntry): void {
    const id = entry.unit.id;
    const r = unitRules(ctx, entry.unit, entry.proxyPort, entry.families);
    const protocol = entry.unit.protocol;
    for (const e of r.portalsContainer) this.add(entry, PC, protocol, e.lastByte, e.spec);
    for (const e of r.portalsHost) this.add(entry, PH, protocol, e.lastByte, e.spec);
    for (const e of r.nodePortsContainer) this.add(entry, NC, e.protocol, e.port, e.spec);
    for (const e of r.nodePortsHost) this.add(entry, NH, e.protocol, e.port, e.spec);
    for (const port of r.guarded) this.add(entry, PP, protocol, port, port);
    if (r.nodePortTarget) this.add(entry, NL, protocol, entry.proxyPort, entry.proxyPort);
    entry.error = r.error;
    if (r.error !== undefined) this.errors.set(id, r.error);
    for (const part of entry.parts) {
      const leaf = this.nodes.get(part.leaf) ?? this.grow(ctx.family, part);
      leaf.members.push(part);
      this.dirty.add(leaf);
    }
    this.units.set(id, entry);
  }

  /** Adds a rule (or a port) to the unit's part of the leaf of `tree` that `at` is filed under. */
  private add(entry: UnitEntry, tree: number, protocol: Protocol, at: number, item: string | number): void {
    const leaf = this.leafName(tree, protocol, at);
    for (const part of entry.parts) {
      if (part.leaf !== leaf) continue;
      part.items.push(item);
      return;
    }
    entry.parts.push({ id: entry.unit.id, tree, leaf, protocol, at, items: [item] });
  }

  private leafName(tree: number, protocol: Protocol, at: number): string {
    const layout = (TREES[tree] as TreeDef).layout;
    const bucket = layout === 'address' ? at : layout === 'port' ? at >> 6 : at >> 10;
    const key = (tree * 2 + (protocol === 'TCP' ? 0 : 1)) * 65536 + bucket;
    let name = this.leafNames.get(key);
    if (name === undefined) {
      const prefix = prefixOf(tree);
      name = layout === 'address' ? addressLeaf(prefix, at) : portLeaf(prefix, protocol, at, layout === 'port' ? 2 : 1);
      this.leafNames.set(key, name);
    }
    return name;
  }

  /** Takes a unit's rules out of their leaves; a leaf left empty goes, and so does a chain left without leaves. */
  private withdraw(entry: UnitEntry): void {
    const id = entry.unit.id;
    this.errors.delete(id);
    for (const part of entry.parts) {
      const leaf = this.nodes.get(part.leaf);
      if (leaf === undefined) continue;
      const members = leaf.members;
      const at = members.indexOf(part);
      // Order does not matter here: a leaf's rules are put in order when it is rendered.
      if (at >= 0) {
        members[at] = members[members.length - 1] as Part;
        members.pop();
      }
      if (members.length > 0) this.dirty.add(leaf);
      else this.prune(leaf);
    }
    entry.parts = [];
  }

  /** The leaf a part goes in, made with the chains above it that are missing. */
  private grow(family: IPFamily, part: Part): TreeNode {
    const layout = (TREES[part.tree] as TreeDef).layout;
    const prefix = prefixOf(part.tree);
    const path = layout === 'address' ? addressPath(prefix, family, part.at) : portPath(prefix, part.protocol, part.at, layout === 'port' ? 2 : 1);
    let parent = this.roots[part.tree] as TreeNode;
    path.forEach((step, i) => {
      let node = this.nodes.get(step.chain);
      if (node === undefined) {
        node = newNode(step.chain, part.tree, parent, step, i === path.length - 1, part.protocol);
        this.nodes.set(step.chain, node);
        parent.children.set(step.chain, node);
        parent.ordered = undefined;
        this.dirty.add(parent);
      }
      parent = node;
    });
    return parent;
  }

  /** Takes an empty chain out of its tree, and its parent too when that was its last child (never a root). */
  private prune(node: TreeNode): void {
    let gone: TreeNode | undefined = node;
    while (gone?.parent !== undefined) {
      const parent: TreeNode = gone.parent;
      gone.gone = true;
      this.nodes.delete(gone.chain);
      parent.children.delete(gone.chain);
      parent.ordered = undefined;
      this.dirty.add(parent);
      gone = parent.children.size === 0 ? parent : undefined;
    }
  }

  private renderChain(ctx: UnitRulesContext, node: TreeNode): void {
    const def = TREES[node.tree] as TreeDef;
    let rules: string[];
    if (!node.leaf) {
      rules = def.hostOf !== undefined && node.parent === undefined ? [hostRootJump(ctx, def.hostOf)] : [];
      for (const child of ordered(node)) rules.push((child.step as TreeStep).jump);
    } else if (def.multiport !== undefined) {
      const ports = new Set<number>();
      for (const part of node.members) for (const port of part.items) ports.add(port as number);
      const multiport = def.multiport;
      rules = multiportRuns([...ports].sort((a, b) => a - b)).map((run) => multiport(ctx.family, node.protocol, run.join(',')));
    } else {
      rules = [];
      // In the order of the units' ids, as the full render lists them.
      for (const part of node.members.sort((a, b) => compareIds(a.id, b.id))) for (const spec of part.items) rules.push(spec as string);
    }
    // The same array when nothing changed, so planSync passes over it at once.
    if (!sameRules(rules, node.rules)) node.rules = rules;
  }

  /** Every chain, depth first, siblings in order: as renderIptablesRules lists them. */
  private chains(): { nat: ChainRules; filter: ChainRules } {
    const out = { nat: new Map<string, string[]>(), filter: new Map<string, string[]>() };
    const walk = (into: ChainRules, node: TreeNode): void => {
      into.set(node.chain, node.rules);
      if (!node.leaf) for (const child of ordered(node)) walk(into, child);
    };
    for (const root of this.roots) walk(out[(TREES[root.tree] as TreeDef).table], root);
    return out;
  }

  private errorList(): string[] {
    if (this.errors.size === 0) return [];
    return [...this.errors].sort((a, b) => compareIds(a[0], b[0])).map(([, error]) => error);
  }
}

function newNode(chain: string, tree: number, parent: TreeNode | undefined, step: TreeStep | undefined, leaf: boolean, protocol: Protocol): TreeNode {
  return { chain, tree, parent, step, leaf, protocol, children: new Map(), ordered: undefined, members: [], rules: [], gone: false };
}

function ordered(node: TreeNode): TreeNode[] {
  node.ordered ??= [...node.children.values()].sort((a, b) => (a.step as TreeStep).order - (b.step as TreeStep).order);
  return node.ordered;
}

function sameFamilies(a: readonly IPFamily[], b: readonly IPFamily[]): boolean {
  return a === b || (a.length === b.length && a.every((f, i) => f === b[i]));
}

/** Whether two units of one id have the same rules, given the same proxy port and families. */
function sameShape(a: ProxyUnit, b: ProxyUnit): boolean {
  return a.protocol === b.protocol && a.portals.length === b.portals.length && a.portals.every((p, i) => portalKey(p) === portalKey(b.portals[i] as PortalAddress));
}
