import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import type { Context } from './context.js';
import { parseNetstat } from './parse.js';
import type { HostPort } from './plan.js';
import { sleep } from './proc.js';
import type { RunRecord, WorkloadInfo } from './results.js';
import { median, percentile } from './stats.js';
import { startSystems } from './systems.js';

/**
 * A burst of new connections at once to a proxied Service (the bench Service's HTTP port, nginx
 * behind): the connect() calls made 100 per turn of the harness's event loop, then one HTTP/1.0
 * request on each. Per connection, the
 * time from its connect() call to the connection being up, and to the whole answer. A SYN that
 * found the accept queue full is dropped and sent again a second later, which is what the kernel's
 * counters show: TcpExt ListenOverflows, ListenDrops and TCPSynRetrans, read before and after.
 *
 * Those counters are the whole network namespace's: on a machine shared with other work they may
 * count someone else's drops too. The times include the harness's own event loop: up to a group of
 * connect() calls and the callbacks queued with them (`spawnMs` says how long the whole burst took
 * to make).
 */

export function connBurstId(n: number): string {
  return `conn-burst@${n}`;
}

export function connBurstInfo(n: number): WorkloadInfo {
  return {
    id: connBurstId(n),
    title: `A burst of ${n} new connections at once through the proxy (one HTTP/1.0 request each, nginx behind)`,
    metrics: [
      { key: 'connectP50Ms', label: 'connect() to connected, p50', unit: 'ms', better: 'lower' },
      { key: 'connectP99Ms', label: 'p99', unit: 'ms', better: 'lower' },
      { key: 'connectMaxMs', label: 'max', unit: 'ms', better: 'lower' },
      { key: 'responseP50Ms', label: 'request to the whole answer (all 1,000 asked at once), p50', unit: 'ms', better: 'lower' },
      { key: 'responseP99Ms', label: 'p99', unit: 'ms', better: 'lower' },
      { key: 'spawnMs', label: 'the harness making the connect() calls', unit: 'ms', better: 'none' },
      { key: 'failed', label: 'connections failed', unit: '', better: 'lower' },
      { key: 'synRetrans', label: 'SYN retransmits (host-wide)', unit: '', better: 'lower' },
      { key: 'listenOverflows', label: 'accept-queue overflows (host-wide)', unit: '', better: 'lower' },
    ],
  };
}

const REQUEST = 'GET / HTTP/1.0\r\nHost: bench\r\n\r\n';
const GROUP = 100;

function kernelCounters(): Record<string, number> {
  return parseNetstat(readFileSync('/proc/net/netstat', 'utf8'));
}

interface Burst {
  connectMs: number[];
  responseMs: number[];
  failed: number;
  spawnMs: number;
}

/**
 * `n` connections at once to `target`; once every one is up (or `timeoutMs` has passed), one
 * request on each. Requests wait for the last connection so that the harness's event loop does
 * nothing but see connections come up while the burst lasts: its own delay is then what it
 * takes to make a group of connect() calls, not to handle answers as well.
 */
function burst(target: HostPort, n: number, timeoutMs: number): Promise<Burst> {
  return new Promise((resolve) => {
    const out: Burst = { connectMs: [], responseMs: [], failed: 0, spawnMs: 0 };
    const up: Socket[] = [];
    let settled = 0;
    let answered = 0;
    const all: Socket[] = [];
    const finish = (): void => {
      clearTimeout(timer);
      for (const s of all) s.destroy();
      resolve(out);
    };
    const timer = setTimeout(() => {
      out.failed = n - answered;
      finish();
    }, timeoutMs);
    const request = (): void => {
      for (const s of up) {
        const sent = performance.now();
        s.on('data', () => undefined);
        s.once('close', () => {
          out.responseMs.push(performance.now() - sent);
          if (++answered === up.length) {
            out.failed = n - answered;
            finish();
          }
        });
        s.write(REQUEST);
      }
      if (up.length === 0) finish();
    };
    const connected = (): void => {
      if (++settled === n) request();
    };
    const t0 = performance.now();
    const open = (): void => {
      const start = performance.now();
      const s = connect({ host: target.host, port: target.port });
      all.push(s);
      s.once('connect', () => {
        out.connectMs.push(performance.now() - start);
        up.push(s);
        connected();
      });
      s.once('error', () => {
        if (!up.includes(s)) connected();
      });
    };
    // GROUP connect() calls per turn of the event loop: the whole burst still lands within a few
    // tens of milliseconds, faster than the proxy accepts, while each connection's 'connect' is
    // seen one group's worth of calls after it happened, not a whole burst's.
    const group = (from: number): void => {
      for (let i = from; i < Math.min(n, from + GROUP); i++) open();
      if (from + GROUP < n) setImmediate(() => group(from + GROUP));
      else out.spawnMs = performance.now() - t0;
    };
    group(0);
  });
}

export async function connBurst(ctx: Context, n: number, runs: number, record: (r: RunRecord) => void): Promise<void> {
  const workload = connBurstId(n);
  const [proxy] = await startSystems(ctx, ['proxy']);
  if (!proxy) {
    record({ workload, system: 'proxy', run: 0, metrics: {}, error: 'the proxy did not start' });
    return;
  }
  try {
    for (let run = 1; run <= runs; run++) {
      await sleep(1000);
      const before = kernelCounters();
      const b = await burst(proxy.target('http'), n, 30_000);
      const after = kernelCounters();
      const delta = (k: string): number => (after[k] ?? NaN) - (before[k] ?? NaN);
      const metrics = {
        connectP50Ms: median(b.connectMs),
        connectP99Ms: percentile(b.connectMs, 99),
        connectMaxMs: b.connectMs.length ? Math.max(...b.connectMs) : NaN,
        responseP50Ms: median(b.responseMs),
        responseP99Ms: percentile(b.responseMs, 99),
        spawnMs: b.spawnMs,
        failed: b.failed,
        synRetrans: delta('TcpExt.TCPSynRetrans'),
        listenOverflows: delta('TcpExt.ListenOverflows'),
      };
      record({ workload, system: 'proxy', run, metrics });
      ctx.say(`  [run ${run}/${runs}] ${workload} ${Object.entries(metrics).map(([k, v]) => `${k}=${v.toFixed(1)}`).join(' ')}`);
    }
  } finally {
    await proxy.stop();
  }
}
