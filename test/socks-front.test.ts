import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startProxy, type RunningProxy } from '../src/app.js';
import { buildConfig } from '../src/config.js';
import { FrontServer } from '../src/io/front/front-server.js';
import { parseKubeProxyConfiguration, renderKubeProxyConfiguration } from '../src/kube-proxy-config.js';
import { silentLogger } from '../src/log.js';
import { runCli, type Spawned } from './helpers/cli.js';
import { freePort, tcpEchoServer, waitFor } from './helpers/net.js';
import { endpointSlice, list, service } from './helpers/objects.js';
import { withDeadline } from './helpers/proxy-fixtures.js';

/**
 * The SOCKS5 / HTTP CONNECT front end to end, with the real curl: a state file -> the sync loop ->
 * the directory -> the front -> the Service port's proxy socket (handed the client; with
 * --workers, the front connects to the Service's loopback address instead) -> the balancer ->
 * loopback backends. By name and by ClusterIP, through `--socks5-hostname`, `-x socks5h://` and `-p -x
 * http://` (CONNECT); refusals with each protocol's code; an endpoint moved live; 1 MiB
 * byte-identical both ways; a slow handshake cut. Then the CLI as a black box: its flag, its
 * config field and the lines it prints. The byte-level handshake is in front-handshake.test.ts.
 */

interface CurlResult {
  code: number;
  stdout: string;
  stderr: string;
}

function curl(args: string[]): Promise<CurlResult> {
  return new Promise((resolve) => {
    execFile('curl', ['-sS', '--max-time', '10', ...args], { encoding: 'buffer', maxBuffer: 8 << 20 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code) : -1;
      resolve({ code, stdout: stdout.toString('latin1'), stderr: stderr.toString() });
    });
  });
}

/** curl's exit code for a proxy handshake that failed (CURLE_PROXY, curl 7.73 and later). */
const CURLE_PROXY = 97;
/** curl's exit code when the CONNECT response is not 2xx (CURLE_RECV_ERROR). */
const CURLE_RECV_ERROR = 56;

let dir: string;
let stateFile: string;
let webPort: number;
let echoPort: number;
let backendPort: number;
const closers: Array<() => unknown> = [];

