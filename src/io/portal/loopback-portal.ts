import { loopbackAddressFor } from '../../core/loopback-address.js';
import type { ProxyUnit } from '../../core/units.js';
import type { ListenSpec, Portal, PortalSyncResult, RunningUnitView } from '../../seams/portal.js';

/**
 * The no-root portal: each Service listens at its own 127/8 address on its real port(s), node
 * ports on 127.0.0.1. Nothing outside the process is programmed, so start and cleanup have
 * nothing to do. externalIPs and load-balancer IPs are not reachable this way and are left out.
 */
export class LoopbackPortal implements Portal {
  readonly mode = 'loopback' as const;
  private readonly byService = new Map<string, string>();
  private readonly taken = new Set<string>();

  async start(): Promise<void> {}

  async cleanup(): Promise<void> {}

  /** The loopback address assigned to a Service (`ns/name`), if it has one. */
  addressOf(service: string): string | undefined {
    return this.byService.get(service);
  }

  listenSpecs(unit: ProxyUnit): ListenSpec[] {
    const specs: ListenSpec[] = [];
    const clusterPortals = unit.portals.filter((p) => p.kind === 'clusterIP');
    if (clusterPortals.length > 0) {
      const host = this.assign(unit.service, clusterPortals.map((p) => p.ip));
      specs.push({ host, port: clusterPortals[0]!.port, portals: clusterPortals });
    }
    for (const p of unit.portals) {
      if (p.kind === 'nodePort') specs.push({ host: '127.0.0.1', port: p.port, portals: [p] });
    }
    return specs;
  }

  async sync(units: readonly RunningUnitView[]): Promise<PortalSyncResult> {
    const live = new Set(units.map((u) => u.unit.service));
    for (const [service, addr] of this.byService) {
      if (!live.has(service)) {
        this.byService.delete(service);
        this.taken.delete(addr);
      }
    }
    return { errors: [] };
  }

  private assign(service: string, clusterIPs: string[]): string {
    let addr = this.byService.get(service);
    if (!addr) {
      addr = loopbackAddressFor(service, clusterIPs, (a) => this.taken.has(a));
      this.byService.set(service, addr);
      this.taken.add(addr);
    }
    return addr;
  }
}
