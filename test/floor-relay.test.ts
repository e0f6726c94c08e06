import { spawn } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { serveFloor } from '../bench/floor-relay.js';
import { exchange, tcpBackend, udpEcho, withDeadline } from './helpers/proxy-fixtures.js';

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

/** Whether nothing holds host:port any more: a listener without SO_REUSEPORT binds there. */
function portFree(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen({ host, port }, () => probe.close(() => resolve(true)));
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
    // Lane 9 of the bench's addresses: the relay on 127.77.9.1, the backend on 127.9.50.1, port 18080 (the bench's HTTP).
    const backend = createServer((s) => s.end('from backend'));
    await new Promise<void>((resolve, reject) => {
      backend.once('error', reject);
      backend.listen({ host: '127.9.50.1', port: 18080 }, resolve);
    });
    cleanups.push(() => new Promise((resolve) => backend.close(resolve)));
    const relay = spawn(process.execPath, [RELAY, '--state', 'ignored.json', '--workers', '2', '--metrics-bind-address', '127.0.0.1:19267'], {
      env: { ...process.env, KUP_BENCH_LANE: '9' },
      stdio: 'ignore',
    });
    const exited = new Promise<number | null>((resolve) => relay.once('exit', resolve));
    cleanups.push(() => relay.exitCode === null && relay.kill('SIGKILL'));
    let status: { services: unknown[] } | undefined;
    const deadline = Date.now() + 10_000;
    while (status === undefined && Date.now() < deadline) {
      status = await fetch('http://127.0.0.1:19267/services').then(
        async (r) => (await r.json()) as { services: unknown[] },
        () => new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 50)),
      );
    }
    expect(status?.services).toHaveLength(4);
    // Ready means both workers serve: two children, and the port relays.
    expect(childrenOf(relay.pid as number)).toHaveLength(2);
    expect((await exchange(18080, '', '127.77.9.1')).toString()).toBe('from backend');
    expect(await portFree('127.77.9.1', 18080)).toBe(false);
    relay.kill('SIGTERM');
    expect(await withDeadline(exited, 5000, 'the floor relay to exit on SIGTERM')).toBe(0);
    // Its workers went with it: nothing holds the ports.
    expect(await portFree('127.77.9.1', 18080)).toBe(true);
    expect(await portFree('127.77.9.1', 15201)).toBe(true);
  });
});
