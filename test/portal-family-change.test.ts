import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { ServicePortStats } from '../src/core/stats.js';
import type { NodeAddress } from '../src/core/rules/node-address.js';
import type { CommandResult, CommandRunner } from '../src/io/portal/command-runner.js';
import { IptablesPortal } from '../src/io/portal/iptables-portal.js';
import type { NodeAddressSource } from '../src/io/portal/node-addresses.js';
import { silentLogger } from '../src/log.js';
import type { BoundAddress, ListenAddress, ProxySocket } from '../src/seams/proxy-socket.js';
import { fixedParts, makeProxier } from './helpers/make-proxier.js';
import { endpointSlice, service } from './helpers/objects.js';

/**
 * A NodePort Service with externalTrafficPolicy Local is two units: the cluster half (its
 * ClusterIPs) and the external half (the node port alone), which takes its IP families from the
 * cluster half. When the Service becomes dual-stack (a second ClusterIP: allowed on a running
 * Service), only the cluster half changes; the portal then writes ip6tables rules that REDIRECT
 * the node port to the external half's proxy port. Something must listen there on `::`.
 */
const nodeAddresses: NodeAddressSource = {
  addresses: (): NodeAddress[] => [
    { ip: '192.168.1.10', family: 4, iface: 'eth0', internal: false },
    { ip: '2001:db8::10', family: 6, iface: 'eth0', internal: false },
  ],
  defaultRouteInterface: () => 'eth0',
  ipv6Enabled: () => true,
};

/** A node with empty tables; restores are recorded. */
class Node implements CommandRunner {
  restores: Array<{ command: string; input: string }> = [];
  async run(command: string, _args: readonly string[], input?: string): Promise<CommandResult> {
    if (command.endsWith('-restore')) this.restores.push({ command, input: input ?? '' });
    if (command === 'ip') return { stdout: '[]', stderr: '' };
    return { stdout: '', stderr: '' };
  }
  runSync(): CommandResult {
    throw new Error('not used');
  }
}

/** Sockets that bind nothing, each recording where it listens. */
const listening: BoundAddress[][] = [];
let nextPort = 41000;
function fakeSocket(): ProxySocket {
  const bound: BoundAddress[] = [];
  listening.push(bound);
  let closed = false;
  return {
    protocol: 'TCP',
    stats: new ServicePortStats(),
    async listen(addr: ListenAddress) {
      const b = { host: addr.host, port: addr.port || nextPort++ };
      bound.push(b);
      return b;
    },
    addresses: () => (closed ? [] : bound),
    async unlisten() {},
    async close() {
      closed = true;
      bound.length = 0;
    },
    active: () => 0,
    drained: async () => {},
    destroyAll() {},
    sweep() {},
    update() {},
  };
}

function web(clusterIPs: string[], rv: string): V1Service {
  return service({ name: 'web', clusterIPs, ports: [{ name: 'http', port: 80, nodePort: 30080 }], externalTrafficPolicy: 'Local', resourceVersion: rv });
}

describe('a Service that becomes dual-stack (iptables portal)', () => {
  it('the node-port-only external half listens on :: once ip6tables rules send its node port there', async () => {
    const node = new Node();
    const portal = new IptablesPortal({ runner: node, logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [] });
    await portal.start();
    const { proxier } = makeProxier(fixedParts(portal, () => fakeSocket()));
    try {
      proxier.sink.upsertService(web(['10.96.0.10'], '1'));
      proxier.sink.upsertEndpointSlice(endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '10.244.0.5', nodeName: 'node-a' }] }) as unknown as V1EndpointSlice);
      await proxier.setSynced();
      proxier.sink.upsertService(web(['10.96.0.10', 'fd00::a'], '2'));
      await proxier.syncNow();
      const external = proxier.status().find((s) => s.name.endsWith('(external)'));
      const proxyPort = external?.proxyPort as number;
      expect(proxyPort).toBeGreaterThan(0);
      // ip6tables now sends the node port to the external half's proxy port ...
      const v6 = node.restores.filter((r) => r.command === 'ip6tables-restore').map((r) => r.input).join('');
      expect(v6).toContain(`--dport 30080 -j REDIRECT --to-ports ${proxyPort}`);
      // ... so a socket must listen on [::]:proxyPort (and hold [::]:30080).
      const hosts = listening.flat().filter((b) => b.port === proxyPort || b.port === 30080).map((b) => `${b.host}:${b.port}`);
      expect(hosts).toContain(`:::${proxyPort}`);
      expect(hosts).toContain(':::30080');
    } finally {
      await proxier.shutdown(0);
    }
  });
});
