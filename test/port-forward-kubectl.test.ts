import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { tcpBackend, withDeadline, type TcpBackend } from './helpers/proxy-fixtures.js';

/**
 * The oracle for the port-forward fixture: the real kubectl (1.32) forwards through it, over the
 * WebSocket tunnel (its default) and over the SPDY upgrade (KUBECTL_PORT_FORWARD_WEBSOCKETS=false).
 * kubectl decodes the fixture's SYN_REPLY header blocks, and the fixture inflates kubectl's real
 * deflate header blocks, so both ends of the fixture's SPDY are checked against Kubernetes' own.
 */

const KUBECTL = '/usr/bin/kubectl';
const haveKubectl = existsSync(KUBECTL);

let api: FakeApiServer;
let echo: TcpBackend;
let dir: string;
const children: ChildProcess[] = [];

beforeEach(async () => {
  api = await FakeApiServer.start();
  // kubectl sends no bearer token to a plain-HTTP server: the fixture serves it without one.
  api.token = undefined;
  echo = await tcpBackend();
  dir = mkdtempSync(join(tmpdir(), 'kup-kubectl-'));
  writeFileSync(join(dir, 'kubeconfig'), api.kubeconfigYaml());
});

afterEach(async () => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.pid !== undefined) c.kill('SIGKILL');
  await api.close();
  await echo.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Starts `kubectl port-forward pod/NAME :PORT`; resolves with the local port it listens on. */
function portForward(pod: string, port: number, websockets: boolean): Promise<{ localPort: number; stderr: () => string; child: ChildProcess }> {
  const child = spawn(KUBECTL, ['--kubeconfig', join(dir, 'kubeconfig'), '--cache-dir', join(dir, 'cache'), '-n', 'default', 'port-forward', '--address', '127.0.0.1', `pod/${pod}`, `:${port}`], {
    env: { PATH: '/usr/bin:/bin', HOME: dir, KUBECTL_PORT_FORWARD_WEBSOCKETS: String(websockets) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let out = '';
  let err = '';
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  const ready = new Promise<number>((resolve, reject) => {
    child.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /Forwarding from 127\.0\.0\.1:(\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    child.once('exit', (code) => reject(new Error(`kubectl exited ${code}: ${err}`)));
  });
  return withDeadline(ready, 15_000, 'kubectl to listen').then((localPort) => ({ localPort, stderr: () => err, child }));
}

/** Connect, write `data`, read as many bytes back (the echo), then close. */
function roundTrip(port: number, data: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: '127.0.0.1', port });
    const got: Buffer[] = [];
    let n = 0;
    s.on('connect', () => s.write(data));
    s.on('data', (d: Buffer) => {
      got.push(d);
      n += d.length;
      if (n >= data.length) {
        s.end();
        resolve(Buffer.concat(got));
      }
    });
    s.on('error', reject);
    s.on('close', () => reject(new Error(`closed after ${n} of ${data.length} bytes`)));
  });
}

describe.skipIf(!haveKubectl)('the port-forward fixture, checked with kubectl', () => {
  for (const websockets of [true, false]) {
    const transport = websockets ? 'websocket' : 'spdy';
    it(`forwards kubectl's connections over ${transport}`, async () => {
      api.portForward.addPod('default', 'web-0', { 80: echo.port });
      const { localPort, stderr } = await portForward('web-0', 80, websockets);
      const payload = Buffer.alloc(256 * 1024, 7);
      for (let i = 0; i < 3; i++) {
        const back = await withDeadline(roundTrip(localPort, payload), 10_000, 'the echo through kubectl').catch((err: unknown) => {
          throw new Error(`${String(err)}; kubectl said: ${stderr()}`);
        });
        expect(back.equals(payload)).toBe(true);
      }
      expect({ opened: api.portForward.opened, refused: api.portForward.refused }).toMatchObject({ opened: { [transport]: 1 }, refused: [] });
      expect(api.portForward.counters.forwards).toBe(3);
    });

    it(`shows kubectl the error stream's message over ${transport}`, async () => {
      // Port 81 of the pod refuses: the fixture writes containerd's message on the error stream.
      api.portForward.addPod('default', 'web-0', { 80: echo.port });
      const { localPort, stderr } = await portForward('web-0', 81, websockets);
      const s = connect({ host: '127.0.0.1', port: localPort });
      s.on('error', () => {});
      s.write('anyone?');
      await withDeadline(new Promise((resolve) => s.once('close', resolve)), 10_000, 'kubectl to close the connection');
      await withDeadline(
        (async () => {
          while (!/connection refused/.test(stderr())) await new Promise((r) => setTimeout(r, 20));
        })(),
        10_000,
        "kubectl's report of the error stream",
      );
      expect(stderr()).toMatch(/error forwarding|an error occurred forwarding|connection refused/i);
    });
  }

  it('answers 404 for a pod that does not exist, as kubectl expects it', async () => {
    const child = spawn(KUBECTL, ['--kubeconfig', join(dir, 'kubeconfig'), '--cache-dir', join(dir, 'cache'), '-n', 'default', 'port-forward', 'pod/nope', ':80'], { env: { PATH: '/usr/bin:/bin', HOME: dir }, stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let err = '';
    child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
    const code = await withDeadline(new Promise<number | null>((resolve) => child.once('exit', resolve)), 15_000, 'kubectl to exit');
    expect(code).not.toBe(0);
    expect(err).toMatch(/pods "nope" not found/);
  });
});
