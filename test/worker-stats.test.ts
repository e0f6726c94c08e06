import { describe, expect, it } from 'vitest';
import { ServicePortStats } from '../src/core/stats.js';
import { FIELD_COUNT, NodeStats, StatsReporter, addFlat, flattenStats, seriesKey as seriesKeyOf } from '../src/core/worker-stats.js';

/** The node's counters over worker processes: reports of what changed, summed; a dead worker's kept. */

const WEB = { servicePort: 'default/web:http', protocol: 'TCP', scope: 'all' };
const DNS = { servicePort: 'kube-system/dns:dns', protocol: 'UDP', scope: 'all' };

describe('flat stats', () => {
  it('round-trips every field', () => {
    const s = new ServicePortStats();
    s.accepted = 3;
    s.active = 1;
    s.bytesToEndpoint = 10;
    s.bytesToClient = 20;
    s.dialAttempts = 4;
    s.dialFailures.timeout = 1;
    s.udpSessionsActive = 2;
    s.udpDatagrams = 7;
    s.udpReceiveBufferDrops = 5;
    s.observeDialLatency(0.003);
    const flat = flattenStats(s);
    expect(flat).toHaveLength(FIELD_COUNT);
    const back = new ServicePortStats();
    addFlat(back, flat);
    expect(flattenStats(back)).toEqual(flat);
  });

  it('carries every number ServicePortStats counts, through a report to the node', () => {
    // Each plain number gets its own value; a field the flat form forgot reads 0 at the node.
    const s = new ServicePortStats();
    const numbers = Object.keys(s).filter((k) => typeof (s as unknown as Record<string, unknown>)[k] === 'number');
    expect(numbers.length).toBeGreaterThan(15);
    numbers.forEach((k, i) => {
      (s as unknown as Record<string, number>)[k] = i + 1;
    });
    s.dialFailures.unreachable = 99;
    s.observeDialLatency(0.003);
    const node = new NodeStats();
    node.update(0, new StatsReporter().report([{ labels: WEB, stats: s }], 0));
    const t = node.read().series[0]?.totals as unknown as Record<string, unknown>;
    for (const k of numbers) expect([k, t[k]]).toEqual([k, (s as unknown as Record<string, unknown>)[k]]);
    expect((t.dialFailures as Record<string, number>).unreachable).toBe(99);
    expect(t.dialLatencyCounts).toEqual(s.dialLatencyCounts);
  });
});

