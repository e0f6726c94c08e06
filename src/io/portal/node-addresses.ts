import { existsSync, readFileSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import type { IPFamily } from '../../core/address.js';
import { defaultRouteInterfaceV4, defaultRouteInterfaceV6, type NodeAddress } from '../../core/rules/node-address.js';

/** What the portals need to know about the node's own addresses; read fresh on every call. */
export interface NodeAddressSource {
  addresses(): NodeAddress[];
  /** The interface of the default route in `family`, if there is one. */
  defaultRouteInterface(family: IPFamily): string | undefined;
  /** Whether the kernel has IPv6 at all (no IPv6: no ip6tables state to program or clean up). */
  ipv6Enabled(): boolean;
}

function readOrEmpty(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

/** The real node: os.networkInterfaces() and /proc/net (which is per network namespace). */
export const systemNodeAddresses: NodeAddressSource = {
  addresses() {
    const out: NodeAddress[] = [];
    for (const [iface, list] of Object.entries(networkInterfaces())) {
      for (const a of list ?? []) {
        out.push({ ip: a.address, family: a.family === 'IPv6' ? 6 : 4, iface, internal: a.internal });
      }
    }
    return out;
  },
  defaultRouteInterface(family) {
    return family === 4 ? defaultRouteInterfaceV4(readOrEmpty('/proc/net/route')) : defaultRouteInterfaceV6(readOrEmpty('/proc/net/ipv6_route'));
  },
  ipv6Enabled() {
    return existsSync('/proc/net/if_inet6');
  },
};
