import type { IPFamily } from '../../core/address.js';
import type { Protocol } from '../../core/model.js';
import type { StaleFlows } from '../../core/rules/conntrack-entries.js';
import { CommandError, type CommandRunner } from './command-runner.js';

/**
 * The `conntrack` command (conntrack-tools), through the injected CommandRunner: list a family's
 * entries of one protocol, delete the entries one filter matches. See
 * src/core/rules/conntrack-entries.ts for which entries are deleted and why.
 */
export class Conntrack {
  constructor(private readonly runner: CommandRunner) {}

  /** `conntrack -L` of one family and protocol: one line per entry. */
  async list(family: IPFamily, protocol: Protocol): Promise<string> {
    return (await this.runner.run('conntrack', ['-L', '-f', familyName(family), '-p', protocol.toLowerCase()])).stdout;
  }

  /** Deletes the entries `flows` matches; resolves with how many went (0 when they were gone already). */
  async delete(flows: StaleFlows): Promise<number> {
    const args = [
      '-D', '-f', familyName(flows.family), '-p', flows.protocol.toLowerCase(),
      '--orig-dst', flows.origDst, '--orig-port-dst', String(flows.origDport),
      '--reply-src', flows.replySrc, '--reply-port-src', String(flows.replySport),
    ];
    try {
      return deletedCount((await this.runner.run('conntrack', args)).stderr);
    } catch (err) {
      // Some versions exit 1 when nothing matched: the entries timed out or were deleted meanwhile.
      if (err instanceof CommandError && !err.missing && /\b0 flow entries have been deleted/.test(err.stderr)) return 0;
      throw err;
    }
  }
}

function familyName(family: IPFamily): string {
  return family === 4 ? 'ipv4' : 'ipv6';
}

/** `conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted.` */
function deletedCount(stderr: string): number {
  const m = /(\d+) flow entries have been deleted/.exec(stderr);
  return m ? Number(m[1]) : 0;
}
