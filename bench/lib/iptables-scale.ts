import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { ServicePort } from '../../src/core/model.js';
import { planUnits } from '../../src/core/units.js';
import { processRunner, type CommandRunner } from '../../src/io/portal/command-runner.js';
import { IptablesPortal } from '../../src/io/portal/iptables-portal.js';
import type { NodeAddressSource } from '../../src/io/portal/node-addresses.js';
import { silentLogger } from '../../src/log.js';
import type { RunningUnitView } from '../../src/seams/portal.js';
import type { Context } from './context.js';
import type { ProbeConfig, ProbeResult } from './netns-probe.js';
import type { IptablesKind } from './options.js';
import type { RunRecord, WorkloadInfo } from './results.js';

/**
 * `iptables-scale@N`: the iptables portal holding N Services, in a network namespace of its own.
 *
 * The portal is driven directly with units (as the proxier hands them over), not through the CLI:
 * what is measured is the portal and the rules it leaves on the node, not the proxier binding N
 * sockets (scale-start measures that), and no Service needs a socket of its own: each unit is
 * given a proxy port number, and only the probed Service's port has a listener (the probe's).
 *
 * One trial, in a fresh namespace: start the portal; sync N Services (the first sync); sync N + 1
 * (adding one); sync N + 1 again (nothing to write) and N + 2 (adding another, as a proxy that has
 * synced before meets it); then, with the rules of N + 2 Services in force, the probe process
 * inside the namespace times an unrelated TCP round trip on loopback, new unrelated connections, and new
 * connections through the added Service's ClusterIP (see netns-probe.ts); then a second portal
 * starts on the same node and syncs the same Services (a restart). The namespace is removed
 * whatever happens. Every figure is one trial's; the table shows the median of the trials.
 */

const PROBE = fileURLToPath(new URL('./netns-probe.js', import.meta.url));
/** The node's own address in the namespace: where the node's portal traffic is DNATed. */
const HOST_IP = '10.77.0.1';
const UNRELATED_PORT = 5555;
/** Proxy ports and node ports of Service i; disjoint from each other and from UNRELATED_PORT for i < 20,000. */
const proxyPortOf = (i: number): number => 35_000 + i;
const nodePortOf = (i: number): number => 10_000 + i;
const clusterIPOf = (i: number): string => `10.96.${(i + 1) >> 8}.${(i + 1) & 255}`;

export const IPTABLES_SCALE_INFO = (kind: IptablesKind, n: number): WorkloadInfo => ({
  id: workloadId(kind, n),
  p99: true,
  title: `iptables portal holding ${n} ${kind === 'nodeport' ? 'NodePort' : 'ClusterIP'} Services, then one more (its ClusterIP probed); "other": unrelated TCP on loopback`,
  metrics: [
    { key: 'firstSyncMs', label: 'first sync', unit: 'ms', better: 'lower' },
    { key: 'firstRestoreMs', label: 'its restore', unit: 'ms', better: 'lower' },
    { key: 'firstSaveMs', label: 'its save', unit: 'ms', better: 'lower' },
    { key: 'addOneMs', label: 'add one', unit: 'ms', better: 'lower' },
    { key: 'addOneRestoreMs', label: 'its restore', unit: 'ms', better: 'lower' },
    { key: 'addOneNodeMs', label: 'its Node side (the sync less its commands)', unit: 'ms', better: 'lower' },
    { key: 'unchangedSyncMs', label: 'then a sync that changes nothing (no command: all Node side)', unit: 'ms', better: 'lower' },
    { key: 'addAnotherMs', label: 'then add another', unit: 'ms', better: 'lower' },
    { key: 'addAnotherRestoreMs', label: 'its restore', unit: 'ms', better: 'lower' },
    { key: 'addAnotherNodeMs', label: 'its Node side', unit: 'ms', better: 'lower' },
    { key: 'nsExecMs', label: '`ip netns exec` alone (in each command above, not in the proxy)', unit: 'ms', better: 'none' },
    { key: 'restartStartMs', label: 'restart: start', unit: 'ms', better: 'lower' },
    { key: 'restartSyncMs', label: 'restart: sync', unit: 'ms', better: 'lower' },
    { key: 'rtP50Ms', label: 'other RTT p50', unit: 'ms', better: 'lower' },
    { key: 'rtP99Ms', label: 'other RTT p99', unit: 'ms', better: 'lower' },
    { key: 'connP50Ms', label: 'other connect p50', unit: 'ms', better: 'lower' },
    { key: 'connP99Ms', label: 'other connect p99', unit: 'ms', better: 'lower' },
    { key: 'portalConnP50Ms', label: 'ClusterIP connect p50', unit: 'ms', better: 'lower' },
    { key: 'portalConnP99Ms', label: 'ClusterIP connect p99', unit: 'ms', better: 'lower' },
  ],
});

