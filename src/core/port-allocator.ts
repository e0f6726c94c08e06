import { ProxyError, UsageError } from './errors.js';
import type { RandomSource } from './clock.js';

/** Ports `base` through `base + size - 1` (k8s.io/apimachinery/pkg/util/net PortRange). */
export interface PortRange {
  base: number;
  size: number;
}

const MAX_PORT = 65535;
const FORM = /^(\d+)(?:([-+])(\d+))?$/;

/**
 * Parses kube-proxy's `--proxy-port-range`: `p`, `a-b` or `a+n` (a through a+n), inclusive.
 * Returns undefined for `""`, `0` and `0-0`, which kube-proxy documents as "let the kernel pick".
 * Throws UsageError naming the value and the problem, laid out as `what: ...` like parseDuration
 * so config.ts's flag() can swap `what` for the flag name and keep the value.
 */
export function parsePortRange(text: string, what = 'proxy port range'): PortRange | undefined {
  const value = text.trim();
  if (value === '') return undefined;
  const m = FORM.exec(value);
  if (m === null) {
    throw new UsageError(`${what}: invalid port range "${value}": expected a port (p), a range (a-b) or a start and offset (a+n)`);
  }
  const low = Number(m[1]);
  const high = m[2] === undefined ? low : m[2] === '-' ? Number(m[3]) : low + Number(m[3]);
  if (low === 0 && high === 0) return undefined;
  checkPort(low, value, what);
  checkPort(high, value, what);
  if (high < low) {
    throw new UsageError(`${what}: invalid port range "${value}": end port ${high} is before start port ${low}`);
  }
  return { base: low, size: high - low + 1 };
}

function checkPort(port: number, value: string, what: string): void {
  if (port < 1 || port > MAX_PORT) {
    throw new UsageError(`${what}: invalid port range "${value}": port ${port} is outside 1-${MAX_PORT}`);
  }
}

/** `a-b`, the form upstream prints and parsePortRange reads back. */
export function formatPortRange(r: PortRange): string {
  return `${r.base}-${r.base + r.size - 1}`;
}

const FREE = 0;
const TAKEN = 1;
const QUARANTINED = 2;

/**
 * Hands out proxy ports (upstream pkg/proxy/userspace/port_allocator.go), synchronously: upstream's
 * goroutine pre-filling a channel only existed to share the allocator across threads.
 * Without a range every allocation is 0, so the socket layer binds to a port the kernel picks.
 */
export class PortAllocator {
  private readonly range: PortRange | undefined;
  private readonly random: RandomSource;
  /** One byte per port of the range (FREE, TAKEN or QUARANTINED); at most 64 KiB. */
  private readonly used: Uint8Array;
  /** Ports not FREE. */
  private count = 0;
  /** Offsets quarantined since the last releaseQuarantined() (some may have been claimed since). */
  private quarantined: number[] = [];

  constructor(range: PortRange | undefined, random: RandomSource) {
    this.range = range;
    this.random = random;
    this.used = new Uint8Array(range?.size ?? 0);
  }

  /** A free port of the range, or 0 when there is no range. Throws PORT_RANGE_EXHAUSTED. */
  allocateNext(): number {
    if (this.range === undefined) return 0;
    const { base, size } = this.range;
    if (this.count >= size) {
      const waiting = this.quarantined.filter((i) => this.used[i] === QUARANTINED).length;
      const after = waiting === 0 ? '' : `; ${waiting} of them freed in this sync, free from the next`;
      throw new ProxyError(
        'PORT_RANGE_EXHAUSTED',
        `no free port left in proxy port range ${formatPortRange(this.range)} (all ${size} in use${after})`,
      );
    }
    // A random start then a wrapping scan spreads ports out, so a port just released (and maybe
    // still in TIME_WAIT or remembered by a client) is not handed straight back.
    const start = Math.min(size - 1, Math.floor(this.random() * size));
    for (let k = 0; k < size; k++) {
      const i = (start + k) % size;
      if (this.used[i] === FREE) {
        this.take(i);
        return base + i;
      }
    }
    throw new ProxyError('INTERNAL', `port allocator count ${this.count} disagrees with its bitmap`);
  }

  /**
   * Takes `port` if it may be used: without a range any port may (the bind tells whether it is
   * free); with one, only a free or quarantined port of the range. For a port wanted again by the
   * unit the portal pointed it at (a restart's, a recreated unit's): quarantine keeps a port from
   * other units, not from its own.
   */
  claim(port: number): boolean {
    if (this.range === undefined) return Number.isInteger(port) && port >= 1 && port <= MAX_PORT;
    const i = this.offset(port);
    if (i === undefined || this.used[i] === TAKEN) return false;
    if (this.used[i] === QUARANTINED) this.used[i] = TAKEN;
    else this.take(i);
    return true;
  }

  /** Frees `port` for reuse. 0 (kernel-picked) and ports outside the range are ignored. */
  release(port: number): void {
    const i = this.offset(port);
    if (i === undefined || this.used[i] === FREE) return;
    this.used[i] = FREE;
    this.count--;
  }

  /**
   * Frees `port`, but not before releaseQuarantined(): a closed unit's port, which the portal's
   * rules (and conntrack entries) still point at until the portal is synced after the batch that
   * closed it. Handed to another unit of the same batch, it would take that unit's traffic.
   * Whether it was a port of the range, now quarantined.
   */
  quarantine(port: number): boolean {
    const i = this.offset(port);
    if (i === undefined || this.used[i] !== TAKEN) return false;
    this.used[i] = QUARANTINED;
    this.quarantined.push(i);
    return true;
  }

  /**
   * Keeps a free `port` from allocateNext() until its own unit claims it (claim() takes a
   * quarantined port) or the next releaseQuarantined(): a batch's preferred ports are reserved
   * before any unit of it allocates, so an earlier unit cannot take a later one's. Under a
   * hand-over the old process still listens there (SO_REUSEPORT), so a bind would not tell.
   */
  reserve(port: number): void {
    const i = this.offset(port);
    if (i === undefined || this.used[i] !== FREE) return;
    this.take(i);
    this.used[i] = QUARANTINED;
    this.quarantined.push(i);
  }

  /** Frees every quarantined port: the portal has been synced since they were quarantined. */
  releaseQuarantined(): void {
    for (const i of this.quarantined) {
      if (this.used[i] !== QUARANTINED) continue;
      this.used[i] = FREE;
      this.count--;
    }
    this.quarantined = [];
  }

  /**
   * Records that `port` is taken by another process (bind failed with EADDRINUSE) so allocateNext
   * skips it. Idempotent; ignored outside the range. release() makes it available again.
   */
  markInUse(port: number): void {
    const i = this.offset(port);
    if (i === undefined) return;
    if (this.used[i] === FREE) this.take(i);
    else this.used[i] = TAKEN;
  }

  /** Ports of the range taken now, allocated, marked or quarantined; 0 without a range. */
  inUse(): number {
    return this.count;
  }

  private take(i: number): void {
    this.used[i] = TAKEN;
    this.count++;
  }

  private offset(port: number): number | undefined {
    if (this.range === undefined || !Number.isInteger(port)) return undefined;
    const i = port - this.range.base;
    return i >= 0 && i < this.range.size ? i : undefined;
  }
}
