import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import type { BenchResults } from '../lib/results.js';
import { iptablesScaleSkipReason } from '../lib/iptables-scale.js';
import { TARGETS } from '../lib/targets.js';
import { findTools, missingLine, type ToolName } from '../lib/tools.js';

/**
 * A brief run of the real harness (tiny durations and sizes) that must produce well-formed
 * results. It takes about a minute, so it is not part of `npm test` (which is about the proxy's
 * behaviour): `npm run test:bench-harness` runs it, and .ci/run calls that as its own step. No
 * test here asserts a timing. The harness's parsers and arithmetic are tested in test/bench.test.ts.
 */

const RUN = fileURLToPath(new URL('../../dist/bench/run.js', import.meta.url));

/** Run the built harness; resolves with its exit code and output. Bounded. */
function runHarness(args: string[], timeoutMs: number): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [RUN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => child.kill('SIGINT'), timeoutMs);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

function readResults(dir: string): BenchResults {
  const file = readdirSync(dir).find((f) => /^bench-.*\.json$/.test(f));
  if (!file) throw new Error(`no results JSON in ${dir}`);
  expect(existsSync(join(dir, file.replace(/\.json$/, '.svg')))).toBe(true);
  return JSON.parse(readFileSync(join(dir, file), 'utf8')) as BenchResults;
}

function expectWellFormed(r: BenchResults): void {
  expect(r.schema).toBe('kube-userspace-proxy-bench/1');
  expect(r.meta).toMatchObject({ node: process.version });
  expect(r.targets).toHaveLength(TARGETS.length);
  for (const run of r.runs) {
    expect(typeof run.workload).toBe('string');
    for (const [k, v] of Object.entries(run.metrics)) expect(typeof v === 'number' && !Number.isNaN(v), `${run.system} ${run.workload} ${k}: ${String(v)}`).toBe(true);
  }
  for (const f of r.figures) {
    expect(f.values.length).toBeGreaterThan(0);
    expect(f.summary.median).toBeGreaterThanOrEqual(f.summary.min);
    expect(f.summary.max).toBeGreaterThanOrEqual(f.summary.median);
  }
}

const TOOLS: readonly ToolName[] = ['nginx', 'nginx-stream', 'haproxy', 'wrk', 'iperf3', 'sockperf', 'dnsperf', 'dnsmasq'];
const tools = await findTools();
const missing = missingLine(tools, TOOLS);
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function outDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'bench-test-'));
  dirs.push(d);
  return d;
}

describe('bench harness, a brief run', () => {
  it('measures start-up of a few service ports with nothing but node', async () => {
    const out = outDir();
    const { code, out: log } = await runHarness(['--runs', '1', '--only', 'scale-start', '--scale', '30', '--out', out], 60_000);
    expect(code, log).toBe(0);
    const r = readResults(out);
    expectWellFormed(r);
    for (const formatting of ['pretty', 'compact']) {
      const listen = r.figures.find((f) => f.workload === `scale-start@30x10/${formatting}` && f.metric === 'listenMs');
      expect(listen?.values, log).toHaveLength(1);
    }
  }, 90_000);

  it.skipIf(missing !== undefined)(`runs every workload on every system briefly${missing ? ` (skipped: ${missing})` : ''}`, async () => {
    const out = outDir();
    const args = ['--runs', '1', '--duration', '1', '--warmup', '0', '--scale', '20', '--move-ports', '20', '--formats', 'compact', '--move-trials', '2', '--churn-seconds', '2', '--churn-after', '1', '--burst', '50', '--idle-conns', '40', '--iptables-scale', '0,20', '--out', out];
    const { code, out: log } = await runHarness(args, 250_000);
    expect(code, log).toBe(0);
    const r = readResults(out);
    expectWellFormed(r);
    const failed = r.runs.filter((x) => x.error);
    expect(failed, log).toEqual([]);
    for (const w of ['tcp-bulk', 'tcp-bulk-down', 'http-keepalive', 'http-close', 'udp-pingpong', 'dns']) {
      const systems = new Set(r.runs.filter((x) => x.workload === w).map((x) => x.system));
      expect([...systems].sort(), w).toEqual(w === 'udp-pingpong' || w === 'dns' ? ['direct', 'nginx', 'proxy'] : ['direct', 'haproxy', 'nginx', 'proxy']);
    }
    expect(r.ratios.length).toBeGreaterThan(0);
    // One formatting keeps this run short (CI runs it); the first test starts from both.
    for (const write of ['rename', 'in-place']) {
      expect(r.runs.filter((x) => x.workload === `endpoint-move@20x10/compact/${write}` && x.metrics.moveMs !== undefined), write).toHaveLength(2);
    }
    expect(r.runs.find((x) => x.workload === 'file-churn@20x10/compact')?.metrics.moves, log).toBeGreaterThan(0);
    expect(r.runs.find((x) => x.workload === 'api-churn@20x10')?.metrics.moves, log).toBeGreaterThan(0);
    expect(r.runs.find((x) => x.workload === 'conn-burst@50')?.metrics.failed, log).toBe(0);
    expect(r.runs.filter((x) => x.workload === 'idle-conns@40').map((x) => x.metrics.opened)).toEqual([40, 40, 40]);
    // Root and iptables: the portal at 20 Services, both kinds; otherwise one skip line says why.
    if (iptablesScaleSkipReason() === undefined) expect(r.runs.filter((x) => x.workload.startsWith('iptables-scale')).map((x) => x.workload).sort()).toEqual(['iptables-scale-nodeport@0', 'iptables-scale-nodeport@20', 'iptables-scale@0', 'iptables-scale@20']);
    else expect(r.skipped.map((x) => x.what)).toContain('iptables-scale');
    expect(log).toContain('Targets:');
  }, 260_000);
});