export function workloadId(kind: IptablesKind, n: number): string {
  return kind === 'nodeport' ? `iptables-scale-nodeport@${n}` : `iptables-scale@${n}`;
}

/** Why the workload cannot run here, or undefined when it can. */
export function iptablesScaleSkipReason(): string | undefined {
  if (process.platform !== 'linux') return 'needs Linux (network namespaces)';
  if (process.getuid?.() !== 0) return 'needs root (creates a network namespace and writes iptables rules in it)';
  for (const [cmd, args, pkg] of [['ip', ['netns', 'list'], 'iproute2'], ['iptables-restore', ['--version'], 'iptables'], ['iptables-save', ['--version'], 'iptables']] as const) {
    try {
      execFileSync(cmd, [...args], { stdio: 'ignore' });
    } catch {
      return `\`${cmd}\` does not run (apt-get install ${pkg})`;
    }
  }
  return undefined;
}

function servicePortOf(kind: IptablesKind, i: number): ServicePort {
  return {
    name: { namespace: `ns${i % 10}`, name: `svc${i}`, port: 'http' },
    key: `ns${i % 10}/svc${i}:http`,
    protocol: 'TCP',
    port: 80,
    clusterIPs: [clusterIPOf(i)],
    nodePort: kind === 'nodeport' ? nodePortOf(i) : 0,
    externalIPs: [],
    loadBalancerIPs: [],
    affinity: { type: 'None', timeoutSeconds: 10800 },
    internalTrafficPolicy: 'Cluster',
    externalTrafficPolicy: 'Cluster',
    healthCheckNodePort: 0,
    endpoints: [],
  };
}

/** The views of Services `from` to `count - 1`. */
function viewsOf(kind: IptablesKind, count: number, from = 0): RunningUnitView[] {
  const out: RunningUnitView[] = [];
  for (let i = from; i < count; i++) {
    for (const unit of planUnits(servicePortOf(kind, i), { clusterEndpoints: [], externalEndpoints: [] })) out.push({ unit, proxyPort: proxyPortOf(i) });
  }
  return out;
}

const nodeAddresses: NodeAddressSource = {
  addresses: () => [{ ip: HOST_IP, family: 4, iface: 'lo', internal: false }],
  defaultRouteInterface: () => 'lo',
  ipv6Enabled: () => false,
};

/** Runs the portal's commands inside `ns`, adding up the time spent in each kind of command, and in all of them. */
class TimedRunner implements CommandRunner {
  readonly spent = { restore: 0, save: 0, all: 0 };

  constructor(private readonly ns: string) {}

  async run(command: string, args: readonly string[], input?: string): Promise<{ stdout: string; stderr: string }> {
    const t = performance.now();
    try {
      return await processRunner.run('ip', ['netns', 'exec', this.ns, command, ...args], input);
    } finally {
      const ms = performance.now() - t;
      this.spent.all += ms;
      if (command.endsWith('-restore')) this.spent.restore += ms;
      else if (command.endsWith('-save')) this.spent.save += ms;
    }
  }

  runSync(command: string, args: readonly string[], input?: string): { stdout: string; stderr: string } {
    return processRunner.runSync('ip', ['netns', 'exec', this.ns, command, ...args], input);
  }

  reset(): void {
    this.spent.restore = 0;
    this.spent.save = 0;
    this.spent.all = 0;
  }
}

function ip(args: string[]): void {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'], timeout: 10_000 });
}

async function timed<T>(f: () => Promise<T>): Promise<[number, T]> {
  const t = performance.now();
  const r = await f();
  return [performance.now() - t, r];
}

function portalOf(runner: CommandRunner): IptablesPortal {
  return new IptablesPortal({ runner, logger: silentLogger(), nodeAddresses, bindAddress: '0.0.0.0', nodePortAddresses: [] });
}

