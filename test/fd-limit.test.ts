import { execFileSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { BASE_DESCRIPTORS, descriptorsNeeded, openFileLimitWarning, parseOpenFileLimit, readOpenFileLimit, warnOnLowOpenFileLimit } from '../src/fd-limit.js';
import { Topic } from '../src/core/topic.js';
import type { SyncEvent } from '../src/seams/proxier-events.js';
import { runCli, type Spawned } from './helpers/cli.js';
import { endpointSlice, list, service } from './helpers/objects.js';

/** The start-up warning when the open-file limit is below what the service ports and connections need. */

const LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            1024                 524288               files
Max locked memory         8388608              8388608              bytes
`;

describe('the open-file limit', () => {
  it('is read from /proc/<pid>/limits, "unlimited" included', () => {
    expect(parseOpenFileLimit(LIMITS)).toEqual({ soft: 1024, hard: 524288 });
    expect(parseOpenFileLimit(LIMITS.replace('1024                 524288', 'unlimited            unlimited'))).toEqual({ soft: Infinity, hard: Infinity });
    expect(parseOpenFileLimit('nothing here')).toBeUndefined();
    expect(readOpenFileLimit()).toMatchObject({ soft: expect.any(Number) });
  });

  it('warns when it is below the listeners plus two descriptors per expected connection, and says how to raise it', () => {
    const need = { listeners: 100, expectedConnections: 1000 };
    expect(descriptorsNeeded(need)).toBe(BASE_DESCRIPTORS + 100 + 2000);
    expect(openFileLimitWarning({ soft: 4096, hard: 4096 }, need)).toBeUndefined();
    const msg = openFileLimitWarning({ soft: 1024, hard: 1024 }, need);
    expect(msg).toMatch(/open-file limit \(1024\) is below the 2164 descriptors/);
    expect(msg).toMatch(/ulimit -Hn/);
    expect(msg).toMatch(/LimitNOFILE=/);
    // A soft limit lowered below the hard one is the one that applies.
    expect(openFileLimitWarning({ soft: 1024, hard: 1_000_000 }, need)).toBeDefined();
  });

  it('is checked once, after the first sync, counting what listens', () => {
    const syncs = new Topic<SyncEvent>((err) => {
      throw err;
    });
    const warnings: string[] = [];
    const events = { onSync: (l: (e: SyncEvent) => void) => syncs.subscribe(l), onChange: () => () => {} };
    warnOnLowOpenFileLimit(events, (msg, need) => warnings.push(`${need.listeners}: ${msg}`), 500, () => LIMITS);
    const sync = { listeners: 3 } as SyncEvent;
    syncs.publish(sync);
    syncs.publish(sync);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/^3: the open-file limit \(1024\) is below the 1067 descriptors/);
  });
});

describe('at start-up', () => {
  let dir: string | undefined;
  const running: Spawned[] = [];

  afterAll(async () => {
    for (const r of running) r.kill();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const hasPrlimit = ((): boolean => {
    try {
      execFileSync('prlimit', ['--version'], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  })();

  it.skipIf(!hasPrlimit)('the CLI logs the warning when started under a low limit', async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-fd-'));
    const state = join(dir, 'state.json');
    await writeFile(state, list([
      service({ name: 'web', clusterIP: '10.96.80.1', ports: [{ name: 'http', port: 18080 }] }),
      endpointSlice({ service: 'web', ports: [{ name: 'http', port: 8080 }], endpoints: [{ ip: '127.0.80.1' }] }),
    ]));
    const r = runCli(['--state', state, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0'], { prefix: ['prlimit', '--nofile=512:512', '--'] });
    running.push(r);
    const line = await r.waitForLine(/open-file limit/);
    expect(JSON.parse(line)).toMatchObject({ level: 40, listeners: 1 });
    r.child.kill('SIGTERM');
    expect(await r.exited).toBe(0);
  });

  it.skipIf(!hasPrlimit)('a cluster source under a low limit still loads the Kubernetes client (Node 24 holds no descriptors for it)', async () => {
    // Node 20's module loader held ~750 descriptors while the client loaded, and this start failed.
    const r = runCli(['--kubeconfig', '/nonexistent/kubeconfig', '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0'], { prefix: ['prlimit', '--nofile=300:300', '--'] });
    running.push(r);
    expect(await r.exited).toBe(2);
    const lines = r.stderr().trim().split('\n');
    expect(lines).toEqual(['kube-userspace-proxy: --kubeconfig: cannot load /nonexistent/kubeconfig: no such file']);
  });
});
