import { hostPort, ipText, type IPFamily } from '../../core/address.js';
import { parseConntrackList, staleFlows, type ConntrackTarget } from '../../core/rules/conntrack-entries.js';
import { FamilyBook } from '../../core/rules/families.js';
import type { TableChains } from '../../core/rules/chains.js';
import { chainsInDump, hasOurs, parseIptablesSave, planJumps, type JumpPlan, type SavedTables } from '../../core/rules/iptables-save.js';
import { chooseHostIP } from '../../core/rules/node-address.js';
import { previousProxyPorts } from '../../core/rules/previous-ports.js';
import { IncrementalRender } from '../../core/rules/incremental-render.js';
import { familyInUse, isWildcard, nodePortHoldHosts, proxyPortHosts } from '../../core/rules/render-iptables.js';
import { planSync } from '../../core/rules/sync-plan.js';
import { SweepRounds } from '../../core/sweep-rounds.js';
import { portalKey, type ProxyUnit } from '../../core/units.js';
import { UsageError } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';
import { BindInterface } from './bind-interface.js';
import { firstLine, isMissingCommand, type CommandRunner } from './command-runner.js';
import { Conntrack } from './conntrack.js';
import { IptablesRunner } from './iptables-runner.js';
import { cleanupError, removeLeftovers } from './leftovers.js';
import type { NodeAddressSource } from './node-addresses.js';
import type { ListenSpec, Portal, PortalSyncResult, RunningUnitView } from '../../seams/portal.js';

export interface IptablesPortalOptions {
  runner: CommandRunner;
  logger: Logger;
  nodeAddresses: NodeAddressSource;
  /** `--bind-address`: where proxy ports listen; a wildcard means REDIRECT (see render-iptables.ts). */
  bindAddress: string;
  /** `--nodeport-addresses` CIDRs; empty: every local address. */
  nodePortAddresses: readonly string[];
  /** The bind portal's interface, removed at start-up and cleanup if a bind run left it. */
  bindInterface?: BindInterface;
}

const NO_JUMPS: JumpPlan = { nat: [], filter: [] };

/**
 * The legacy userspace layout: nat rules steer portal traffic into per-unit proxy ports (see
 * src/core/rules/render-iptables.ts for the rules and why, dispatch-tree.ts for how they are laid
 * out). Each sync writes, per family in use, one iptables-restore transaction holding only the
 * chains whose rules changed since the last one (sync-plan.ts): the portal remembers what it
 * wrote, and renders again only the chains of the units that changed (incremental-render.ts), so
 * a sync costs what changed, not what is installed. What the node really holds is read from an
 * iptables-save dump at start-up, on every periodic sync and after a failure; then every chain
 * that differs is written again (every rule compared: the full plan), and jumps into our chains
 * that someone removed, doubled or changed are put right.
 */
export class IptablesPortal implements Portal {
  readonly mode = 'iptables' as const;
  private readonly log: Logger;
  private readonly iptables: IptablesRunner;
  private readonly bindInterface: BindInterface;
  /** Families holding our chains (at start-up, or since written): kept in sync (emptied) even when no unit uses them any more. */
  private readonly installed = new Set<IPFamily>();
  /**
   * Per family, our chains as the node holds them: as the last successful transaction left them,
   * or as the last dump showed them. No entry: not known (never read, or a transaction failed),
   * so the next sync reads a dump first.
   */
  private readonly onNode = new Map<IPFamily, TableChains>();
  /** Jump fixes planned from the start-up dump, for the first sync. */
  private readonly jumpsDue = new Map<IPFamily, JumpPlan>();
  /**
   * Per family, the rules as last rendered, kept so that a sync renders (and planSync compares)
   * only what changed; onNode is a previous render of it while the node is known to hold that.
   */
  private readonly renders = new Map<IPFamily, IncrementalRender>([[4, new IncrementalRender()], [6, new IncrementalRender()]]);
  /** Families of each service port seen so far, for node-port-only units (see unitFamilies). */
  private readonly families = new FamilyBook();
  /**
   * Unit id -> the proxy port its rules pointed at last (read from the rules a previous run left),
   * and the sync that last saw the unit (0: none yet).
   */
  private readonly lastPorts = new Map<string, { port: number; seen: number }>();
  private readonly rounds = new SweepRounds();
  private readonly conntrack: Conntrack;
  /** `family|UDP unit id` -> the proxy port and portals its conntrack entries were last checked for, and the unit. */
  private readonly checked = new Map<string, { signature: string; unit: ProxyUnit }>();
  /** Families whose TCP entries were checked (once, at the first sync: see conntrack-entries.ts). */
  private readonly tcpChecked = new Set<IPFamily>();
  /** Every TCP proxy port bound in this run: entries pointing there may be connections we serve. */
  private readonly servedTcpPorts = new Set<number>();
  private conntrackMissing = false;

