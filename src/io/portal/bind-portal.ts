import { addressKey } from '../../core/address.js';
import { addressChanges, missingAddresses, wantedAddresses } from '../../core/rules/bind-addresses.js';
import { FamilyBook } from '../../core/rules/families.js';
import { nodePortAddresses } from '../../core/rules/node-address.js';
import { nodePortHoldHosts } from '../../core/rules/render-iptables.js';
import type { ProxyUnit } from '../../core/units.js';
import { UsageError } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';
import { BindInterface } from './bind-interface.js';
import { firstLine, isMissingCommand, type CommandRunner } from './command-runner.js';
import { IptablesRunner } from './iptables-runner.js';
import { cleanupError, removeLeftovers } from './leftovers.js';
import type { NodeAddressSource } from './node-addresses.js';
import type { ListenSpec, Portal, PortalSyncResult, RunningUnitView } from '../../seams/portal.js';

export interface BindPortalOptions {
  runner: CommandRunner;
  logger: Logger;
  nodeAddresses: NodeAddressSource;
  /** `--nodeport-addresses` CIDRs; empty: node ports listen on every address. */
  nodePortAddresses: readonly string[];
  bindInterface?: BindInterface;
}

/**
 * No NAT, no netfilter: every ClusterIP, externalIP and load-balancer IP of a running unit is an
 * address on an interface of ours (kube-userspace0), so the proxy listens on `ip:port` itself,
 * and node ports listen on the node's addresses. The interface is how cleanup finds everything,
 * also after SIGKILL: deleting it removes every address at once. docs/portals.md explains why
 * addresses on an interface rather than a local route for --service-cluster-ip-range.
 *
 * A socket can only bind an address once it is local, so addresses must be in place before the
 * proxier binds: `prepare(units)` adds those of a whole sync in one `ip -batch`; a unit whose
 * addresses were not prepared gets them synchronously in listenSpecs (one short `ip` run).
 */
export class BindPortal implements Portal {
  readonly mode = 'bind' as const;
  private readonly log: Logger;
  private readonly iface: BindInterface;
  /** What is on the interface, as far as we know (re-read on periodic syncs and after failures). */
  private present = new Map<string, string>();
  private stale = true;
  private readonly families = new FamilyBook();

  constructor(private readonly opts: BindPortalOptions) {
    this.log = opts.logger.child({ component: 'portal', portal: 'bind' });
    this.iface = opts.bindInterface ?? new BindInterface(opts.runner);
  }

  async start(): Promise<void> {
    // Our interface stays, addresses and all, so sockets of a restarted proxy can bind at once and
    // connections keep reaching the node; the first sync removes the addresses of Services that
    // are gone. Only the iptables mode's leftovers go now.
    const report = await removeLeftovers(new IptablesRunner(this.opts.runner), this.iface, this.opts.nodeAddresses.ipv6Enabled(), 'bind');
    if (report.removed.length > 0) this.log.info({ removed: report.removed }, 'removed leftovers of an earlier run');
    // Not fatal by itself: having the interface, below, is what must work.
    for (const err of report.failures) this.log.error({ err }, 'cannot remove leftovers of an earlier run');
    try {
      await this.reread();
    } catch (err) {
      const why = isMissingCommand(err) ? 'the ip command is not installed (install iproute2)' : (err as Error).message;
      throw new UsageError(`--portal bind: cannot create interface ${this.iface.name}: ${why}`);
    }
  }

  /**
   * Makes the addresses of units about to be opened local, in one batch: meant to be called once
   * per sync before any socket binds. A unit not prepared this way gets its addresses from
   * listenSpecs, one blocking `ip` run per unit.
   */
  async prepare(units: readonly ProxyUnit[]): Promise<PortalSyncResult> {
    this.families.learn(units);
    const missing = missingAddresses(units, this.present);
    if (missing.length === 0) return { errors: [] };
    try {
      await this.iface.apply(missing, []);
    } catch (err) {
      this.stale = true;
      return { errors: [`cannot make ${missing.join(', ')} local: ${firstLine((err as Error).message)}`] };
    }
    for (const ip of missing) this.present.set(addressKey(ip), ip);
    return { errors: [] };
  }

