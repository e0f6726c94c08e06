import type { EndpointLoad, LoadBalancer } from '../../src/core/balancer/load-balancer.js';
import { type AffinityPolicy, type BalancerAlgorithm, type Endpoint, toEndpoint } from '../../src/core/model.js';

export interface PickCall {
  clientIP: string;
  reset: boolean;
  picked: string | undefined;
}

/**
 * Round-robin that records every pick and release. With `sticky`, a client keeps its endpoint
 * until a pick with sessionAffinityReset: enough to show that a retry really asks for a fresh one.
 */
export class FakeBalancer implements LoadBalancer {
  endpoints: readonly Endpoint[];
  readonly calls: PickCall[] = [];
  readonly released: string[] = [];
  /** Every passive-health report, as `addr ok` or `addr fail`. */
  readonly reports: string[] = [];
  private index = 0;
  private readonly stickyTo = new Map<string, Endpoint>();

  constructor(
    endpoints: readonly Endpoint[] = [],
    /** Public so a test can switch affinity on while a dial is under way. */
    public sticky = false,
  ) {
    this.endpoints = endpoints;
  }

  static of(ports: readonly number[], opts: { ip?: string; sticky?: boolean } = {}): FakeBalancer {
    const ip = opts.ip ?? '127.0.0.1';
    return new FakeBalancer(ports.map((port) => toEndpoint({ ip, port })), opts.sticky ?? false);
  }

  /** Sticky picks need the client; the others record it only when the proxy knows it anyway. */
  get usesClientIP(): boolean {
    return this.sticky;
  }

  setEndpoints(endpoints: readonly Endpoint[]): void {
    this.endpoints = endpoints;
    this.index = 0;
    this.stickyTo.clear();
  }

  setAffinity(_policy: AffinityPolicy): void {}

  setAlgorithm(_algorithm: BalancerAlgorithm): void {}

  nextEndpoint(clientIP: string, sessionAffinityReset: boolean): Endpoint | undefined {
    const picked = this.pick(clientIP, sessionAffinityReset);
    this.calls.push({ clientIP, reset: sessionAffinityReset, picked: picked?.addr });
    return picked;
  }

  cleanupStaleStickySessions(): void {}

  release(endpoint: Endpoint): void {
    this.released.push(endpoint.addr);
  }

  reportDial(endpoint: Endpoint, ok: boolean): boolean {
    this.reports.push(`${endpoint.addr} ${ok ? 'ok' : 'fail'}`);
    return false;
  }

  /** Picks minus releases per endpoint: 0 everywhere once every connection has closed. */
  outstanding(): Map<string, number> {
    const n = new Map<string, number>();
    for (const c of this.calls) if (c.picked !== undefined) n.set(c.picked, (n.get(c.picked) ?? 0) + 1);
    for (const r of this.released) n.set(r, (n.get(r) ?? 0) - 1);
    return n;
  }

  load(): EndpointLoad[] {
    const out = this.outstanding();
    return this.endpoints.map((e) => ({ addr: e.addr, active: out.get(e.addr) ?? 0, setAsideMs: 0 }));
  }

  protected pick(clientIP: string, reset: boolean): Endpoint | undefined {
    if (this.endpoints.length === 0) return undefined;
    if (this.sticky && reset) this.stickyTo.delete(clientIP);
    const kept = this.sticky ? this.stickyTo.get(clientIP) : undefined;
    if (kept) return kept;
    const ep = this.endpoints[this.index % this.endpoints.length] as Endpoint;
    this.index++;
    if (this.sticky) this.stickyTo.set(clientIP, ep);
    return ep;
  }
}
