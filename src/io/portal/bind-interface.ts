import { addressKey, isLinkLocalV6 } from '../../core/address.js';
import { CommandError, type CommandRunner } from './command-runner.js';

/** The bind portal's interface: service addresses live on it, and deleting it removes them all. */
export const BIND_INTERFACE = 'kube-userspace0';

/**
 * Link types tried in order. `dummy` is the usual choice (kube-proxy's IPVS mode uses one), but
 * some kernels are built without it; `ifb` behaves the same for our purpose (no ARP, transmits
 * nothing, holds addresses) and is often built in where dummy is not.
 */
const LINK_TYPES = ['dummy', 'ifb'] as const;

/** Addresses on the interface, by addressKey; undefined when the interface does not exist. */
export type PresentAddresses = Map<string, string>;

interface IpAddrJson {
  ifname?: string;
  addr_info?: Array<{ local?: string }>;
}

/** The `ip` commands that manage the interface; every side effect goes through the runner. */
export class BindInterface {
  constructor(
    private readonly runner: CommandRunner,
    readonly name: string = BIND_INTERFACE,
  ) {}

  async exists(): Promise<boolean> {
    const { stdout } = await this.runner.run('ip', ['-j', 'link', 'show']);
    return (JSON.parse(stdout || '[]') as IpAddrJson[]).some((l) => l.ifname === this.name);
  }

  /** Creates the interface and brings it up (IPv6 addresses on a down link are never usable). */
  async create(): Promise<void> {
    const failures: CommandError[] = [];
    for (const type of LINK_TYPES) {
      try {
        await this.runner.run('ip', ['link', 'add', this.name, 'type', type]);
        await this.runner.run('ip', ['link', 'set', this.name, 'up']);
        return;
      } catch (err) {
        if (!(err instanceof CommandError)) throw err;
        failures.push(err);
        if (err.missing) break;
      }
    }
    throw new CommandError('ip', ['link', 'add', this.name], {
      exitCode: failures[failures.length - 1]?.exitCode ?? null,
      stderr: `cannot create a ${LINK_TYPES.join(' or ')} interface: ${failures.map((f) => f.message).join('; ')}`,
      cause: failures[failures.length - 1],
    });
  }

  /** Deletes the interface and every address on it; "already gone" is not a failure. */
  async remove(): Promise<boolean> {
    if (!(await this.exists())) return false;
    await this.runner.run('ip', ['link', 'del', this.name]);
    return true;
  }

  /** The service addresses on the interface (its own IPv6 link-local address aside). */
  async addresses(): Promise<PresentAddresses | undefined> {
    if (!(await this.exists())) return undefined;
    const { stdout } = await this.runner.run('ip', ['-j', 'addr', 'show', 'dev', this.name]);
    const present: PresentAddresses = new Map();
    for (const link of JSON.parse(stdout || '[]') as IpAddrJson[]) {
      for (const a of link.addr_info ?? []) {
        if (a.local && !isLinkLocalV6(a.local)) present.set(addressKey(a.local), a.local);
      }
    }
    return present;
  }

  /**
   * One `ip -batch` for every change. `-force` carries on past a failed line, so one bad address
   * does not hold up the rest; the caller reads the interface back to see what took.
   */
  async apply(add: readonly string[], remove: readonly string[]): Promise<void> {
    if (add.length === 0 && remove.length === 0) return;
    await this.runner.run('ip', ['-force', '-batch', '-'], this.batch(add, remove));
  }

  /** The same, blocking: the fallback for BindPortal.listenSpecs. */
  applySync(add: readonly string[]): void {
    if (add.length === 0) return;
    this.runner.runSync('ip', ['-force', '-batch', '-'], this.batch(add, []));
  }

  private batch(add: readonly string[], remove: readonly string[]): string {
    const lines = [
      ...remove.map((ip) => `address del ${hostPrefix(ip)} dev ${this.name}`),
      // nodad: usable at once, not "tentative" for a second; nothing else may own these addresses.
      ...add.map((ip) => `address add ${hostPrefix(ip)} dev ${this.name}${ip.includes(':') ? ' nodad' : ''}`),
    ];
    return `${lines.join('\n')}\n`;
  }
}

function hostPrefix(ip: string): string {
  return ip.includes(':') ? `${ip}/128` : `${ip}/32`;
}
