/**
 * What passive health saves a client: new connections, one after another, to a Service whose
 * three endpoints include one blackholed (its SYNs dropped, so each dial to it waits out the
 * 250 ms first dial timeout before the proxy retries elsewhere). Latency is connect() to the
 * first byte of the reply, as the client sees it, with passive health off
 * (--outlier-consecutive-failures 0) and on (the defaults), alternated `rounds` times.
 *
 * Needs root: everything runs in a network namespace this process creates and removes
 * (bench/lib/blackhole-lab.ts), the proxy being the built CLI with --portal loopback.
 * Run: npm run build && node dist/bench/outlier-latency.js [connections] [rounds] (defaults 300 2).
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createBlackholeLab, nsConnections, type BlackholeLab, type ConnectionSample } from './lib/blackhole-lab.js';

const CONNECTIONS = Number(process.argv[2] ?? 300);
const ROUNDS = Number(process.argv[3] ?? 2);
const MAIN = fileURLToPath(new URL('../bundle/main.js', import.meta.url));

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
}

/** One proxy, started fresh (no health learnt yet), `CONNECTIONS` connections, then stopped. */
async function measure(lab: BlackholeLab, extra: string[]): Promise<ConnectionSample[]> {
  const args = [MAIN, '--state', lab.stateFile, '--portal', 'loopback', '--metrics-bind-address', '127.0.0.1:10249', '--healthz-bind-address', '127.0.0.1:10256', '--log-level', 'warn', ...extra];
  const child = spawn('ip', ['netns', 'exec', lab.ns, process.execPath, ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    // --log-level warn says nothing at start: wait until the node port answers.
    for (let i = 0; ; i++) {
      const [probe] = await nsConnections(lab.ns, 1);
      if (probe && probe.ms >= 0) break;
      if (i > 100) throw new Error('the proxy did not start');
      await new Promise((r) => setTimeout(r, 100));
    }
    return await nsConnections(lab.ns, CONNECTIONS);
  } finally {
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
  }
}

function summary(samples: ConnectionSample[]): Record<string, number> {
  const ok = samples.filter((s) => s.ms >= 0).map((s) => s.ms).sort((a, b) => a - b);
  return {
    connections: samples.length,
    failed: samples.length - ok.length,
    p50Ms: Number(percentile(ok, 50).toFixed(2)),
    p90Ms: Number(percentile(ok, 90).toFixed(2)),
    p99Ms: Number(percentile(ok, 99).toFixed(2)),
    over250Ms: ok.filter((ms) => ms >= 250).length,
  };
}

async function main(): Promise<void> {
  const lab = await createBlackholeLab('olb');
  const off: ConnectionSample[] = [];
  const on: ConnectionSample[] = [];
  try {
    await lab.blackhole(true);
    for (let r = 0; r < ROUNDS; r++) {
      off.push(...(await measure(lab, ['--outlier-consecutive-failures', '0'])));
      on.push(...(await measure(lab, [])));
    }
  } finally {
    await lab.destroy();
  }
  process.stdout.write(`${JSON.stringify({ connectionsPerRun: CONNECTIONS, rounds: ROUNDS, passiveHealthOff: summary(off), passiveHealthOn: summary(on) }, null, 2)}\n`);
}

await main();
