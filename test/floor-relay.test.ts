import { spawn } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { serveFloor } from '../bench/floor-relay.js';
import { exchange, tcpBackend, udpEcho, withDeadline } from './helpers/proxy-fixtures.js';
import { portFree } from './helpers/net.js';

/**
 * bench/floor-relay.ts, the bare relay the bench runs in the proxy's place to show what the
 * proxy's design costs on Node alone: it must relay, and leave nothing behind, or its figures
 * mean nothing.
 */

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

const RELAY = fileURLToPath(new URL('../dist/bench/floor-relay.js', import.meta.url));

/** Whether nothing holds host:port (UDP): a socket without SO_REUSEPORT binds there. */
function udpPortFree(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createSocket('udp4');
    probe.once('error', () => {
      probe.close();
      resolve(false);
    });
    probe.bind(port, host, () => probe.close(() => resolve(true)));
  });
}

/** The PIDs whose parent is `pid` (/proc/PID/stat's fourth field). */
function childrenOf(pid: number): number[] {
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .filter((d) => {
      try {
        const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
        return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === pid;
      } catch {
        return false; // gone meanwhile
      }
    })
    .map(Number);
}

describe('floor relay', () => {
  it('relays TCP both ways with half-close, and UDP datagrams each way, queued while its socket to the backend connects', async () => {
    const tcp = await tcpBackend('127.0.0.1');
    cleanups.push(() => tcp.close());
    const udp = await udpEcho('127.0.0.1', 'echo');
    cleanups.push(() => udp.close());
    cleanups.push(await serveFloor([{ port: tcp.port, protocol: 'TCP' }], '127.0.0.2', '127.0.0.1'));
    // A name, so that the relay's connect() waits on a real lookup and the datagrams behind the first are queued.
    cleanups.push(await serveFloor([{ port: udp.port, protocol: 'UDP' }], '127.0.0.2', 'localhost'));

    // The echo answers what it got and ends when the client ends: both directions and both FINs.
    expect((await exchange(tcp.port, 'ping over tcp', '127.0.0.2')).toString()).toBe('ping over tcp');

    const client = createSocket('udp4');
    cleanups.push(() => client.close());
    const replies: string[] = [];
    const three = new Promise<void>((resolve) =>
      client.on('message', (m) => {
        replies.push(m.toString());
        if (replies.length === 3) resolve();
      }),
    );
    for (const q of ['a', 'b', 'c']) client.send(q, udp.port, '127.0.0.2');
    await withDeadline(three, 5000, 'three UDP replies through the floor relay');
    expect(replies.sort()).toEqual(['echo:a', 'echo:b', 'echo:c']);
  });

  it('with --workers 2 answers the harness once both workers serve, relays, and frees the ports when stopped', async () => {
    // Addresses of this run's own, off the bench's lanes: the relay's listener and its backend.
    const octet = (): number => 2 + Math.floor(Math.random() * 250);
    const listenHost = `127.${200 + (process.pid % 50)}.${octet()}.${octet()}`;
    const backendHost = `127.${200 + (process.pid % 50)}.${octet()}.1`;
    const backend = createServer((s) => s.end('from backend'));
    await new Promise<void>((resolve, reject) => {
      backend.once('error', reject);
      backend.listen({ host: backendHost, port: 18080 }, resolve); // the bench's HTTP port
    });
    cleanups.push(() => new Promise((resolve) => backend.close(resolve)));
    const relay = spawn(process.execPath, [RELAY, '--state', 'ignored.json', '--workers', '2', '--metrics-bind-address', '127.0.0.1:0'], {
      env: { ...process.env, FLOOR_RELAY_HOSTS: `${listenHost},${backendHost}` },
      stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
    });
    let stderr = '';
    relay.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    // A spawn that fails emits 'error' and maybe no 'exit': either ends the wait.
    const exited = new Promise<number | null>((resolve) => {
      relay.once('exit', resolve);
      relay.once('error', () => resolve(null));
    });
    cleanups.push(async () => {
      if (relay.exitCode === null && relay.signalCode === null) relay.kill('SIGKILL');
      await exited;
    });
    // Ready (its admin port said over IPC) or gone: whichever comes first.
    const ready = await withDeadline(
      Promise.race([new Promise<number>((resolve) => relay.once('message', (m: { admin: number }) => resolve(m.admin))), exited.then((code) => Promise.reject(new Error(`the floor relay exited (${code}): ${stderr}`)))]),
      10_000,
      'the floor relay to be ready',
    );
    const status = (await (await fetch(`http://127.0.0.1:${ready}/services`, { signal: AbortSignal.timeout(2000) })).json()) as { services: unknown[] };
    expect(status.services).toHaveLength(4);
    // Ready means both workers serve: two children, and the port relays.
    expect(childrenOf(relay.pid as number)).toHaveLength(2);
    expect((await exchange(18080, '', listenHost)).toString()).toBe('from backend');
    expect(await portFree(listenHost, 18080)).toBe(false);
    expect(await udpPortFree(listenHost, 15353)).toBe(false);
    relay.kill('SIGTERM');
    expect(await withDeadline(exited, 5000, 'the floor relay to exit on SIGTERM')).toBe(0);
    // Its workers went with it: nothing holds the ports.
    expect(await portFree(listenHost, 18080)).toBe(true);
    expect(await portFree(listenHost, 15201)).toBe(true);
    expect(await udpPortFree(listenHost, 11111)).toBe(true);
    expect(await udpPortFree(listenHost, 15353)).toBe(true);
  });
});