export async function iptablesScaleTrial(ctx: Context, kind: IptablesKind, n: number, run: number): Promise<RunRecord> {
  const record: RunRecord = { workload: workloadId(kind, n), system: 'proxy', run, metrics: {} };
  const ns = `kup-bench-${process.pid}-ipt`;
  ip(['netns', 'add', ns]);
  try {
    ip(['netns', 'exec', ns, 'ip', 'link', 'set', 'lo', 'up']);
    // The node's address, and a route for the ClusterIPs (the nat OUTPUT hook comes after the
    // routing decision, which needs a route to exist); both on loopback, inside the namespace.
    ip(['netns', 'exec', ns, 'ip', 'addr', 'add', `${HOST_IP}/32`, 'dev', 'lo']);
    ip(['netns', 'exec', ns, 'ip', 'route', 'add', '10.96.0.0/12', 'dev', 'lo']);
    // Each command of the portal runs through `ip netns exec` here, which the proxy on a node does
    // not pay: its cost (the least of three) is shown beside the figures that include it.
    const nsExecMs = Math.min(...[0, 1, 2].map(() => {
      const t = performance.now();
      ip(['netns', 'exec', ns, 'true']);
      return performance.now() - t;
    }));
    const runner = new TimedRunner(ns);
    const portal = portalOf(runner);
    await portal.start();
    const all = viewsOf(kind, n + 1);
    const base = all.slice(0, all.length - 1);
    runner.reset();
    const [firstSyncMs, first] = await timed(() => portal.sync(base, false));
    if (first.errors.length > 0) throw new Error(`first sync: ${first.errors[0]}`);
    const firstRestoreMs = runner.spent.restore;
    const firstSaveMs = runner.spent.save;
    runner.reset();
    const [addOneMs, added] = await timed(() => portal.sync(all, false));
    if (added.errors.length > 0) throw new Error(`adding one: ${added.errors[0]}`);
    const addOneRestoreMs = runner.spent.restore;
    const addOneNodeMs = addOneMs - runner.spent.all;
    // A proxy that has run a while has synced before: the same units again (nothing to write),
    // then one more Service, is the add as a running proxy meets it (its code paths warm).
    const [unchangedSyncMs, unchanged] = await timed(() => portal.sync(all, false));
    if (unchanged.errors.length > 0) throw new Error(`unchanged sync: ${unchanged.errors[0]}`);
    // The running Services keep their unit objects, as the proxier's unit set keeps them.
    const more = [...all, ...viewsOf(kind, n + 2, n + 1)];
    runner.reset();
    const [addAnotherMs, another] = await timed(() => portal.sync(more, false));
    if (another.errors.length > 0) throw new Error(`adding another: ${another.errors[0]}`);
    const addAnotherRestoreMs = runner.spent.restore;
    const addAnotherNodeMs = addAnotherMs - runner.spent.all;

    const config: ProbeConfig = { unrelatedPort: UNRELATED_PORT, proxyPort: proxyPortOf(n), portal: { host: clusterIPOf(n), port: 80 }, roundTrips: 2000, connections: 300, seriesMs: 5000 };
    const probed = await ctx.procs.run('ip', ['netns', 'exec', ns, process.execPath, PROBE, JSON.stringify(config)], { cpu: ctx.pin.loadCpus, timeoutMs: 30_000 });
    if (probed.code !== 0) throw new Error(`probe: ${probed.stderr.trim().split('\n').pop() ?? `exit ${probed.code}`}`);
    const p = JSON.parse(probed.stdout) as ProbeResult;

    const again = portalOf(runner);
    const [restartStartMs] = await timed(() => again.start());
    const [restartSyncMs, resynced] = await timed(() => again.sync(more, false));
    if (resynced.errors.length > 0) throw new Error(`restart: ${resynced.errors[0]}`);
    await again.cleanup();
    record.metrics = {
      firstSyncMs,
      firstRestoreMs,
      firstSaveMs,
      addOneMs,
      addOneRestoreMs,
      addOneNodeMs,
      unchangedSyncMs,
      addAnotherMs,
      addAnotherRestoreMs,
      addAnotherNodeMs,
      nsExecMs,
      restartStartMs,
      restartSyncMs,
      rtP50Ms: p.rtP50Ms,
      rtP99Ms: p.rtP99Ms,
      connP50Ms: p.connP50Ms,
      connP99Ms: p.connP99Ms,
      portalConnP50Ms: p.portalConnP50Ms,
      portalConnP99Ms: p.portalConnP99Ms,
    };
  } catch (err) {
    record.error = (err as Error).message;
  } finally {
    try {
      ip(['netns', 'del', ns]);
    } catch (err) {
      ctx.say(`  cannot remove namespace ${ns}: ${(err as Error).message}`);
    }
  }
  return record;
}
