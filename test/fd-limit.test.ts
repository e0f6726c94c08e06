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
import { tcpEchoServer, tcpRequest, waitFor } from './helpers/net.js';

const hasPrlimit = ((): boolean => {
  try {
    execFileSync('prlimit', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

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
    const sync = { listeners: 3, listenersFailed: 0 } as SyncEvent;
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

describe('running out of open files', () => {
  const running: Spawned[] = [];
  let dir: string | undefined;
  afterAll(async () => {
    for (const r of running) r.kill();
    if (dir) await rm(dir, { recursive: true, force: true });
  });


  /** n Services with one TCP port each, at 127.97.<i>.1 (loopback portal), endpoints on a backend. */
  function manyServices(n: number, backendPort: number): string {
    const objs = [];
    for (let i = 0; i < n; i++) {
      objs.push(service({ name: `svc-${String(i).padStart(3, '0')}`, clusterIP: `10.97.${i}.1`, ports: [{ name: 'tcp', port: 17000 }] }));
      objs.push(endpointSlice({ service: `svc-${String(i).padStart(3, '0')}`, ports: [{ name: 'tcp', port: backendPort }], endpoints: [{ ip: '127.0.97.1' }] }));
    }
    return list(objs);
  }

  interface Listed {
    services: Array<{ name: string; reachable: string[]; errors: string[] }>;
  }

  it.skipIf(!hasPrlimit)('serves the Services that fit, names each one that does not, counts them, and takes more as descriptors come free', async () => {
    dir = await mkdtemp(join(tmpdir(), 'kup-fd-budget-'));
    const state = join(dir, 'state.json');
    const backend = await tcpEchoServer('127.0.97.1', 'b');
    try {
      // nofile 300: 256 kept for connections and the proxy's own work, 44 listening sockets.
      await writeFile(state, manyServices(30, backend.port));
      const r = runCli(['--state', state, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--iptables-min-sync-period', '0s'], { prefix: ['prlimit', '--nofile=300:300', '--'] });
      running.push(r);
      const admin = (JSON.parse(await r.waitForLine(/kube-userspace-proxy started/)) as { admin: string }).admin;
      const listed = async (): Promise<Listed> => (await (await fetch(`http://${admin}/services`)).json()) as Listed;
      expect((await listed()).services.filter((s) => s.errors.length > 0)).toEqual([]);

      // Mid-run, 30 more: 14 fit, 16 do not. Those that ran before keep serving.
      await writeFile(state, manyServices(60, backend.port));
      const after = await waitFor(async () => {
        const l = await listed();
        return l.services.length === 60 && l.services.filter((s) => s.errors.length > 0).length === 16 ? l : undefined;
      }, 'the edit to apply');
      const refused = after.services.filter((s) => s.errors.length > 0);
      for (const s of refused) expect(s.errors[0]).toMatch(/not served: .*out of open files.*raise the open-file limit/);
      expect(refused.map((s) => s.name)).not.toContain('default/svc-000:tcp');
      expect(await tcpRequest('127.97.0.1', 17000, 'hi')).toBe('b:hi');
      const served = after.services.find((s) => s.errors.length === 0 && s.name !== 'default/svc-000:tcp');
      const [host, port] = (served?.reachable[0] ?? '').split(':');
      expect(await tcpRequest(host as string, Number(port), 'hey')).toBe('b:hey');
      const metrics = await (await fetch(`http://${admin}/metrics`)).text();
      expect(metrics).toMatch(/^kube_userspace_proxy_listeners_failed 16$/m);
      // One line for each Service that does not fit.
      const lines = r.stdout().split('\n').filter((l) => l.includes('not served: '));
      expect(new Set(lines.map((l) => (JSON.parse(l) as { service: string }).service)).size).toBe(16);

      // Twenty go away: the waiting ones are served at the next sync.
      await writeFile(state, manyServices(40, backend.port));
      await waitFor(async () => {
        const l = await listed();
        return l.services.length === 40 && l.services.every((s) => s.errors.length === 0) ? l : undefined;
      }, 'the refused Services to be served');
      r.child.kill('SIGTERM');
      expect(await r.exited).toBe(0);
    } finally {
      await backend.close();
    }
  }, 30_000);
});