  constructor(private readonly opts: IptablesPortalOptions) {
    this.log = opts.logger.child({ component: 'portal', portal: 'iptables' });
    this.iptables = new IptablesRunner(opts.runner);
    this.conntrack = new Conntrack(opts.runner);
    this.bindInterface = opts.bindInterface ?? new BindInterface(opts.runner);
  }

  async start(): Promise<void> {
    // Reading the table proves the commands are there and we may use them: fail at start, with
    // one line, rather than at every sync.
    try {
      this.learnFromDump(4, parseIptablesSave(await this.iptables.save(4)));
    } catch (err) {
      const why = isMissingCommand(err) ? 'iptables-save is not installed (install the iptables package, or use --portal bind)' : `${(err as Error).message} (it needs root)`;
      throw new UsageError(`--portal iptables: ${why}`);
    }
    if (this.opts.nodeAddresses.ipv6Enabled()) {
      try {
        this.learnFromDump(6, parseIptablesSave(await this.iptables.save(6)));
      } catch (err) {
        this.log.warn({ err }, 'cannot read the IPv6 rules; IPv6 Services will report their own errors');
      }
    }
    if (this.lastPorts.size > 0) this.log.info({ units: this.lastPorts.size }, 'found the proxy ports of the previous run; binding them again where free');
    // Our own chains stay until the first sync replaces what differs (and fixes the jumps), so a
    // restart leaves no moment without rules; only the bind mode's leftovers go now.
    const report = await removeLeftovers(this.iptables, this.bindInterface, this.opts.nodeAddresses.ipv6Enabled(), 'iptables');
    if (report.removed.length > 0) this.log.info({ removed: report.removed }, 'removed leftovers of an earlier run');
    // Not fatal: the first sync replaces our chains and fixes the jumps anyway.
    for (const err of report.failures) this.log.error({ err }, 'cannot remove leftovers of an earlier run');
  }

  /**
   * What a start-up dump says: whether the family holds our chains from an earlier run (the first
   * sync must then replace them even when no Service of that family exists any more), what they
   * hold, the jumps to put right, and the proxy ports the previous run used.
   */
  private learnFromDump(family: IPFamily, saved: SavedTables): void {
    if (hasOurs(saved)) this.installed.add(family);
    this.onNode.set(family, chainsInDump(saved));
    this.jumpsDue.set(family, planJumps(saved));
    for (const [id, port] of previousProxyPorts(saved)) if (!this.lastPorts.has(id)) this.lastPorts.set(id, { port, seen: 0 });
  }

  listenSpecs(unit: ProxyUnit): ListenSpec[] {
    this.families.learn([unit]);
    const families = this.families.familiesOf(unit);
    // One proxy port per unit; a dual-stack unit listens on it in both families (the proxier
    // binds the unit's first proxy port number again for the second spec).
    const specs: ListenSpec[] = proxyPortHosts(this.opts.bindAddress, families).map((host) => ({ host, port: 0, proxyPort: true, portals: unit.portals }));
    // Hold each node port open, as the legacy mode did: while the Service exists no other
    // process can take the port, and a conflict shows up as this service port's listen error.
    for (const p of unit.portals) {
      if (p.kind === 'nodePort') for (const host of nodePortHoldHosts(families)) specs.push({ host, port: p.port, portals: [p] });
    }
    return specs;
  }

  preferredProxyPort(unit: ProxyUnit): number | undefined {
    return this.lastPorts.get(unit.id)?.port;
  }

