import type { ProxyConfig } from './config.js';
import type { Logger } from './log.js';
import type { CommandRunner } from './io/portal/command-runner.js';
import type { NodeAddressSource } from './io/portal/node-addresses.js';
import type { Portal } from './seams/portal.js';

/** What the node-level portals run and read; tests inject fakes. */
export interface PortalDeps {
  runner?: CommandRunner;
  nodeAddresses?: NodeAddressSource;
}

/**
 * Builds the portal the config names. Each portal's modules are loaded when it is the one chosen:
 * the iptables portal's rule rendering, planning and conntrack parsing are a fifth of the modules
 * a start with the loopback portal would otherwise load (and compile, and evaluate) for nothing.
 */
export async function createPortal(config: ProxyConfig, logger: Logger, deps: PortalDeps = {}): Promise<Portal> {
  if (config.portal === 'loopback') {
    const { LoopbackPortal } = await import('./io/portal/loopback-portal.js');
    return new LoopbackPortal();
  }
  const runner = deps.runner ?? (await import('./io/portal/command-runner.js')).processRunner;
  const nodeAddresses = deps.nodeAddresses ?? (await import('./io/portal/node-addresses.js')).systemNodeAddresses;
  if (config.portal === 'iptables') {
    const { IptablesPortal } = await import('./io/portal/iptables-portal.js');
    return new IptablesPortal({ runner, logger, nodeAddresses, bindAddress: config.bindAddress, nodePortAddresses: config.nodePortAddresses });
  }
  const { BindPortal } = await import('./io/portal/bind-portal.js');
  return new BindPortal({ runner, logger, nodeAddresses, nodePortAddresses: config.nodePortAddresses });
}
