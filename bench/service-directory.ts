/**
 * What the directory of running Services costs to rebuild (core/service-directory.ts): once after
 * each sync that opened, closed or recreated units, at the first DNS query, hosts-file write or
 * resolve() that follows. Interleaved with a reference loop (one Map.set of a fresh object per
 * unit), so a figure from a busy machine can be read as a ratio.
 *
 *   npm run build && node dist/bench/service-directory.js [--services N] [--rounds N]
 */
import { ServiceDirectory, type DirectoryUnit } from '../src/core/service-directory.js';

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  const v = i >= 0 ? Number(process.argv[i + 1]) : NaN;
  return Number.isFinite(v) && v > 0 ? v : fallback;
}

const SERVICES = arg('services', 10_000);
const ROUNDS = arg('rounds', 40);

// Half the Services have two ports, as a cluster's mix roughly does: 1.5 units per Service.
const units: DirectoryUnit[] = [];
const loopback = new Map<string, string>();
for (let i = 0; i < SERVICES; i++) {
  const ip = `10.${96 + (i >> 16)}.${(i >> 8) & 0xff}.${(i & 0xff) + 1}`;
  const service = `ns${i % 50}/svc${i}`;
  loopback.set(service, `127.${ip.slice(3)}`);
  units.push({ service, servicePort: `${service}:http`, protocol: 'TCP', portals: [{ kind: 'clusterIP', ip, port: 80 }] });
  if (i % 2 === 0) units.push({ service, servicePort: `${service}:grpc`, protocol: 'TCP', portals: [{ kind: 'clusterIP', ip, port: 9090 }] });
}
// As app.ts passes them: a fresh array of the unit set's views, the loopback portal's address.
const directory = new ServiceDirectory({
  domain: 'cluster.local',
  units: () => units.map((u) => u),
  clientAddresses: (service) => {
    const a = loopback.get(service);
    return a === undefined ? [] : [a];
  },
});

const rebuild: number[] = [];
const reference: number[] = [];
const hosts: number[] = [];
for (let r = 0; r < ROUNDS; r++) {
  let t0 = performance.now();
  directory.invalidate();
  directory.get('ns0', 'svc0');
  rebuild.push(performance.now() - t0);
  t0 = performance.now();
  const m = new Map<string, { protocol: string; service: string }>();
  for (const u of units) m.set(u.servicePort, { protocol: u.protocol, service: u.service });
  reference.push(performance.now() - t0);
  t0 = performance.now();
  directory.hostsLines();
  hosts.push(performance.now() - t0);
}

function summary(xs: number[]): string {
  const s = [...xs].sort((a, b) => a - b);
  return `median ${s[s.length >> 1]!.toFixed(1)} ms, min ${s[0]!.toFixed(1)} ms`;
}

console.log(`${SERVICES} Services, ${units.length} units, ${ROUNDS} rounds`);
console.log(`rebuild:            ${summary(rebuild)}`);
console.log(`reference loop:     ${summary(reference)}`);
console.log(`hosts-file lines:   ${summary(hosts)} (only with --hosts-file)`);