  async sync(units: readonly RunningUnitView[], periodic: boolean): Promise<PortalSyncResult> {
    this.families.replace(units.map((u) => u.unit));
    const errors: string[] = [];
    const skipped: string[] = [];
    const programmed: IPFamily[] = [];
    for (const family of [4, 6] as const) {
      if (!this.installed.has(family) && !familyInUse(family, units, this.opts.bindAddress, this.families.known)) {
        // Nothing of this family on the node: forget the units of its last render too.
        this.renders.get(family)?.forget();
        continue;
      }
      const result = await this.syncFamily(family, units, periodic);
      errors.push(...result.errors);
      skipped.push(...result.skipped);
      if (result.programmed) programmed.push(family);
    }
    this.rememberPorts(units);
    // Only once the rules point at the current ports: a packet after the deletion is NATed afresh.
    for (const family of programmed) await this.clearStaleFlows(family, units);
    return { errors, skipped };
  }

  async cleanup(): Promise<void> {
    const report = await removeLeftovers(this.iptables, this.bindInterface, this.opts.nodeAddresses.ipv6Enabled());
    this.installed.clear();
    this.onNode.clear();
    this.jumpsDue.clear();
    if (report.removed.length > 0) this.log.info({ removed: report.removed }, 'removed portal rules');
    if (report.failures.length > 0) throw cleanupError(report.failures);
  }

  private async syncFamily(family: IPFamily, units: readonly RunningUnitView[], periodic: boolean): Promise<{ errors: string[]; skipped: string[]; programmed: boolean }> {
    const rendered = (this.renders.get(family) as IncrementalRender).render({
      family,
      targets: units,
      bindAddress: this.opts.bindAddress,
      hostIP: isWildcard(this.opts.bindAddress) ? this.hostIP(family) : this.opts.bindAddress,
      nodePortCIDRs: this.opts.nodePortAddresses,
      hints: this.families.known,
    });
    try {
      let current = this.onNode.get(family);
      let jumps = this.jumpsDue.get(family) ?? NO_JUMPS;
      if (periodic || current === undefined) {
        const saved = parseIptablesSave(await this.iptables.save(family));
        current = chainsInDump(saved);
        jumps = planJumps(saved);
      }
      const fixes = jumps.nat.length + jumps.filter.length;
      if (fixes > 0 && this.installed.has(family)) {
        this.log.warn({ family: `IPv${family}`, fixes: [...jumps.nat, ...jumps.filter] }, 'jumps into our chains were missing, doubled or not as we write them (flushed by someone, or an earlier version\'s); putting them right');
      }
      const payload = planSync(rendered.chains, current, jumps);
      if (payload !== '') await this.iptables.restore(family, payload);
      this.onNode.set(family, rendered.chains);
      this.jumpsDue.delete(family);
      this.installed.add(family);
    } catch (err) {
      // What the node holds is not known now: the next sync starts from a fresh dump.
      this.onNode.delete(family);
      this.jumpsDue.delete(family);
      const why = err instanceof Error ? firstLine(err.message) : String(err);
      return { errors: [`IPv${family} portal rules not installed (kept as they were; retried next sync): ${why}`], skipped: rendered.errors, programmed: false };
    }
    return { errors: [], skipped: rendered.errors, programmed: true };
  }

  /**
   * Keeps each running unit's proxy port for preferredProxyPort (a unit whose listener failed
   * keeps the port it had); units that no longer run are forgotten. Updated in place: a new map
   * of every unit at every sync was the largest part of a sync that changed nothing.
   */
  private rememberPorts(units: readonly RunningUnitView[]): void {
    this.rounds.begin();
    for (const { unit, proxyPort } of units) {
      const last = this.lastPorts.get(unit.id);
      if (last !== undefined) {
        this.rounds.mark(last);
        if (proxyPort !== undefined) last.port = proxyPort;
      } else if (proxyPort !== undefined) {
        this.lastPorts.set(unit.id, { port: proxyPort, seen: this.rounds.fresh() });
      }
      if (proxyPort !== undefined && unit.protocol === 'TCP') this.servedTcpPorts.add(proxyPort);
    }
    this.rounds.sweep(this.lastPorts);
  }

