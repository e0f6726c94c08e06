import type { ProxyConfig } from '../../config.js';
import { UsageError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { LoopbackPortal } from './loopback-portal.js';
import type { Portal } from './portal.js';

/** Builds the portal the config names. */
export function createPortal(config: ProxyConfig, _logger: Logger): Portal {
  switch (config.portal) {
    case 'loopback':
      return new LoopbackPortal();
    default:
      throw new UsageError(`--portal: "${config.portal}" is not available yet in this build; use --portal loopback`);
  }
}
