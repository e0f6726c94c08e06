import { describe, expect, it } from 'vitest';
import { renderChart } from '../bench/lib/chart.js';
import { figuresOf, ratiosOf } from '../bench/lib/figures.js';
import { parseDnsperf, parseIperf3, parseProcNet, parseProcStat, parseSockperf, parseVmRss, parseWrk } from '../bench/lib/parse.js';
import { renderTable } from '../bench/lib/report.js';
import type { BenchResults, RunRecord, WorkloadInfo } from '../bench/lib/results.js';
import { scaleClusterIP, ScaleState } from '../bench/lib/state-file.js';
import { median, summarize } from '../bench/lib/stats.js';
import { judgeTargets } from '../bench/lib/targets.js';

/**
 * The benchmark harness: its parsers and its arithmetic on captured tool output. The brief run of
 * the real thing is bench/test/harness-run.test.ts (`npm run test:bench-harness`).
 */

describe('bench parsers', () => {
  it('reads iperf3 -J', () => {
    const json = JSON.stringify({ start: {}, end: { sum_sent: { retransmits: 3, bits_per_second: 27152373201.1 }, sum_received: { bits_per_second: 27105388891.4 } } });
    expect(parseIperf3(json)).toEqual({ gbps: 27.1053888914, retransmits: 3 });
    expect(() => parseIperf3(JSON.stringify({ error: 'the server is busy running a test. try again later' }))).toThrow(/busy/);
    expect(() => parseIperf3('iperf3: error')).toThrow(/cannot find a JSON report/);
  });

  it("reads the bench wrk script's JSON line", () => {
    const out = 'Running 1s test @ http://127.0.50.1:18080/\n  1 threads and 64 connections\nWRK_JSON {"requests":42410,"durationUs":1000123,"errors":0,"p50Us":1110,"p90Us":1530,"p99Us":3980,"maxUs":6530,"meanUs":1180.4}\n';
    expect(parseWrk(out)).toMatchObject({ requests: 42410, p99Us: 3980, errors: 0 });
    expect(() => parseWrk('Requests/sec: 42410')).toThrow(/WRK_JSON/);
  });

  it('reads sockperf ping-pong, colour codes and all', () => {
    const out = [
      'sockperf: [Total Run] RunTime=2.000 sec; Warm up time=400 msec; SentMessages=125771; ReceivedMessages=125770',
      'sockperf: \u001b[2;35m====> avg-rtt=16.422 (std-dev=18.276)\u001b[0m',
      'sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0',
      'sockperf: \u001b[2;35mTotal 94159 observations\u001b[0m; each percentile contains 941.59 observations',
      'sockperf: ---> <MAX> observation = 4893.029',
      'sockperf: ---> percentile 99.999 = 2161.606',
      'sockperf: ---> percentile 99.900 =   56.205',
      'sockperf: ---> percentile 99.000 =   38.371',
      'sockperf: ---> percentile 50.000 =   16.300',
    ].join('\n');
    expect(parseSockperf(out)).toEqual({ avgUs: 16.422, p50Us: 16.3, p99Us: 38.371, p999Us: 56.205, maxUs: 4893.029, observations: 94159, dropped: 0 });
    expect(() => parseSockperf('sockperf: test ended')).toThrow(/avg-rtt/);
  });

  it('reads dnsperf statistics', () => {
    const out = `Statistics:

  Queries sent:         163859
  Queries completed:    163800 (99.96%)
  Queries lost:         59 (0.04%)

  Response codes:       NOERROR 163800 (100.00%)
  Run time (s):         3.000368
  Queries per second:   54612.967476

  Average Latency (s):  0.001504 (min 0.000024, max 0.007589)
`;
    expect(parseDnsperf(out)).toEqual({ sent: 163859, completed: 163800, lost: 59, qps: 54612.967476, avgLatencyMs: 1.504 });
  });

  it('reads /proc/net/tcp, /proc/<pid>/stat and VmRSS', () => {
    const tcp = [
      '  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode',
      '   0: 0132007F:3BF9 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1430197 1 0 100 0 0 10 5',
      '   1: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1205 1 0 100 0 0 10 0',
    ].join('\n');
    expect(parseProcNet(tcp)).toEqual([
      { host: '127.0.50.1', port: 15353, state: '0A' },
      { host: '0.0.0.0', port: 2024, state: '0A' },
    ]);
    const stat = '3074 (a (weird) name) R 3071 3071 10515 0 -1 4194304 98 0 0 0 17 4 0 0 20 0 1 0 269095 3133440 380';
    expect(parseProcStat(stat)).toEqual({ ppid: 3071, ticks: 21 });
    expect(parseVmRss('Name:\tnode\nVmRSS:\t    2108 kB\n')).toBe(2108 * 1024);
  });
});

