import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Context } from './context.js';
import { BACKEND_HOST, MOVED_HOST } from './plan.js';
import { sleep } from './proc.js';
import type { RunRecord, WorkloadInfo } from './results.js';
import { firstLogRecord, PROBE_ANSWER, probeOnce, probeUntil, scaleStateFor, startScaleProxy, writeByRename, writeInPlace, type ScaleProxy } from './scale-proxy.js';
import type { Formatting } from './state-file.js';

/**
 * One endpoint moved in a state file of N Services × E endpoints, the file written whole as a user
 * writes it: by rename (an editor, a script writing a temp file, a ConfigMap update) or in place
 * (`kubectl get svc,endpointslices -A -o json > state.json`: emptied first, written a little later).
 * The figure is the time from the write (the rename, or the last byte written in place) until a
 * new connection reaches the moved endpoint. Trials are spaced by more than the minimum sync period.
 */

export type WriteMode = 'rename' | 'in-place';
export const WRITE_MODES: readonly WriteMode[] = ['rename', 'in-place'];

export function endpointMoveId(n: number, endpoints: number, formatting: Formatting, write: WriteMode): string {
  return `endpoint-move@${n}x${endpoints}/${formatting}/${write}`;
}

export function endpointMoveInfo(n: number, endpoints: number, formatting: Formatting, write: WriteMode): WorkloadInfo {
  return {
    id: endpointMoveId(n, endpoints, formatting, write),
    title: `Endpoint move with ${n} Services × ${endpoints} endpoints, the ${formatting === 'pretty' ? 'pretty-printed' : 'one-line'} file written whole ${write === 'rename' ? 'and renamed over the old one' : 'in place (emptied first, as a shell redirect does)'}: write to new connections on the new endpoint`,
    p99: true,
    metrics: [
      { key: 'moveMs', label: 'write to new connections on the new endpoint', unit: 'ms', better: 'lower' },
      { key: 'loadedMs', label: 'write to state file loaded', unit: 'ms', better: 'lower' },
      { key: 'readMs', label: 'reading the file', unit: 'ms', better: 'lower' },
      { key: 'loadMs', label: 'reading and comparing it', unit: 'ms', better: 'lower' },
      { key: 'changed', label: 'objects passed on as changed', unit: '', better: 'lower' },
      { key: 'stale', label: 'old-endpoint answers after the first new one', unit: '', better: 'lower' },
    ],
  };
}

export interface MoveOptions {
  services: number;
  endpoints: number;
  formatting: Formatting;
  write: WriteMode;
  trials: number;
  /** In-place writes: how long the file stays empty before it is written (kubectl's round trip). */
  gapMs: number;
}

export async function endpointMove(ctx: Context, o: MoveOptions, record: (r: RunRecord) => void): Promise<void> {
  const workload = endpointMoveId(o.services, o.endpoints, o.formatting, o.write);
  const tag = `move-${o.services}x${o.endpoints}-${o.formatting}-${o.write}`;
  let proxy: ScaleProxy | undefined;
  try {
    const dir = join(ctx.tmp, tag);
    mkdirSync(dir, { recursive: true });
    const stateFile = join(dir, 'state.json');
    const state = scaleStateFor(o.services, o.endpoints, o.formatting);
    writeByRename(stateFile, state.bytes());
    // With --workers N the move must reach every worker: probes land on all of them.
    proxy = await startScaleProxy(ctx, { services: o.services, tag, stateFile, workers: ctx.options.workers });
    const first = await probeOnce(5000);
    if (first !== 'A') throw new Error(`the probe Service answered "${first}" before any move, expected "A"`);
    // Past the file source's background indexing of the first read (3 s after it), as a user's
    // first edit usually is; a trial that comes earlier finishes the index itself.
    await sleep(3500);
    for (let trial = 1; trial <= o.trials; trial++) {
      const to = trial % 2 === 1 ? MOVED_HOST : BACKEND_HOST;
      state.moveProbe(to);
      const bytes = state.bytes();
      // Leave the minimum sync period (1 s) behind, so the figure is the reaction, not the rate limit.
      await sleep(1200);
      let wall0: number;
      let t0: number;
      // Loads logged from here on are this write's (in place, one may end before the write does).
      const since = Date.now();
      if (o.write === 'rename') {
        writeFileSync(`${stateFile}.tmp`, bytes);
        wall0 = Date.now();
        t0 = performance.now();
        renameSync(`${stateFile}.tmp`, stateFile);
      } else {
        await writeInPlace(stateFile, bytes, o.gapMs);
        wall0 = Date.now();
        t0 = performance.now();
      }
      const r = await probeUntil(PROBE_ANSWER[to] as string, t0, 10_000);
      // Where the time went, from the proxy's own log.
      const loaded = await firstLogRecord(proxy.logFile, 'loaded state file', since);
      const num = (v: unknown): number => (typeof v === 'number' ? v : NaN);
      const rec: RunRecord = {
        workload,
        system: 'proxy',
        run: trial,
        metrics:
          r.moveMs === undefined
            ? {}
            : { moveMs: r.moveMs, loadedMs: loaded ? loaded.time - wall0 : NaN, readMs: num(loaded?.readMs), loadMs: num(loaded?.loadMs), changed: num(loaded?.changed), stale: r.stale },
      };
      if (r.moveMs === undefined) rec.error = `no new connection reached the new endpoint within 10 s (${r.probes} probes)`;
      record(rec);
      ctx.say(`  [trial ${trial}/${o.trials}] ${workload} ${rec.error ?? `moveMs=${r.moveMs?.toFixed(1)} changed=${String(loaded?.changed ?? '?')} stale=${r.stale} probes=${r.probes}`}`);
    }
  } catch (err) {
    record({ workload, system: 'proxy', run: 0, metrics: {}, error: (err as Error).message });
    ctx.say(`  ${workload} FAILED: ${(err as Error).message}`);
  } finally {
    await proxy?.started.stop();
  }
}
