import { BACKEND_HOST, MOVED_HOST, PROBE_PORT, SERVICES, type BenchService } from './plan.js';

/**
 * Configuration files of the C programs, rendered as text (pure). Each runs from its own temp
 * directory: pid file, logs and temp paths there, so no system service or file is touched.
 */

/** Lines every nginx instance shares. `module` is the stream module to load, '' when built in. */
function nginxHead(dir: string, module: string | undefined, asRoot: boolean, workers = 1): string {
  return [
    module ? `load_module ${module};` : '',
    'daemon off;',
    'master_process on;',
    `worker_processes ${workers};`,
    `pid ${dir}/nginx.pid;`,
    `error_log ${dir}/error.log warn;`,
    asRoot ? 'user root;' : '',
    // 9,000 proxied connections are 18,000 descriptors in one worker.
    'worker_rlimit_nofile 20000;',
    'events { worker_connections 19500; }',
  ].filter(Boolean).join('\n');
}

/**
 * The HTTP backend: a 3-byte answer on the bench port (keep-alive for as long as a run lasts), and
 * the endpoint-move probe, which answers `A` on one address and `B` on the other. With
 * `proxyProtocol`, the bench port expects a PROXY protocol header first (nginx reads v1 and v2).
 */
export function nginxBackendConf(dir: string, asRoot: boolean, proxyProtocol = false): string {
  return `${nginxHead(dir, undefined, asRoot)}
http {
  access_log off;
  client_body_temp_path ${dir}/client_body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  keepalive_requests 100000000;
  keepalive_timeout 600s;
  server { listen ${BACKEND_HOST}:${SERVICES.http.port} backlog=4096${proxyProtocol ? ' proxy_protocol' : ''}; location / { return 200 "ok\\n"; } }
  server { listen ${BACKEND_HOST}:${PROBE_PORT} backlog=4096; location / { return 200 "A"; } }
  server { listen ${MOVED_HOST}:${PROBE_PORT} backlog=4096; location / { return 200 "B"; } }
}
`;
}

/**
 * nginx's stream proxy, one worker, as a user would write it for TCP and UDP. UDP is left at the
 * defaults (a session per client address, ended by proxy_timeout), which is the same shape as the
 * proxy's sessions; `proxy_responses 1` would add a session per datagram. With `proxyProtocol`,
 * each TCP connection to the backend begins with a PROXY header (nginx sends version 1, the text
 * one: it has no v2 sender), so nginx does the same work as the proxy with the annotation.
 */
export function nginxStreamConf(dir: string, module: string, asRoot: boolean, host: string, services: readonly BenchService[], workers = 1, proxyProtocol = false): string {
  // Several workers each listen with SO_REUSEPORT, as the proxy's --workers do.
  const reuse = workers > 1 ? ' reuseport' : '';
  const servers = services.map((s) => {
    const { port, protocol } = SERVICES[s];
    const header = proxyProtocol && protocol === 'TCP' ? ' proxy_protocol on;' : '';
    return `  server { listen ${host}:${port}${protocol === 'UDP' ? ' udp' : ' backlog=4096'}${reuse}; proxy_pass ${BACKEND_HOST}:${port};${header} }`;
  });
  return `${nginxHead(dir, module, asRoot, workers)}
stream {
  proxy_timeout 10m;
${servers.join('\n')}
}
`;
}

/**
 * HAProxy in TCP mode, one thread. maxconn is what the 20,000-descriptor limit allows (HAProxy
 * asks for two descriptors per connection plus a few). HAProxy 2.6 does not proxy UDP. With
 * `proxyProtocol`, each connection to the backend begins with a PROXY v2 header (send-proxy-v2).
 */
export function haproxyConf(host: string, services: readonly BenchService[], threads = 1, proxyProtocol = false): string {
  const blocks = services
    .filter((s) => SERVICES[s].protocol === 'TCP')
    .map((s) => {
      const { port } = SERVICES[s];
      return `frontend fe_${s}
  bind ${host}:${port}
  default_backend be_${s}
backend be_${s}
  server s1 ${BACKEND_HOST}:${port}${proxyProtocol ? ' send-proxy-v2' : ''}`;
    });
  return `global
  nbthread ${threads}
  maxconn 9900
defaults
  mode tcp
  timeout connect 5s
  timeout client 10m
  timeout server 10m
  backlog 4096
${blocks.join('\n')}
`;
}

/** dnsmasq's hosts file and the matching dnsperf query file: `names` A records. */
export function dnsData(names: number): { hosts: string; queries: string } {
  const hosts: string[] = [];
  const queries: string[] = [];
  for (let i = 1; i <= names; i++) {
    hosts.push(`10.200.${i >> 8}.${i & 0xff} host${i}.bench.test`);
    queries.push(`host${i}.bench.test A`);
  }
  return { hosts: `${hosts.join('\n')}\n`, queries: `${queries.join('\n')}\n` };
}