  /**
   * Deletes the conntrack entries of `family` that still send a portal's traffic somewhere other
   * than its unit's proxy port (see src/core/rules/conntrack-entries.ts). UDP units are looked at
   * when first programmed and whenever their port or portals change; TCP units once, at the first
   * sync, where the entries of a previous run are. Failures are logged: the rules are in force,
   * and at worst a flow stays stuck as it would without this.
   */
  private async clearStaleFlows(family: IPFamily, units: readonly RunningUnitView[]): Promise<void> {
    const targets = this.dueForCheck(family, units);
    if (targets.length === 0 || this.conntrackMissing) return;
    const localAddresses = new Set(this.opts.nodeAddresses.addresses().map((a) => a.ip.toLowerCase()));
    for (const protocol of ['UDP', 'TCP'] as const) {
      const due = targets.filter((t) => t.unit.protocol === protocol);
      if (due.length === 0) continue;
      try {
        const entries = parseConntrackList(await this.conntrack.list(family, protocol));
        for (const flows of staleFlows(entries, { family, targets: due, localAddresses, servedTcpPorts: this.servedTcpPorts })) {
          const deleted = await this.conntrack.delete(flows);
          this.log.info({ service: flows.unit, protocol, portal: hostPort({ host: flows.origDst, port: flows.origDport }), staleTarget: hostPort({ host: flows.replySrc, port: flows.replySport }), deleted }, 'deleted stale conntrack entries');
        }
      } catch (err) {
        if (isMissingCommand(err)) {
          this.conntrackMissing = true;
          this.log.warn('conntrack is not installed: stale conntrack entries are not deleted, so an ongoing UDP flow may not reach a changed proxy port until it pauses (install conntrack)');
          return;
        }
        this.log.warn({ err, family: `IPv${family}`, protocol }, 'cannot delete stale conntrack entries');
      }
    }
  }

  /**
   * The units of `family` whose entries to check now (see clearStaleFlows), marked as checked.
   * UDP portals that no running unit serves any more (a deleted Service's, a removed externalIP)
   * come first, with no proxy port: their entries, kept alive by a client that keeps sending,
   * still NAT to the old proxy port, which the allocator hands to another unit after one sync.
   */
  private dueForCheck(family: IPFamily, units: readonly RunningUnitView[]): ConntrackTarget[] {
    const due: ConntrackTarget[] = [];
    const retired: ProxyUnit[] = [];
    const seen = new Set<string>();
    const firstTcp = !this.tcpChecked.has(family);
    this.tcpChecked.add(family);
    for (const { unit, proxyPort } of units) {
      if (proxyPort === undefined) continue;
      if (unit.protocol === 'TCP') {
        if (firstTcp) due.push({ unit, proxyPort });
        continue;
      }
      const key = `${family}|${unit.id}`;
      const signature = `${proxyPort}|${unit.portals.map(portalKey).sort().join(',')}`;
      seen.add(key);
      const before = this.checked.get(key);
      if (before?.signature === signature) continue;
      if (before !== undefined) retired.push(before.unit);
      this.checked.set(key, { signature, unit });
      due.push({ unit, proxyPort });
    }
    for (const [key, { unit }] of this.checked) {
      if (!key.startsWith(`${family}|`) || seen.has(key)) continue;
      retired.push(unit);
      this.checked.delete(key);
    }
    if (retired.length === 0) return due;
    const served = new Set<string>();
    for (const { unit } of units) for (const p of unit.portals) served.add(conntrackPortal(unit.protocol, p));
    const gone: ConntrackTarget[] = [];
    for (const unit of retired) {
      const portals = unit.portals.filter((p) => !served.has(conntrackPortal(unit.protocol, p)));
      if (portals.length > 0) gone.push({ unit: { ...unit, portals }, proxyPort: 0 });
    }
    // First: a portal of a unit due now is that unit's (staleFlows files the last one given).
    return [...gone, ...due];
  }

  private hostIP(family: IPFamily): string {
    const nodes = this.opts.nodeAddresses;
    return chooseHostIP(nodes.addresses(), family, nodes.defaultRouteInterface(family), this.bindInterface.name);
  }
}

/** What identifies a portal in a conntrack entry: its protocol and its address and port (a node port: its port). */
function conntrackPortal(protocol: string, p: { kind: string; ip: string; port: number }): string {
  return p.kind === 'nodePort' ? `${protocol}|*|${p.port}` : `${protocol}|${ipText(p.ip)}|${p.port}`;
}
