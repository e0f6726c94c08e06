import type { IPFamily } from '../../core/address.js';
import { familyHints, unitFamilies } from '../../core/rules/families.js';
import { parseIptablesSave, planRemoval, planJumps, type JumpPlan } from '../../core/rules/iptables-save.js';
import { chooseHostIP } from '../../core/rules/node-address.js';
import { familyInUse, isWildcard, nodePortHoldHosts, proxyPortHosts, renderIptablesRules, restorePayload } from '../../core/rules/render-iptables.js';
import type { ProxyUnit } from '../../core/units.js';
import { UsageError } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';
import { BindInterface } from './bind-interface.js';
import { firstLine, isMissingCommand, type CommandRunner } from './command-runner.js';
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
 * src/core/rules/render-iptables.ts for the rules and why). Each sync writes each family in use
 * as one iptables-restore transaction that replaces our chains whole. The jumps into our chains
 * are checked against an iptables-save dump at the first sync, on every periodic sync and after a
 * failure, and put back if someone flushed them.
 */
export class IptablesPortal implements Portal {
  readonly mode = 'iptables' as const;
  private readonly log: Logger;
  private readonly iptables: IptablesRunner;
  private readonly bindInterface: BindInterface;
  /** Families written at least once: kept in sync (emptied) even when no unit uses them any more. */
  private readonly installed = new Set<IPFamily>();
  /** Families whose jumps to check against a dump at the next sync. */
  private readonly unchecked = new Set<IPFamily>([4, 6]);
  /** Families of each service port seen so far, for node-port-only units (see unitFamilies). */
  private hints = new Map<string, IPFamily[]>();

  constructor(private readonly opts: IptablesPortalOptions) {
    this.log = opts.logger.child({ component: 'portal', portal: 'iptables' });
    this.iptables = new IptablesRunner(opts.runner);
    this.bindInterface = opts.bindInterface ?? new BindInterface(opts.runner);
  }

  async start(): Promise<void> {
    // Reading the table proves the commands are there and we may use them: fail at start, with
    // one line, rather than at every sync.
    try {
      // Families that still hold our chains from an earlier run count as installed: the first
      // sync must replace them even when no Service of that family exists any more.
      if (planRemoval(parseIptablesSave(await this.iptables.save(4))) !== '') this.installed.add(4);
    } catch (err) {
      const why = isMissingCommand(err) ? 'iptables-save is not installed (install the iptables package, or use --portal bind)' : `${(err as Error).message} (it needs root)`;
      throw new UsageError(`--portal iptables: ${why}`);
    }
    if (this.opts.nodeAddresses.ipv6Enabled()) {
      try {
        if (planRemoval(parseIptablesSave(await this.iptables.save(6))) !== '') this.installed.add(6);
      } catch (err) {
        this.log.warn({ err }, 'cannot read the IPv6 rules; IPv6 Services will report their own errors');
      }
    }
    // Our own chains stay until the first sync replaces them whole (and fixes the jumps), so a
    // restart leaves no moment without rules; only the bind mode's leftovers go now.
    const report = await removeLeftovers(this.iptables, this.bindInterface, this.opts.nodeAddresses.ipv6Enabled(), 'iptables');
    if (report.removed.length > 0) this.log.info({ removed: report.removed }, 'removed leftovers of an earlier run');
    // Not fatal: the first sync replaces our chains whole and fixes the jumps anyway.
    for (const err of report.failures) this.log.error({ err }, 'cannot remove leftovers of an earlier run');
  }

  listenSpecs(unit: ProxyUnit): ListenSpec[] {
    this.learn([unit]);
    const families = unitFamilies(unit, this.hints);
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

  async sync(units: readonly RunningUnitView[], periodic: boolean): Promise<PortalSyncResult> {
    this.hints = familyHints(units.map((u) => u.unit));
    const errors: string[] = [];
    for (const family of [4, 6] as const) {
      if (!this.installed.has(family) && !familyInUse(family, units, this.opts.bindAddress)) continue;
      errors.push(...(await this.syncFamily(family, units, periodic)));
    }
    return { errors };
  }

  async cleanup(): Promise<void> {
    const report = await removeLeftovers(this.iptables, this.bindInterface, this.opts.nodeAddresses.ipv6Enabled());
    this.installed.clear();
    if (report.removed.length > 0) this.log.info({ removed: report.removed }, 'removed portal rules');
    if (report.failures.length > 0) throw cleanupError(report.failures);
  }

  private async syncFamily(family: IPFamily, units: readonly RunningUnitView[], periodic: boolean): Promise<string[]> {
    const rendered = renderIptablesRules({
      family,
      targets: units,
      bindAddress: this.opts.bindAddress,
      hostIP: isWildcard(this.opts.bindAddress) ? this.hostIP(family) : this.opts.bindAddress,
      nodePortCIDRs: this.opts.nodePortAddresses,
    });
    try {
      const check = periodic || this.unchecked.has(family);
      const jumps = check ? planJumps(parseIptablesSave(await this.iptables.save(family))) : NO_JUMPS;
      const fixes = jumps.nat.length + jumps.filter.length;
      if (check && fixes > 0 && this.installed.has(family)) {
        this.log.warn({ family: `IPv${family}`, fixes: [...jumps.nat, ...jumps.filter] }, 'jumps into our chains were missing or doubled (flushed by someone?); putting them back');
      }
      await this.iptables.restore(family, restorePayload(rendered, jumps));
      this.installed.add(family);
      if (check) this.unchecked.delete(family);
    } catch (err) {
      // Next sync starts from a fresh dump: whatever changed under us is seen then.
      this.unchecked.add(family);
      const why = err instanceof Error ? firstLine(err.message) : String(err);
      return [...rendered.errors, `IPv${family} portal rules not installed (kept as they were; retried next sync): ${why}`];
    }
    return rendered.errors;
  }

  private hostIP(family: IPFamily): string {
    const nodes = this.opts.nodeAddresses;
    return chooseHostIP(nodes.addresses(), family, nodes.defaultRouteInterface(family), this.bindInterface.name);
  }

  private learn(units: readonly ProxyUnit[]): void {
    for (const [key, families] of familyHints(units)) this.hints.set(key, families);
  }
}