describe('StatsReporter', () => {
  it('reports only series that changed, and the ones dropped', () => {
    const reporter = new StatsReporter();
    const web = new ServicePortStats();
    const dns = new ServicePortStats();
    web.accepted = 1;
    const first = reporter.report([{ labels: WEB, stats: web }, { labels: DNS, stats: dns }], 0);
    expect(first.series.map(([k]) => k).sort()).toEqual(['default/web:http|TCP|all', 'kube-system/dns:dns|UDP|all']);
    const quiet = reporter.report([{ labels: WEB, stats: web }, { labels: DNS, stats: dns }], 0);
    expect(quiet.series).toEqual([]);
    web.accepted = 2;
    const changed = reporter.report([{ labels: WEB, stats: web }, { labels: DNS, stats: dns }], 0);
    expect(changed.series.map(([k]) => k)).toEqual(['default/web:http|TCP|all']);
    expect(changed.node[0]).toBe(2);
    // dns gone and drained: read once more, then dropped; its counts stay in the node's totals.
    reporter.report([{ labels: WEB, stats: web }], 0);
    const dropped = reporter.report([{ labels: WEB, stats: web }], 0);
    expect(dropped.removed).toEqual(['kube-system/dns:dns|UDP|all']);
  });

  it('makes good a report the controller did not take in: its values, and a series it dropped', () => {
    const reporter = new StatsReporter();
    const node = new NodeStats();
    const web = new ServicePortStats();
    const dns = new ServicePortStats();
    web.accepted = 1;
    dns.udpDatagrams = 1;
    const first = reporter.report([{ labels: WEB, stats: web }, { labels: DNS, stats: dns }], 0, 0);
    node.update(0, first);
    let acked = first.round;
    const accepted = (): number | undefined => node.read().series.find((x) => x.labels.servicePort === WEB.servicePort)?.totals.accepted;
    // A report that came too late: the controller never takes it in, and acknowledges the one before.
    web.accepted = 5;
    reporter.report([{ labels: WEB, stats: web }, { labels: DNS, stats: dns }], 0, acked);
    const next = reporter.report([{ labels: WEB, stats: web }, { labels: DNS, stats: dns }], 0, acked);
    node.update(0, next);
    acked = next.round;
    expect(accepted()).toBe(5);
    // dns's service port is gone: its final values, then its removal, which is lost.
    node.update(0, reporter.report([{ labels: WEB, stats: web }], 0, acked));
    acked += 1;
    expect(reporter.report([{ labels: WEB, stats: web }], 0, acked).removed).toEqual(['kube-system/dns:dns|UDP|all']);
    const after = reporter.report([{ labels: WEB, stats: web }], 0, acked);
    expect(after.removed).toEqual(['kube-system/dns:dns|UDP|all']);
    node.update(0, after);
    // Its final values are read once more, then it is dropped.
    expect(node.read().series.find((x) => x.labels.servicePort === DNS.servicePort)?.totals.udpDatagrams).toBe(1);
    expect(node.read().series.map((x) => x.labels.servicePort)).toEqual([WEB.servicePort]);
    // Once acknowledged, nothing is sent again.
    expect(reporter.report([{ labels: WEB, stats: web }], 0, after.round)).toMatchObject({ series: [], removed: [] });
  });

  it('keeps a series monotonic across its unit\'s recreation, and counts a retired unit until it drains', () => {
    const reporter = new StatsReporter();
    const old = new ServicePortStats();
    old.accepted = 5;
    old.active = 1;
    reporter.report([{ labels: WEB, stats: old }], 1);
    // Recreated: a fresh stats object; the old socket still has a connection open.
    const fresh = new ServicePortStats();
    fresh.accepted = 1;
    let r = reporter.report([{ labels: WEB, stats: fresh }], 1);
    expect(r.series).toEqual([['default/web:http|TCP|all', expect.arrayContaining([6])]]);
    expect(r.series[0]?.[1][0]).toBe(6);
    expect(r.series[0]?.[1][1]).toBe(1);
    // The old connection ends, with its bytes: still counted, then folded in.
    old.active = 0;
    old.bytesToClient = 100;
    r = reporter.report([{ labels: WEB, stats: fresh }], 0);
    expect(r.series[0]?.[1].slice(0, 4)).toEqual([6, 0, 0, 100]);
    fresh.accepted = 2;
    r = reporter.report([{ labels: WEB, stats: fresh }], 0);
    expect(r.series[0]?.[1].slice(0, 4)).toEqual([7, 0, 0, 100]);
  });

  it('sees each counter move alone: a change to any one is reported (its cheap check misses none)', () => {
    const probe = new ServicePortStats();
    const counters = Object.keys(probe).filter((k) => typeof (probe as unknown as Record<string, unknown>)[k] === 'number' && !['active', 'udpSessionsActive', 'held', 'dialLatencySum'].includes(k));
    expect(counters.length).toBeGreaterThan(12);
    for (const k of counters) {
      const reporter = new StatsReporter();
      const s = new ServicePortStats();
      reporter.report([{ labels: WEB, stats: s }], 0);
      (s as unknown as Record<string, number>)[k] = 1;
      expect([k, reporter.report([{ labels: WEB, stats: s }], 0).series.length]).toEqual([k, 1]);
    }
    for (const reason of ['refused', 'timeout', 'unreachable', 'other'] as const) {
      const reporter = new StatsReporter();
      const s = new ServicePortStats();
      reporter.report([{ labels: WEB, stats: s }], 0);
      s.dialFailures[reason] = 1;
      expect([reason, reporter.report([{ labels: WEB, stats: s }], 0).series.length]).toEqual([reason, 1]);
    }
  });

  it('sees held connections come and go, and counts a retired unit until its held connections are gone', () => {
    const reporter = new StatsReporter();
    const s = new ServicePortStats();
    reporter.report([{ labels: WEB, stats: s }], 0);
    s.held = 2;
    s.heldTotal = 2;
    expect(reporter.report([{ labels: WEB, stats: s }], 0).series).toEqual([[seriesKeyOf(WEB), flattenStats(s)]]);
    s.heldTotal = 5;
    s.held = 2; // three more came and went between two reports: the counter moved, the gauge did not
    expect(reporter.report([{ labels: WEB, stats: s }], 0).series).toHaveLength(1);
    // The unit is recreated; the old one still holds two connections, which later time out.
    const fresh = new ServicePortStats();
    reporter.report([{ labels: WEB, stats: fresh }], 0);
    s.held = 0;
    s.holdExpired = 2;
    const [[, flat]] = reporter.report([{ labels: WEB, stats: fresh }], 0).series as [[string, number[]]];
    const back = new ServicePortStats();
    addFlat(back, flat);
    expect({ held: back.held, heldTotal: back.heldTotal, holdExpired: back.holdExpired }).toEqual({ held: 0, heldTotal: 5, holdExpired: 2 });
  });

  it('sees a gauge that moved alone (a connection that closed without a byte)', () => {
    const reporter = new StatsReporter();
    const s = new ServicePortStats();
    s.accepted = 1;
    s.active = 1;
    reporter.report([{ labels: WEB, stats: s }], 1);
    s.active = 0;
    expect(reporter.report([{ labels: WEB, stats: s }], 0).series[0]?.[1][1]).toBe(0);
  });
});

