import type { IPFamily } from '../../core/address.js';
import type { CommandRunner } from './command-runner.js';

/**
 * iptables-save / iptables-restore for one family (ip6tables-* for IPv6), through the injected
 * CommandRunner. Input goes on stdin: one process per transaction, whatever its size.
 */
export class IptablesRunner {
  constructor(private readonly runner: CommandRunner) {}

  /** The whole ruleset of the family, as iptables-save prints it. */
  async save(family: IPFamily): Promise<string> {
    return (await this.runner.run(family === 4 ? 'iptables-save' : 'ip6tables-save', [])).stdout;
  }

  /**
   * One transaction. `--noflush`: tables and chains the payload does not name are left alone.
   * `-w 5`: wait for the xtables lock rather than fail when another tool holds it (legacy
   * backend; the nft backend ignores it).
   */
  async restore(family: IPFamily, payload: string): Promise<void> {
    await this.runner.run(family === 4 ? 'iptables-restore' : 'ip6tables-restore', ['-w', '5', '--noflush'], payload);
  }
}