/** An HTTP backend that answers GET with its name and echoes a POST's body. */
async function httpBackend(host: string, name: string, port: number): Promise<HttpServer> {
  const server = createHttpServer((req, res) => {
    if (req.method === 'POST') {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      req.pipe(res);
      return;
    }
    res.end(`${name} ${req.url}\n`);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  return server;
}

function objects(webBackend: string): string {
  return list([
    service({ name: 'web', clusterIP: '10.96.57.10', ports: [{ name: 'http', port: webPort }] }),
    endpointSlice({ service: 'web', ports: [{ name: 'http', port: backendPort }], endpoints: [{ ip: webBackend }] }),
    service({ name: 'echo', namespace: 'tools', clusterIP: '10.96.57.11', ports: [{ name: 'tcp', port: echoPort }] }),
    endpointSlice({ service: 'echo', namespace: 'tools', ports: [{ name: 'tcp', port: backendPort }], endpoints: [{ ip: '127.0.57.3' }] }),
  ]);
}

async function writeState(text: string): Promise<void> {
  const tmp = `${stateFile}.tmp`;
  await writeFile(tmp, text);
  await rename(tmp, stateFile);
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-socks-'));
  stateFile = join(dir, 'state.json');
  webPort = await freePort('127.96.57.10');
  echoPort = await freePort('127.96.57.11');
  backendPort = await freePort('127.0.57.1');
  const a = await httpBackend('127.0.57.1', 'a', backendPort);
  const b = await httpBackend('127.0.57.2', 'b', backendPort);
  const echo = await tcpEchoServer('127.0.57.3', '', backendPort);
  for (const server of [a, b]) {
    closers.push(() => {
      server.closeAllConnections();
      return new Promise((r) => server.close(r));
    });
  }
  closers.push(() => echo.close());
  await writeState(objects('127.0.57.1'));
});

afterAll(async () => {
  for (const c of closers) await c();
  await rm(dir, { recursive: true, force: true });
});

/** Everything a raw client reads until the front or the Service closes. */
function readAll(s: Socket): Promise<Buffer> {
  const chunks: Buffer[] = [];
  s.on('data', (d: Buffer) => chunks.push(d));
  return withDeadline(new Promise((resolve, reject) => {
    s.on('error', reject);
    s.on('close', () => resolve(Buffer.concat(chunks)));
  }), 10_000, 'the connection to close');
}

describe('the SOCKS/CONNECT front, in-process', () => {
  let proxy: RunningProxy;
  let front: string;

  beforeAll(async () => {
    const config = buildConfig({ state: stateFile, metricsBindAddress: '127.0.0.1:0', healthzBindAddress: '127.0.0.1:0', iptablesMinSyncPeriod: '0s', logLevel: 'silent', socksBindAddress: '127.0.0.1:0' });
    proxy = await startProxy(config, silentLogger());
    front = proxy.names.socksAddress!;
  });

  afterAll(() => proxy.stop(100));

  it('reaches a Service by each of its names and by ClusterIP: curl --socks5-hostname, -x socks5h://, -p -x http://', async () => {
    for (const host of ['web.default', 'web.default.svc', 'web.default.svc.cluster.local', '10.96.57.10']) {
      const url = `http://${host}:${webPort}/path`;
      for (const args of [['--socks5-hostname', front, url], ['-x', `socks5h://${front}`, url], ['-p', '-x', `http://${front}`, url]]) {
        const r = await curl(args);
        expect(r, args.join(' ')).toMatchObject({ code: 0, stdout: 'a /path\n' });
      }
    }
  });

  it('refuses a name no Service has with SOCKS5 0x04 (curl exit 97) and CONNECT 404', async () => {
    const socks = await curl(['--socks5-hostname', front, `http://nope.default:${webPort}/`]);
    expect(socks.code).toBe(CURLE_PROXY);
    expect(socks.stderr).toMatch(/SOCKS5.*\(4\)/);
    const connectReq = await curl(['-p', '-x', `http://${front}`, `http://nope.default:${webPort}/`]);
    expect(connectReq.code).toBe(CURLE_RECV_ERROR);
    expect(connectReq.stderr).toContain('404');
    // A ClusterIP without that port, and a name outside the cluster (0x02, 403).
    expect((await curl(['--socks5-hostname', front, `http://10.96.57.10:${webPort + 1}/`])).stderr).toMatch(/\(4\)/);
    const outside = await curl(['--socks5-hostname', front, 'http://www.example.org/']);
    expect(outside.code).toBe(CURLE_PROXY);
    expect(outside.stderr).toMatch(/\(2\)/);
    expect((await curl(['-p', '-x', `http://${front}`, 'http://www.example.org/'])).stderr).toContain('403');
  });

  it('answers a proxy request that is not CONNECT with 405', async () => {
    // Without -p, curl sends GET http://... to an HTTP proxy.
    const r = await curl(['-x', `http://${front}`, '-o', '/dev/null', '-w', '%{http_code}', `http://web.default:${webPort}/`]);
    expect(r).toMatchObject({ code: 0, stdout: '405' });
  });

  it('follows an endpoint moved live: the next connection goes to the new backend', async () => {
    const url = `http://web.default:${webPort}/`;
    expect((await curl(['--socks5-hostname', front, url])).stdout).toBe('a /\n');
    await writeState(objects('127.0.57.2'));
    await waitFor(async () => (await curl(['--socks5-hostname', front, url])).stdout === 'b /\n', 'the front to reach the moved endpoint');
    expect(await curl(['-p', '-x', `http://${front}`, url])).toMatchObject({ code: 0, stdout: 'b /\n' });
    await writeState(objects('127.0.57.1'));
    await waitFor(async () => (await curl(['--socks5-hostname', front, url])).stdout === 'a /\n', 'the endpoint to move back');
  });

  it('carries 1 MiB both ways byte for byte, through curl (SOCKS5 and CONNECT)', async () => {
    const body = randomBytes(1 << 20);
    const file = join(dir, 'body.bin');
    await writeFile(file, body);
    for (const proxyArgs of [['--socks5-hostname', front], ['-p', '-x', `http://${front}`]]) {
      const out = join(dir, 'out.bin');
      const r = await curl([...proxyArgs, '-H', 'Expect:', '--data-binary', `@${file}`, '-o', out, `http://web.default:${webPort}/`]);
      expect(r.code, r.stderr).toBe(0);
      expect((await readFile(out)).equals(body), proxyArgs.join(' ')).toBe(true);
    }
  });

  it('forwards the bytes sent with the request in the same packet, and passes the half-close on (raw SOCKS5, 1 MiB)', async () => {
    const payload = randomBytes(1 << 20);
    const name = Buffer.from('echo.tools');
    const port = Buffer.alloc(2);
    port.writeUInt16BE(echoPort);
    const s = connect({ host: '127.0.0.1', port: Number(front.split(':')[1]), allowHalfOpen: true });
    const all = readAll(s);
    // Greeting, request and the first 64 KiB in one write; the rest after; then our FIN.
    s.write(Buffer.concat([Buffer.from([5, 1, 0, 5, 1, 0, 3, name.length]), name, port, payload.subarray(0, 65536)]));
    s.end(payload.subarray(65536));
    const got = await all;
    expect(got.subarray(0, 2)).toEqual(Buffer.from([5, 0]));
    expect(got.subarray(2, 6)).toEqual(Buffer.from([5, 0, 0, 1]));
    // The echo Service answers after our FIN (it ends when we do): every byte came back.
    expect(got.subarray(12).equals(payload)).toBe(true);
  });

  it('forwards what follows a CONNECT head, raw', async () => {
    const s = connect({ host: '127.0.0.1', port: Number(front.split(':')[1]), allowHalfOpen: true });
    const all = readAll(s);
    s.end(`CONNECT echo.tools:${echoPort} HTTP/1.1\r\nHost: echo.tools:${echoPort}\r\n\r\nhello`);
    expect((await all).toString()).toBe('HTTP/1.1 200 Connection established\r\n\r\nhello');
  });

  describe('bounds, on a front of its own with a short handshake deadline', () => {
    let server: FrontServer;
    let port: number;

    // No handOffs: the front of a proxy with --workers, whose units live in other processes.
    beforeAll(async () => {
      server = new FrontServer({ resolver: proxy.names.directory, domain: 'cluster.local', logger: silentLogger(), handshakeTimeoutMs: 300, maxHeaderBytes: 1024, maxConnections: 3 });
      port = (await server.listen('127.0.0.1', 0)).port;
    });

    afterAll(() => server.close());

    it('without the unit set at hand (as with --workers), connects to the Service\'s loopback address', async () => {
      const before = proxy.units.stats().find((u) => u.unit.id === 'default/web:http')!.stats.accepted;
      expect(await curl(['--socks5-hostname', `127.0.0.1:${port}`, `http://web.default:${webPort}/w`])).toMatchObject({ code: 0, stdout: 'a /w\n' });
      // Accepted by the port's listener, as any local client is.
      expect(proxy.units.stats().find((u) => u.unit.id === 'default/web:http')!.stats.accepted).toBe(before + 1);
    });

    it('closes a client that sends nothing, and one that trickles its head', async () => {
      const idle = connect({ host: '127.0.0.1', port });
      expect(await readAll(idle)).toEqual(Buffer.alloc(0));
      const head = `CONNECT web.default:${webPort} HTTP/1.1\r\nHost: web.default\r\n\r\n`;
      const slow = connect({ host: '127.0.0.1', port });
      let sent = 0;
      const timer = setInterval(() => {
        if (sent < head.length && !slow.destroyed) slow.write(head[sent++]!);
      }, 20);
      try {
        expect(await readAll(slow)).toEqual(Buffer.alloc(0));
        expect(sent).toBeLessThan(head.length);
      } finally {
        clearInterval(timer);
      }
    });

    it('refuses a head over the limit with 431', async () => {
      const s = connect({ host: '127.0.0.1', port });
      const all = readAll(s);
      s.write(`CONNECT web.default:${webPort} HTTP/1.1\r\nX-Padding: ${'a'.repeat(2048)}`);
      expect((await all).toString()).toMatch(/^HTTP\/1\.1 431 /);
    });

    it('holds at most maxConnections: past it, a new connection is closed at accept', async () => {
      // The earlier tests' connections are gone on the front's side too.
      await waitFor(async () => (await server.connectionCount()) === 0, 'the front to have no connection');
      const open: Socket[] = [];
      try {
        for (let i = 0; i < 3; i++) {
          const s = connect({ host: '127.0.0.1', port });
          open.push(s);
          s.on('error', () => undefined);
          await new Promise((r) => s.once('connect', r));
          // Through the greeting: the front has accepted it.
          s.write(Buffer.from([5, 1, 0]));
          await new Promise((r) => s.once('data', r));
        }
        const extra = connect({ host: '127.0.0.1', port });
        extra.on('error', () => undefined);
        extra.write(Buffer.from([5, 1, 0]));
        expect(await readAll(extra).catch(() => Buffer.alloc(0))).toEqual(Buffer.alloc(0));
      } finally {
        for (const s of open) s.destroy();
      }
    });
  });
});

describe('the SOCKS/CONNECT front, from the command line', () => {
  let cli: Spawned | undefined;

  afterAll(() => cli?.kill());

  it('prints how to use it, and the printed curl line works', async () => {
    const socksPort = await freePort('127.0.0.1');
    cli = runCli(['--state', stateFile, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--socks-bind-address', `127.0.0.1:${socksPort}`]);
    const line = await cli.waitForLine(/kube-userspace-proxy started/);
    expect(JSON.parse(line)).toMatchObject({ socks: `127.0.0.1:${socksPort}` });
    await waitFor(() => cli!.stderr().includes('HTTPS_PROXY'), 'the lines for the user');
    const hints = cli.stderr();
    expect(hints).toContain(`ALL_PROXY=socks5h://127.0.0.1:${socksPort}`);
    expect(hints).toContain(`HTTPS_PROXY=http://127.0.0.1:${socksPort}`);
    const printed = /curl --socks5-hostname (\S+) (\S+)/.exec(hints);
    expect(printed?.[1]).toBe(`127.0.0.1:${socksPort}`);
    expect(await curl(['--socks5-hostname', printed![1]!, printed![2]!])).toMatchObject({ code: 0 });
    cli.child.kill('SIGTERM');
    expect(await cli.exited).toBe(0);
  });

  it('names the flag of a bad value in one line', async () => {
    for (const [args, message] of [
      [['--socks-bind-address', 'nowhere:1080'], '--socks-bind-address: "nowhere" in "nowhere:1080" is not an IP address'],
      [['--socks-bind-address', '127.0.0.1:99999'], '--socks-bind-address: port "99999"'],
    ] as const) {
      const r = runCli([...args]);
      expect(await r.exited, args.join(' ')).toBe(2);
      expect(r.stderr().startsWith(`kube-userspace-proxy: ${message}`), r.stderr()).toBe(true);
      expect(r.stderr().trimEnd().split('\n')).toHaveLength(1);
    }
  });

  it('says which flag when the address cannot be listened on', async () => {
    const taken = await tcpEchoServer('127.0.0.1');
    try {
      const r = runCli(['--state', stateFile, '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--socks-bind-address', `127.0.0.1:${(taken.server.address() as AddressInfo).port}`]);
      expect(await r.exited).toBe(1);
      expect(r.stderr()).toContain(`--socks-bind-address 127.0.0.1:${taken.port}: cannot listen: the address is in use by another process`);
    } finally {
      await taken.close();
    }
  });
});

describe('the SOCKS/CONNECT front in the configuration file', () => {
  it('reads socksBindAddress under kubeUserspaceProxy, defaults its port to 1080, and writes it back', () => {
    const text = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nkubeUserspaceProxy:\n  socksBindAddress: 127.0.0.1:1081\n';
    const { options } = parseKubeProxyConfiguration(text, 'proxy.yaml');
    expect(options).toMatchObject({ socksBindAddress: '127.0.0.1:1081' });
    const config = buildConfig(options);
    expect(config.socksBindAddress).toEqual({ host: '127.0.0.1', port: 1081 });
    expect(buildConfig(parseKubeProxyConfiguration(renderKubeProxyConfiguration(config), 'written.yaml').options)).toEqual(config);
    expect(buildConfig({ socksBindAddress: '127.0.0.1' }).socksBindAddress).toEqual({ host: '127.0.0.1', port: 1080 });
    expect(buildConfig({}).socksBindAddress).toBeUndefined();
    expect(() => parseKubeProxyConfiguration(text.replace('127.0.0.1:1081', 'nowhere:1080'), 'proxy.yaml')).toThrow('proxy.yaml: kubeUserspaceProxy.socksBindAddress: "nowhere"');
  });
});
