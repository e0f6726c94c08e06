import { createSocket } from 'node:dgram';
import { afterEach, describe, expect, it } from 'vitest';
import { serveFloor } from '../bench/floor-relay.js';
import { exchange, tcpBackend, udpEcho, withDeadline } from './helpers/proxy-fixtures.js';

/**
 * bench/floor-relay.ts, the bare Node relay the bench runs in the proxy's place to show what
 * Node's sockets cost alone: it must relay, or its figures mean nothing.
 */

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

describe('floor relay', () => {
  it('relays TCP both ways, half-close included, and UDP datagrams each way, to the same port on the backend host', async () => {
    const tcp = await tcpBackend('127.0.0.1');
    cleanups.push(() => tcp.close());
    const udp = await udpEcho('127.0.0.1', 'echo');
    cleanups.push(() => udp.close());
    const close = await serveFloor(
      [
        { port: tcp.port, protocol: 'TCP' },
        { port: udp.port, protocol: 'UDP' },
      ],
      '127.0.0.2',
      '127.0.0.1',
    );
    cleanups.push(close);

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
    // Three at once: the second and third arrive before the relay's socket to the backend is connected.
    for (const q of ['a', 'b', 'c']) client.send(q, udp.port, '127.0.0.2');
    await withDeadline(three, 5000, 'three UDP replies through the floor relay');
    expect(replies.sort()).toEqual(['echo:a', 'echo:b', 'echo:c']);
  });
});
