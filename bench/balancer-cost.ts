/**
 * The balancer's share of a connection, in process, without sockets: a pick, the passive-health
 * report of the first byte, and the release, as every TCP connection makes them. Round-robin with
 * passive health off and on (nothing failing: the steady state), least-connections, and, when its
 * compiled round-robin.js is given, an earlier build's round-robin. Each variant runs in a process
 * of its own (one balancer class per call site, as in the proxy), the variants interleaved.
 *
 * Run: npm run build && node dist/bench/balancer-cost.js [endpoints] [path/to/old/dist/src/core/balancer/round-robin.js]
 * Prints ns per connection: the median of 5 processes per variant, each the median of 5 rounds of
 * 5,000,000 connections.
 */
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { RoundRobinBalancer } from '../src/core/balancer/round-robin.js';
import { toEndpoint, type Endpoint } from '../src/core/model.js';

interface Pickable {
  setEndpoints(e: readonly Endpoint[]): void;
  setAlgorithm?(a: 'least-connections'): void;
  nextEndpoint(ip: string, reset: boolean): Endpoint | undefined;
  release(e: Endpoint): void;
  reportDial?(e: Endpoint, ok: boolean): boolean;
}

const VARIANTS = ['round-robin, passive health off', 'round-robin, passive health on', 'least-connections, passive health on', 'before these features (round-robin)'] as const;
type Variant = (typeof VARIANTS)[number];
const clock = { now: () => performance.now() };

async function make(variant: Variant, old: string | undefined): Promise<Pickable> {
  switch (variant) {
    case 'round-robin, passive health off':
      return new RoundRobinBalancer({ clock, random: Math.random, outlier: { consecutiveFailures: 0, baseEjectionMs: 1, maxEjectionMs: 1, maxEjectionPercent: 100 } });
    case 'round-robin, passive health on':
      return new RoundRobinBalancer({ clock, random: Math.random });
    case 'least-connections, passive health on': {
      const lb = new RoundRobinBalancer({ clock, random: Math.random });
      lb.setAlgorithm('least-connections');
      return lb;
    }
    default: {
      const mod = (await import(old as string)) as { RoundRobinBalancer: new (deps: { clock: typeof clock; random: () => number }) => Pickable };
      return new mod.RoundRobinBalancer({ clock, random: Math.random });
    }
  }
}

/** One variant in this process: ns per connection, the median of 5 rounds. */
async function child(variant: Variant, endpoints: number, old: string | undefined): Promise<void> {
  const lb = await make(variant, old);
  lb.setEndpoints(Array.from({ length: endpoints }, (_, i) => toEndpoint({ ip: `10.0.${i >> 8}.${i & 255}`, port: 8080 })));
  const n = 5_000_000;
  const rounds: number[] = [];
  for (let r = 0; r < 5; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) {
      const e = lb.nextEndpoint('', false) as Endpoint;
      lb.reportDial?.(e, true);
      lb.release(e);
    }
    rounds.push(Number(process.hrtime.bigint() - t0) / n);
  }
  process.stdout.write(String(median(rounds)));
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

async function main(): Promise<void> {
  const [first, second, third] = process.argv.slice(2);
  if (first === '--variant') {
    await child(second as Variant, Number(third), process.argv[5]);
    return;
  }
  const endpoints = Number(first ?? 10);
  const old = second;
  const variants = VARIANTS.filter((v) => old !== undefined || !v.startsWith('before'));
  const samples = new Map<Variant, number[]>();
  for (let p = 0; p < 5; p++) {
    for (const v of variants) {
      const out = execFileSync(process.execPath, [fileURLToPath(import.meta.url), '--variant', v, String(endpoints), ...(old ? [old] : [])], { encoding: 'utf8' });
      samples.set(v, [...(samples.get(v) ?? []), Number(out)]);
    }
  }
  const result: Record<string, string> = {};
  for (const [v, xs] of samples) result[v] = `${median(xs).toFixed(1)} ns (${Math.min(...xs).toFixed(1)}-${Math.max(...xs).toFixed(1)})`;
  process.stdout.write(`${JSON.stringify({ endpoints, nsPerConnection: result }, null, 2)}\n`);
}

await main();