  listenSpecs(unit: ProxyUnit): ListenSpec[] {
    this.families.learn([unit]);
    this.ensureNow(unit);
    const specs: ListenSpec[] = [];
    for (const p of unit.portals) {
      if (p.kind !== 'nodePort') specs.push({ host: p.ip, port: p.port, portals: [p] });
      else for (const host of this.nodePortHosts(unit)) specs.push({ host, port: p.port, portals: [p] });
    }
    return specs;
  }

  async sync(units: readonly RunningUnitView[], periodic: boolean): Promise<PortalSyncResult> {
    this.families.replace(units.map((u) => u.unit));
    const wanted = wantedAddresses(units.map((u) => u.unit));
    try {
      if (periodic || this.stale) await this.reread();
      const { add, remove } = addressChanges(wanted, this.present);
      if (add.length === 0 && remove.length === 0) return { errors: [] };
      let failure = '';
      try {
        await this.iface.apply(add, remove);
      } catch (err) {
        failure = `: ${firstLine((err as Error).message)}`;
      }
      await this.reread();
      const errors: string[] = [];
      for (const ip of add) if (!this.present.has(addressKey(ip))) errors.push(`cannot make ${ip} local to this node (retried next sync)${failure}`);
      for (const ip of remove) if (this.present.has(addressKey(ip))) errors.push(`cannot remove ${ip} from ${this.iface.name} (retried next sync)${failure}`);
      if (add.length > 0 || remove.length > 0) this.log.debug({ added: add, removed: remove }, 'service addresses updated');
      this.stale = errors.length > 0;
      return { errors };
    } catch (err) {
      this.stale = true;
      return { errors: [`service addresses not updated (retried next sync): ${firstLine((err as Error).message)}`] };
    }
  }

  async cleanup(): Promise<void> {
    const report = await removeLeftovers(new IptablesRunner(this.opts.runner), this.iface, this.opts.nodeAddresses.ipv6Enabled());
    this.present = new Map();
    if (report.removed.length > 0) this.log.info({ removed: report.removed }, 'removed portal addresses');
    if (report.failures.length > 0) throw cleanupError(report.failures);
  }

  /** Re-reads the interface; recreates it when someone deleted it. */
  private async reread(): Promise<void> {
    let present = await this.iface.addresses();
    if (present === undefined) {
      this.log.warn({ interface: this.iface.name }, 'interface gone (deleted by someone?); recreating it');
      await this.iface.create();
      present = new Map();
    }
    this.present = present;
    this.stale = false;
  }

  /** The synchronous fallback: a unit's addresses, if not yet local, added before its sockets bind. */
  private ensureNow(unit: ProxyUnit): void {
    const missing = missingAddresses([unit], this.present);
    if (missing.length === 0) return;
    try {
      this.iface.applySync(missing);
      for (const ip of missing) this.present.set(addressKey(ip), ip);
    } catch (err) {
      // The bind then fails with a clear listen error for this service port; sync retries both.
      this.stale = true;
      this.log.error({ service: unit.id, addresses: missing }, `cannot make service addresses local: ${firstLine((err as Error).message)}`);
    }
  }

  /**
   * Every address of the unit's families (the wildcard of each), or, with --nodeport-addresses,
   * each allowed node address as the node has them now.
   */
  private nodePortHosts(unit: ProxyUnit): string[] {
    const families = this.families.familiesOf(unit);
    if (this.opts.nodePortAddresses.length === 0) return nodePortHoldHosts(families);
    const allowed = nodePortAddresses(this.opts.nodeAddresses.addresses(), this.opts.nodePortAddresses, this.iface.name);
    return allowed.filter((a) => families.includes(a.family)).map((a) => a.ip);
  }
}
