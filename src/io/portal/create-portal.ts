import type { ProxyConfig } from '../../config.js';
import type { Logger } from '../../log.js';
import { BindPortal } from './bind-portal.js';
import { processRunner, type CommandRunner } from './command-runner.js';
import { IptablesPortal } from './iptables-portal.js';
import { LoopbackPortal } from './loopback-portal.js';
import { systemNodeAddresses, type NodeAddressSource } from './node-addresses.js';
import type { Portal } from './portal.js';

/** What the node-level portals run and read; tests inject fakes. */
export interface PortalDeps {
  runner?: CommandRunner;
  nodeAddresses?: NodeAddressSource;
}

/** Builds the portal the config names. */
export function createPortal(config: ProxyConfig, logger: Logger, deps: PortalDeps = {}): Portal {
  const runner = deps.runner ?? processRunner;
  const nodeAddresses = deps.nodeAddresses ?? systemNodeAddresses;
  switch (config.portal) {
    case 'loopback':
      return new LoopbackPortal();
    case 'iptables':
      return new IptablesPortal({ runner, logger, nodeAddresses, bindAddress: config.bindAddress, nodePortAddresses: config.nodePortAddresses });
    case 'bind':
      return new BindPortal({ runner, logger, nodeAddresses, nodePortAddresses: config.nodePortAddresses });
  }
}
