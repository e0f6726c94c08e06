import type { ProxyConfig } from './config.js';
import type { Logger } from './log.js';
import { BindPortal } from './io/portal/bind-portal.js';
import { processRunner, type CommandRunner } from './io/portal/command-runner.js';
import { IptablesPortal } from './io/portal/iptables-portal.js';
import { LoopbackPortal } from './io/portal/loopback-portal.js';
import { systemNodeAddresses, type NodeAddressSource } from './io/portal/node-addresses.js';
import type { Portal } from './seams/portal.js';

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