describe('NodeStats', () => {
  function workerReport(reporter: StatsReporter, accepted: number, active: number): ReturnType<StatsReporter['report']> {
    const s = new ServicePortStats();
    s.accepted = accepted;
    s.active = active;
    return reporter.report([{ labels: WEB, stats: s }], active);
  }

  it('sums the workers per series and node-wide', () => {
    const node = new NodeStats();
    node.update(0, workerReport(new StatsReporter(), 5, 1));
    node.update(1, workerReport(new StatsReporter(), 7, 2));
    const r = node.read();
    expect(r.series).toHaveLength(1);
    expect(r.series[0]?.totals.accepted).toBe(12);
    expect(r.series[0]?.totals.active).toBe(3);
    expect(r.node.accepted).toBe(12);
    expect(node.active()).toBe(3);
  });

  it("keeps a dead worker's counters, not its open connections, and counts its slot's processes together", () => {
    const node = new NodeStats();
    node.update(0, workerReport(new StatsReporter(), 5, 1));
    node.update(1, workerReport(new StatsReporter(), 7, 2));
    node.retire(0);
    let r = node.read();
    expect(r.series[0]?.totals.accepted).toBe(12);
    expect(r.series[0]?.totals.active).toBe(2);
    // Its replacement starts from zero; the sums go on from where they were.
    node.update(0, workerReport(new StatsReporter(), 1, 1));
    r = node.read();
    expect(r.series[0]?.totals.accepted).toBe(13);
    expect(r.node.accepted).toBe(13);
    expect(node.slot(0)).toMatchObject({ active: 1 });
    expect(node.slot(0).totals.accepted).toBe(6);
    expect(node.slot(1).totals.accepted).toBe(7);
  });

  it('keeps a running series whole while every worker is down at once, and after their replacements report', () => {
    const node = new NodeStats();
    node.update(0, workerReport(new StatsReporter(), 100, 0));
    node.update(1, workerReport(new StatsReporter(), 100, 0));
    node.retire(0);
    node.retire(1);
    const running = (key: string): boolean => key === seriesKeyOf(WEB);
    // Two scrapes while both replacements are in their restart backoff.
    expect(node.read(running).series[0]?.totals.accepted).toBe(200);
    expect(node.read(running).series[0]?.totals.accepted).toBe(200);
    node.update(0, workerReport(new StatsReporter(), 1, 0));
    expect(node.read(running).series[0]?.totals.accepted).toBe(201);
  });

  it('drops a dead worker\'s series once no worker serves it, keeping it in the node\'s totals', () => {
    const node = new NodeStats();
    node.update(0, workerReport(new StatsReporter(), 5, 0));
    node.retire(0);
    expect(node.read().series).toHaveLength(1);
    const r = node.read();
    expect(r.series).toHaveLength(0);
    expect(r.node.accepted).toBe(5);
  });
});
