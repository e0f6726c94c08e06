import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { findTools, missingLine, type Tools } from '../bench/lib/tools.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import { captureLogger, closedTcpPort, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * PROXY protocol v2 read by real servers that parse it, each answering with the client address it
 * saw, which must be the client's own address and port: nginx's stream module (`listen ...
 * proxy_protocol`, `$proxy_protocol_addr:$proxy_protocol_port`) and HAProxy (`accept-proxy`, `src`
 * and `src_port`). The same packages the benchmarks use (bench/lib/tools.ts finds them); a test
 * is skipped, saying which package is missing, only when the program is not installed.
 */

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

let tools: Tools;
let ipv6 = false;
beforeAll(async () => {
  tools = await findTools();
  ipv6 = await canBind('::1');
});

async function canBind(host: string): Promise<boolean> {
  const s = createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.listen(0, host, () => resolve());
    });
    return true;
  } catch {
    return false;
  } finally {
    s.close();
  }
}

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'kup-pp-servers-'));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Start a program (its output to `logFile`) that the test stops by its pid at the end. */
function run(cmd: string, args: string[], logFile: string): ChildProcess {
  const fd = openSync(logFile, 'a');
  const child = spawn(cmd, args, { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  cleanups.push(() => stop(child));
  child.on('error', () => undefined);
  return child;
}

function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return Promise.resolve();
  return withDeadline(
    new Promise<void>((resolve) => {
      child.once('exit', () => resolve());
      process.kill(child.pid as number, 'SIGTERM');
    }),
    5000,
    `${child.spawnfile} (pid ${child.pid}) to exit`,
  ).catch(() => {
    if (child.exitCode === null) process.kill(child.pid as number, 'SIGKILL');
  });
}

/** A TCP proxy socket with PROXY v2 on, listening on `host`, sending to `server`. */
async function proxyTo(host: string, serverHost: string, serverPort: number): Promise<number> {
  const proxy = new TcpProxySocket({ name: 'default/web:http', balancer: FakeBalancer.of([serverPort], { ip: serverHost }), dialer: new DirectDialer(), logger: captureLogger('warn').logger, proxyProtocol: true });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  return (await proxy.listen({ host, port: 0 })).port;
}

/**
 * Connect through the proxy, send `request` and read to the end; the client's own port with the
 * answer. Retried (bounded) while the server is still starting: the proxy resets the client then.
 */
async function askThrough(host: string, port: number, request: string, child: ChildProcess, errorLog: string): Promise<{ clientPort: number; answer: string }> {
  const deadline = performance.now() + 10_000;
  for (;;) {
    const got = await once(host, port, request);
    if (got !== undefined) return got;
    if (child.exitCode !== null) throw new Error(`${child.spawnfile} exited (${child.exitCode}): ${safeRead(errorLog)}`);
    if (performance.now() > deadline) throw new Error(`no answer through the proxy within 10 s: ${safeRead(errorLog)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function once(host: string, port: number, request: string): Promise<{ clientPort: number; answer: string } | undefined> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    const chunks: Buffer[] = [];
    let clientPort = 0;
    const timer = setTimeout(() => socket.destroy(), 5000);
    socket.on('connect', () => {
      clientPort = socket.localPort as number;
      if (request !== '') socket.write(request);
    });
    socket.on('data', (d: Buffer) => chunks.push(d));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      const answer = Buffer.concat(chunks).toString();
      resolve(answer === '' ? undefined : { clientPort, answer });
    });
  });
}

function safeRead(file: string): string {
  try {
    return readFileSync(file, 'utf8').trim().split('\n').slice(-5).join(' | ');
  } catch {
    return '(no log)';
  }
}

function nginxConf(dir: string, module: string, listen: string): string {
  return [
    module ? `load_module ${module};` : '',
    'daemon off;',
    'master_process off;',
    `pid ${dir}/nginx.pid;`,
    `error_log ${dir}/error.log info;`,
    process.getuid?.() === 0 ? 'user root;' : '',
    'events { worker_connections 64; }',
    'stream {',
    `  server { listen ${listen} proxy_protocol; return "$proxy_protocol_addr:$proxy_protocol_port\\n"; }`,
    '}',
    '',
  ].join('\n');
}

function haproxyConf(bind: string): string {
  return [
    'global',
    '  maxconn 64',
    'defaults',
    '  mode http',
    '  timeout connect 5s',
    '  timeout client 10s',
    '  timeout server 10s',
    'frontend fe',
    `  bind ${bind} accept-proxy`,
    '  http-request return status 200 content-type text/plain lf-string "%[src]:%[src_port]"',
    '',
  ].join('\n');
}

describe('nginx stream, listen ... proxy_protocol', () => {
  for (const family of [4, 6] as const) {
    it(`answers with the client's own address and port (IPv${family})`, async (t) => {
      const missing = missingLine(tools, ['nginx', 'nginx-stream']);
      if (missing !== undefined) t.skip(missing);
      if (family === 6 && !ipv6) t.skip('::1 cannot be bound here');
      const host = family === 4 ? '127.0.0.1' : '::1';
      const serverHost = family === 4 ? '127.0.23.1' : '::1';
      const serverPort = await closedTcpPort(serverHost); // free a moment ago: the server binds it
      const dir = tempDir();
      writeFileSync(join(dir, 'nginx.conf'), nginxConf(dir, tools.found['nginx-stream'] as string, family === 4 ? `${serverHost}:${serverPort}` : `[::1]:${serverPort}`));
      const child = run(tools.found.nginx as string, ['-p', dir, '-c', join(dir, 'nginx.conf'), '-e', join(dir, 'error.log')], join(dir, 'out.log'));
      const port = await proxyTo(host, serverHost, serverPort);
      const { clientPort, answer } = await askThrough(host, port, '', child, join(dir, 'error.log'));
      expect(answer).toBe(`${host}:${clientPort}\n`);
    });
  }
});

describe('HAProxy, bind ... accept-proxy', () => {
  for (const family of [4, 6] as const) {
    it(`answers with the client's own address and port (IPv${family})`, async (t) => {
      const missing = missingLine(tools, ['haproxy']);
      if (missing !== undefined) t.skip(missing);
      if (family === 6 && !ipv6) t.skip('::1 cannot be bound here');
      const host = family === 4 ? '127.0.0.1' : '::1';
      const serverHost = family === 4 ? '127.0.23.2' : '::1';
      const serverPort = await closedTcpPort(serverHost); // free a moment ago: the server binds it
      const dir = tempDir();
      const cfg = join(dir, 'haproxy.cfg');
      writeFileSync(cfg, haproxyConf(family === 4 ? `${serverHost}:${serverPort}` : `ipv6@::1:${serverPort}`));
      const child = run(tools.found.haproxy as string, ['-f', cfg, '-db'], join(dir, 'out.log'));
      const port = await proxyTo(host, serverHost, serverPort);
      const { clientPort, answer } = await askThrough(host, port, 'GET / HTTP/1.0\r\nHost: test\r\n\r\n', child, join(dir, 'out.log'));
      expect(answer).toMatch(/^HTTP\/1\.[01] 200/);
      expect(answer.slice(answer.indexOf('\r\n\r\n') + 4)).toBe(`${host}:${clientPort}`);
    });
  }
});
