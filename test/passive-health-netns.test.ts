import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BLACKHOLED, BACKEND_PORT, createBlackholeLab, metricValue, nsAdmin, nsConnections, type BlackholeLab } from '../bench/lib/blackhole-lab.js';
import { runCli, type Spawned } from './helpers/cli.js';
import { iptablesSkipReason, reportSkip } from './helpers/netns.js';
import { waitFor } from './helpers/net.js';

/**
 * Passive health against a real blackhole: one of a Service's three endpoints has its SYNs
 * dropped by iptables inside a namespace this test creates, so dials to it time out. The proxy
 * (the built CLI, in the namespace) sets it aside after the consecutive failures, stops dialing
 * it, shows it in /services and /metrics, and takes it back once the time is up.
 */
reportSkip('passive-health-netns.test.ts', iptablesSkipReason);

interface Status { services: Array<{ name: string; setAside: Array<{ endpoint: string; until: string }> }> }

describe.skipIf(iptablesSkipReason !== undefined)(`passive health with a blackholed endpoint${iptablesSkipReason ? ` [skipped: ${iptablesSkipReason}]` : ''}`, () => {
  let lab: BlackholeLab | undefined;
  let proxy: Spawned | undefined;
  const dead = `${BLACKHOLED}:${BACKEND_PORT}`;
  const status = async (): Promise<Status['services'][number]> => {
    const s = JSON.parse(await nsAdmin(lab!.ns, '/services')) as Status;
    return s.services.find((x) => x.name === 'default/web:http') as Status['services'][number];
  };
  const timeouts = async (): Promise<number> => metricValue(await nsAdmin(lab!.ns, '/metrics'), 'kube_userspace_proxy_dial_failures_total{service_port="default/web:http",protocol="TCP",scope="all",reason="timeout"}') ?? 0;

  beforeAll(async () => {
    lab = await createBlackholeLab('ph');
    await lab.blackhole(true);
    const args = ['--state', lab.stateFile, '--portal', 'loopback', '--metrics-bind-address', '127.0.0.1:10249', '--healthz-bind-address', '127.0.0.1:10256', '--outlier-consecutive-failures', '2', '--outlier-base-ejection-time', '2s'];
    proxy = runCli(args, { prefix: ['ip', 'netns', 'exec', lab.ns] });
    await proxy.waitForLine(/kube-userspace-proxy started/);
  });

  afterAll(async () => {
    proxy?.kill();
    await proxy?.exited;
    await lab?.destroy();
  });

  it('sets the blackholed endpoint aside after two timed-out dials, and dials it no more', async () => {
    const first = await nsConnections(lab!.ns, 9);
    // Every client is served: a timed-out dial is retried on another endpoint.
    expect(first.every((c) => c.served !== BLACKHOLED && !c.served.startsWith('error'))).toBe(true);
    const s = await status();
    expect(s.setAside.map((a) => a.endpoint)).toEqual([dead]);
    expect(Date.parse(s.setAside[0]!.until)).toBeGreaterThan(Date.now());
    const metrics = await nsAdmin(lab!.ns, '/metrics');
    expect(metricValue(metrics, 'kube_userspace_proxy_outlier_ejections_total{service_port="default/web:http"')).toBe(1);
    const before = await timeouts();
    expect(before).toBe(2);
    const more = await nsConnections(lab!.ns, 9);
    expect(new Set(more.map((c) => c.served))).toEqual(new Set(['10.203.0.1', '10.203.0.2']));
    expect(await timeouts()).toBe(before);
  });

  it('takes it back once its time is up, and it serves again when reachable', async () => {
    await lab!.blackhole(false);
    await waitFor(async () => (await status()).setAside.length === 0 || undefined, 'the endpoint to be taken back', 10_000, 200);
    const after = await nsConnections(lab!.ns, 6);
    expect(after.map((c) => c.served)).toContain(BLACKHOLED);
    expect(after.every((c) => !c.served.startsWith('error'))).toBe(true);
  });
});