describe('bench arithmetic', () => {
  it('summarizes runs as a median with the spread', () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(summarize([10, 12, 8])).toEqual({ n: 3, median: 10, min: 8, max: 12, spreadPct: 40, p99: 12 });
    expect(summarize(Array.from({ length: 200 }, (_, i) => i + 1)).p99).toBe(198);
  });

  const workloads: WorkloadInfo[] = [
    { id: 'http-keepalive', title: 'keep-alive', metrics: [{ key: 'rps', label: 'requests/s', unit: 'req/s', better: 'higher' }, { key: 'p99Ms', label: 'p99', unit: 'ms', better: 'lower' }] },
    { id: 'scale-start@10000x10/pretty', title: 'start-up', metrics: [{ key: 'listenMs', label: 'listening', unit: 'ms', better: 'lower' }] },
    { id: 'endpoint-move@10000x10/compact/rename', title: 'move', p99: true, metrics: [{ key: 'moveMs', label: 'move', unit: 'ms', better: 'lower' }] },
  ];
  const runs: RunRecord[] = [
    ...[900, 1000, 950].map((rps, i): RunRecord => ({ workload: 'http-keepalive', system: 'proxy', run: i + 1, metrics: { rps, p99Ms: 3 } })),
    ...[1000, 1000, 1000].map((rps, i): RunRecord => ({ workload: 'http-keepalive', system: 'nginx', run: i + 1, metrics: { rps, p99Ms: 2 } })),
    { workload: 'scale-start@10000x10/pretty', system: 'proxy', run: 1, metrics: { listenMs: 900 } },
    { workload: 'scale-start@10000x10/pretty', system: 'proxy', run: 2, metrics: {}, error: 'timed out' },
    ...[20, 30, 25, 150].map((moveMs, i): RunRecord => ({ workload: 'endpoint-move@10000x10/compact/rename', system: 'proxy', run: i + 1, metrics: { moveMs } })),
  ];
  const figures = figuresOf(runs, workloads);

  it('turns runs into figures and ratios oriented so that above 1 is better', () => {
    expect(figures.find((f) => f.system === 'proxy' && f.metric === 'rps')?.summary.median).toBe(950);
    expect(figures.find((f) => f.workload === 'scale-start@10000x10/pretty')?.values).toEqual([900]);
    const ratios = ratiosOf(figures);
    expect(ratios.find((r) => r.metric === 'rps')).toMatchObject({ against: 'nginx', ratio: 0.95, standing: 0.95 });
    expect(ratios.find((r) => r.metric === 'p99Ms')).toMatchObject({ ratio: 1.5, standing: 2 / 3 });
    expect(ratios.some((r) => r.against === 'haproxy')).toBe(false);
  });

  it('judges the targets, and says which could not be judged', () => {
    const targets = judgeTargets(figures);
    expect(targets.find((t) => t.id === 'keepalive-rps')).toMatchObject({ pass: true, actual: 0.95 });
    expect(targets.find((t) => t.id === 'keepalive-p99')).toMatchObject({ pass: true, actual: 1.5 });
    expect(targets.find((t) => t.id === 'start-10k')).toMatchObject({ pass: true, actual: 900 });
    // Judged on the trials' p99, not their median.
    expect(targets.find((t) => t.id === 'move-10k')).toMatchObject({ pass: false, actual: 150 });
    expect(targets.find((t) => t.id === 'start-30k')).toMatchObject({ pass: undefined });
    expect(targets.find((t) => t.id === 'tcp-bulk')).toMatchObject({ pass: undefined, actual: undefined });
  });

  it('judges growth against a baseline workload (the iptables portal at 10,000 Services against none)', () => {
    const info = (id: string): WorkloadInfo => ({ id, title: id, metrics: [{ key: 'rtP50Ms', label: 'RTT p50', unit: 'ms', better: 'lower' }] });
    const rtt = (workload: string, values: number[]): RunRecord[] => values.map((rtP50Ms, i) => ({ workload, system: 'proxy', run: i + 1, metrics: { rtP50Ms } }));
    const grown = figuresOf([...rtt('iptables-scale@0', [0.05, 0.06, 0.04]), ...rtt('iptables-scale@10000', [0.055, 0.06, 0.07])], [info('iptables-scale@0'), info('iptables-scale@10000')]);
    expect(judgeTargets(grown).find((t) => t.id === 'iptables-rtt-10k')).toMatchObject({ pass: true, actual: 1.2 });
    const worse = figuresOf([...rtt('iptables-scale@0', [0.05]), ...rtt('iptables-scale@10000', [2.5])], [info('iptables-scale@0'), info('iptables-scale@10000')]);
    expect(judgeTargets(worse).find((t) => t.id === 'iptables-rtt-10k')).toMatchObject({ pass: false, actual: 50 });
    expect(judgeTargets(figures).find((t) => t.id === 'iptables-rtt-np-10k')).toMatchObject({ pass: undefined });
  });

  it('renders a table and a chart from the same results', () => {
    const results: BenchResults = { schema: 'kube-userspace-proxy-bench/1', meta: { date: 'now', options: { runs: 3 } }, skipped: [{ what: 'HAProxy', why: 'not found' }], workloads, runs, figures, ratios: ratiosOf(figures), targets: judgeTargets(figures) };
    const table = renderTable(results);
    expect(table).toContain('kube-userspace-proxy');
    expect(table).toContain('proxy ÷ nginx stream');
    expect(table).toMatch(/✓ keep-alive requests\/s/);
    expect(table).toContain('- HAProxy: not found');
    expect(table).toContain('27.5 (p99 150)');
    // Each workload counts its own runs: --runs, --churn-runs and trials differ.
    expect(table).toContain('keep-alive (3 runs)');
    expect(table).toContain('move (4 trials)');
    const svg = renderChart(results);
    expect(svg.startsWith('<svg')).toBe(true);
    expect(svg.trimEnd().endsWith('</svg>')).toBe(true);
    expect(svg).toContain('keep-alive HTTP: requests/s');
    expect(svg).not.toMatch(/NaN|Infinity|undefined/);
  });

  it('writes state files as a v1 List, one Service and one slice per Service, kept up to date by patches', () => {
    type List = { kind: string; items: Array<{ kind: string; metadata: { resourceVersion: string }; endpoints?: Array<{ addresses: string[] }> }> };
    for (const formatting of ['pretty', 'compact'] as const) {
      const state = new ScaleState({ services: 300, endpoints: 10, targetPort: 18080, probeEndpoint: { ip: '127.0.50.1', port: 18081 }, formatting });
      const before = state.bytes().toString();
      expect(before).toBe(state.text());
      state.moveProbe('127.0.50.2');
      state.churn([1, 150, 299]);
      const after = state.bytes().toString();
      // Patched in place, the bytes are what rendering the whole text again gives.
      expect(after).toBe(state.text());
      const list = JSON.parse(after) as List;
      expect(list.kind).toBe('List');
      expect(list.items).toHaveLength(600);
      expect(list.items[1]?.endpoints?.[0]?.addresses).toEqual(['127.0.50.2']);
      expect(Number(list.items[1]?.metadata.resourceVersion)).toBeGreaterThan(Number((JSON.parse(before) as List).items[1]?.metadata.resourceVersion));
      const moved = (k: number): string[] => (list.items[k]?.endpoints ?? []).map((e) => e.addresses[0] as string);
      expect(new Set(moved(3)).size).toBe(10);
      expect(moved(3)).not.toEqual((JSON.parse(before) as List).items[3]?.endpoints?.map((e) => e.addresses[0]));
      expect(formatting === 'pretty' ? after.startsWith('{\n    "apiVersion": "v1",\n    "items": [\n        {\n') : !after.slice(0, -1).includes('\n')).toBe(true);
    }
    expect(new Set(Array.from({ length: 300 }, (_, i) => scaleClusterIP(i))).size).toBe(300);
    expect(scaleClusterIP(253)).toBe('10.78.1.254');
    expect(scaleClusterIP(254)).toBe('10.78.2.1');
  });
});
