/**
 * Where everything listens during a run. Fixed loopback addresses and ports below the ephemeral
 * range (32768+), so nothing the kernel hands out to other programs collides with them, and every
 * system is reached the same way: one address per system, the same port per workload.
 *
 * KUP_BENCH_LANE=N (1-9; default 0) moves every address and admin port to a set of its own, so
 * that two runs on one machine (engineers sharing it) do not meet. Lane 0 is the layout the
 * README describes.
 */
function lane(v: string | undefined): number {
  const n = Number(v ?? '0');
  if (!Number.isInteger(n) || n < 0 || n > 9) throw new Error(`KUP_BENCH_LANE: "${v ?? ''}" is not a lane (0-9)`);
  return n;
}
export const LANE = lane(process.env.KUP_BENCH_LANE);

export interface HostPort {
  host: string;
  port: number;
}

/** The backends' services: one port each, TCP or UDP. */
export type BenchService = 'http' | 'iperf' | 'sockperf' | 'dns';

export const SERVICES: Readonly<Record<BenchService, { port: number; protocol: 'TCP' | 'UDP' }>> = {
  http: { port: 18080, protocol: 'TCP' },
  iperf: { port: 15201, protocol: 'TCP' },
  sockperf: { port: 11111, protocol: 'UDP' },
  dns: { port: 15353, protocol: 'UDP' },
};

/** Every backend (nginx HTTP, iperf3, sockperf, dnsmasq) listens here. */
export const BACKEND_HOST = `127.${LANE}.50.1`;
/** The endpoint-move probe: the same port answers `A` on BACKEND_HOST and `B` on MOVED_HOST. */
export const MOVED_HOST = `127.${LANE}.50.2`;
export const PROBE_PORT = 18081;

/** The proxy's benchmark Service: ClusterIP 10.77.0.1, served at 127.77.0.1 by --portal loopback. */
export const PROXY_CLUSTER_IP = `10.77.${LANE}.1`;
export const PROXY_HOST = `127.77.${LANE}.1`;
export const HAPROXY_HOST = `127.${LANE}.60.1`;
export const NGINX_STREAM_HOST = `127.${LANE}.70.1`;
/** The proxy's admin server (`GET /services`); off the default 10249 so a running proxy is not in the way. */
export const PROXY_ADMIN: HostPort = { host: '127.0.0.1', port: 19249 + 2 * LANE };
/** The admin address of proxies started for scale runs (the load phase's proxy has stopped by then). */
export const SCALE_ADMIN: HostPort = { host: '127.0.0.1', port: 19250 + 2 * LANE };

/** Scale runs: Services 10.78.c.d, served at 127.78.c.d, all on this port. */
export const SCALE_CLUSTER_PREFIX = `10.${78 + LANE}`;
export const SCALE_LOOPBACK_PREFIX = `127.${78 + LANE}`;
export const SCALE_PORT = 8080;

/** The systems compared, each reached at its own address on the same ports. */
export type SystemId = 'direct' | 'proxy' | 'haproxy' | 'nginx';
export const SYSTEM_IDS: readonly SystemId[] = ['direct', 'proxy', 'haproxy', 'nginx'];

/** How a system is named in tables and charts; `workers` as run with --workers. */
export function systemLabel(id: SystemId, workers = 1): string {
  const n = (one: string, many: string): string => (workers === 1 ? `1 ${one}` : `${workers} ${many}`);
  switch (id) {
    case 'direct':
      return 'direct (no proxy)';
    case 'proxy':
      return workers === 1 ? 'kube-userspace-proxy' : `kube-userspace-proxy (${n('worker', 'workers')})`;
    case 'haproxy':
      return `HAProxy (mode tcp, ${n('thread', 'threads')})`;
    case 'nginx':
      return `nginx stream (${n('worker', 'workers')})`;
  }
}
