import type { IPFamily } from '../../core/address.js';
import { parseIptablesSave, planRemoval } from '../../core/rules/iptables-save.js';
import { ProxyError } from '../../core/errors.js';
import type { BindInterface } from './bind-interface.js';
import { isMissingCommand } from './command-runner.js';
import type { IptablesRunner } from './iptables-runner.js';

export interface LeftoverReport {
  /** What was found and removed, for one log line. */
  removed: string[];
  /** What could not be removed; the other steps ran anyway. */
  failures: Error[];
}

/**
 * Removes whatever either portal mode installed, by looking, not by remembering: so it also
 * works after SIGKILL, after a run in the other mode, and twice in a row. `keep` spares the
 * starting mode's own rules or addresses: its first sync replaces them whole, so a restarted
 * proxy leaves no gap in which the node has no rules at all. Each step runs whatever
 * the others did; a missing command means nothing of its kind can have been installed (a node
 * without iptables for the bind portal, a kernel without IPv6).
 */
export async function removeLeftovers(iptables: IptablesRunner, bindInterface: BindInterface, ipv6: boolean, keep?: 'iptables' | 'bind'): Promise<LeftoverReport> {
  const report: LeftoverReport = { removed: [], failures: [] };
  const families: IPFamily[] = ipv6 ? [4, 6] : [4];
  for (const family of keep === 'iptables' ? [] : families) {
    try {
      const payload = planRemoval(parseIptablesSave(await iptables.save(family)));
      if (payload === '') continue;
      await iptables.restore(family, payload);
      report.removed.push(`IPv${family} iptables chains and jumps`);
    } catch (err) {
      if (!isMissingCommand(err)) report.failures.push(err as Error);
    }
  }
  if (keep === 'bind') return report;
  try {
    if (await bindInterface.remove()) report.removed.push(`interface ${bindInterface.name}`);
  } catch (err) {
    if (!isMissingCommand(err)) report.failures.push(err as Error);
  }
  return report;
}

/** All failures of a cleanup as one error (each on its own line), with the first as the cause. */
export function cleanupError(failures: readonly Error[]): ProxyError {
  const lines = failures.map((f) => `  ${f.message}`).join('\n');
  return new ProxyError('PORTAL', `cleanup left ${failures.length} thing(s) in place:\n${lines}`, { cause: failures[0] });
}
