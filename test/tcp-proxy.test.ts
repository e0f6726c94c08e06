import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { LoadBalancer } from '../src/core/balancer/load-balancer.js';
import { type Endpoint, toEndpoint } from '../src/core/model.js';
import type { Dialer, DialRequest } from '../src/seams/dialer.js';
import { DirectDialer } from '../src/io/net/direct-dialer.js';
import { TcpProxySocket } from '../src/io/net/tcp-proxy.js';
import { FakeBalancer } from './helpers/fake-balancer.js';
import {
  captureLogger,
  clientOutcome,
  closedTcpPort,
  connectTo,
  exchange,
  openFdCount,
  tcpBackend,
  unresponsiveTcpPort,
  waitUntil,
  withDeadline,
  type LogRecord,
} from './helpers/proxy-fixtures.js';

const LO = '127.0.0.1';
const MiB = 1024 * 1024;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function backend(...args: Parameters<typeof tcpBackend>): ReturnType<typeof tcpBackend> {
  const b = await tcpBackend(...args);
  cleanups.push(() => b.close());
  return b;
}

interface Setup {
  proxy: TcpProxySocket;
  port: number;
  records: LogRecord[];
}

async function proxyFor(balancer: LoadBalancer, opts: { dialer?: Dialer; dialTimeoutsMs?: number[]; level?: 'debug' | 'warn' } = {}): Promise<Setup> {
  const { logger, records } = captureLogger(opts.level ?? 'warn');
  const proxy = new TcpProxySocket({
    name: 'default/web:http',
    balancer,
    dialer: opts.dialer ?? new DirectDialer(),
    logger,
    ...(opts.dialTimeoutsMs ? { dialTimeoutsMs: opts.dialTimeoutsMs } : {}),
  });
  cleanups.push(async () => {
    proxy.destroyAll();
    await proxy.close();
  });
  const { port } = await proxy.listen({ host: LO, port: 0 });
  return { proxy, port, records };
}

const drained = (proxy: TcpProxySocket): Promise<void> => withDeadline(proxy.drained(), 5000, 'the proxy to drain');
const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

describe('DirectDialer', () => {
  const request = (port: number, timeoutMs: number): DialRequest => ({
    endpoint: toEndpoint({ ip: LO, port }),
    clientAddress: LO,
    clientPort: 1,
    localAddress: LO,
    localPort: 2,
    timeoutMs,
  });

  it('resolves with a connected, half-open-capable socket', async () => {
    const echo = await backend();
    const socket = await new DirectDialer().dial(request(echo.port, 1000));
    expect(socket.remotePort).toBe(echo.port);
    expect(socket.allowHalfOpen).toBe(true);
    socket.destroy();
  });

  it('rejects with the system error when refused', async () => {
    await expect(new DirectDialer().dial(request(await closedTcpPort(), 1000))).rejects.toMatchObject({ code: 'ECONNREFUSED' });
  });

  it('gives up after the timeout with code ETIMEDOUT', async () => {
    const hang = await unresponsiveTcpPort();
    cleanups.push(() => hang.close());
    const started = performance.now();
    await expect(new DirectDialer().dial(request(hang.port, 100))).rejects.toMatchObject({ code: 'ETIMEDOUT' });
    expect(performance.now() - started).toBeGreaterThanOrEqual(95);
    expect(performance.now() - started).toBeLessThan(2000);
  });

  it('lets the proxy move on from an endpoint that times out', async () => {
    const hang = await unresponsiveTcpPort();
    cleanups.push(() => hang.close());
    const echo = await backend();
    const balancer = FakeBalancer.of([hang.port, echo.port], { sticky: true });
    const { proxy, port } = await proxyFor(balancer, { dialTimeoutsMs: [100, 1000] });
    expect((await exchange(port, 'late')).toString()).toBe('late');
    await drained(proxy);
    expect(proxy.stats.dialFailures).toEqual({ refused: 0, timeout: 1, unreachable: 0, other: 0 });
    expect(balancer.calls.map((c) => c.reset)).toEqual([false, true]);
  });
});

describe('TcpProxySocket: proxying', () => {
  it('echoes through the proxy and counts the connection at close', async () => {
    const echo = await backend();
    const balancer = FakeBalancer.of([echo.port]);
    const { proxy, port, records } = await proxyFor(balancer, { level: 'debug' });

    expect((await exchange(port, 'hello')).toString()).toBe('hello');
    await drained(proxy);

    expect(proxy.stats).toMatchObject({ accepted: 1, active: 0, dialAttempts: 1, dialExhausted: 0, bytesToEndpoint: 5, bytesToClient: 5, dialLatencyCount: 1 });
    expect(balancer.calls).toEqual([{ clientIP: LO, reset: false, picked: `${LO}:${echo.port}` }]);
    expect(balancer.released).toEqual([`${LO}:${echo.port}`]);
    expect(records.map((r) => r.msg)).toEqual(expect.arrayContaining(['connected', 'connection closed']));
    expect(records.every((r) => r.service === 'default/web:http')).toBe(true);
  });

  it('serves several listeners from one instance, and unlisten closes only one', async () => {
    const echo = await backend();
    const { proxy, port } = await proxyFor(FakeBalancer.of([echo.port]));
    const second = await proxy.listen({ host: LO, port: 0 });
    const v6 = await proxy.listen({ host: '::1', port: 0 });
    expect(proxy.addresses()).toEqual([{ host: LO, port }, second, v6]);

    expect((await exchange(port, 'a')).toString()).toBe('a');
    expect((await exchange(second.port, 'b')).toString()).toBe('b');
    expect((await exchange(v6.port, 'c', '::1')).toString()).toBe('c');

    await proxy.unlisten(second);
    await proxy.unlisten(second); // already gone is not a failure
    await expect(exchange(second.port, 'x')).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    expect((await exchange(port, 'd')).toString()).toBe('d');
    expect(proxy.stats.accepted).toBe(4);
  });

  it('retries a refused dial on a fresh endpoint, with sessionAffinityReset', async () => {
    const dead = await closedTcpPort();
    const echo = await backend();
    // Sticky: without the reset flag the retry would get the dead endpoint again.
    const balancer = FakeBalancer.of([dead, echo.port], { sticky: true });
    const { proxy, port } = await proxyFor(balancer);

    expect((await exchange(port, 'retry me')).toString()).toBe('retry me');
    await drained(proxy);

    expect(balancer.calls.map((c) => [c.reset, c.picked])).toEqual([
      [false, `${LO}:${dead}`],
      [true, `${LO}:${echo.port}`],
    ]);
    expect(proxy.stats.dialAttempts).toBe(2);
    expect(proxy.stats.dialFailures).toEqual({ refused: 1, timeout: 0, unreachable: 0, other: 0 });
    expect(balancer.released).toEqual([`${LO}:${dead}`, `${LO}:${echo.port}`]);
  });

  it('resets the client at once when there are no endpoints', async () => {
    const { proxy, port } = await proxyFor(new FakeBalancer([]));
    const out = await clientOutcome(port, LO, 'anyone?');
    expect(out.code).toBe('ECONNRESET');
    expect(out.ms).toBeLessThan(1000);
    await drained(proxy);
    expect(proxy.stats).toMatchObject({ accepted: 1, active: 0, noEndpointRejects: 1, dialAttempts: 0 });
  });

  it('resets the client when every dial fails, after one attempt per timeout', async () => {
    const balancer = FakeBalancer.of([await closedTcpPort(), await closedTcpPort()], { sticky: true });
    const { proxy, port } = await proxyFor(balancer);
    const out = await clientOutcome(port, LO, 'data');
    expect(out.code).toBe('ECONNRESET');
    await drained(proxy);
    expect(balancer.calls.map((c) => c.reset)).toEqual([false, true, true, true]);
    expect(proxy.stats).toMatchObject({ dialAttempts: 4, dialExhausted: 1, noEndpointRejects: 0, active: 0 });
    expect(proxy.stats.dialFailures.refused).toBe(4);
    expect(balancer.released).toHaveLength(4);
  });

  it('passes each dial its timeout from the ladder and counts timeouts', async () => {
    const seen: number[] = [];
    const dialer: Dialer = {
      dial: (req) => {
        seen.push(req.timeoutMs);
        return new Promise((_, reject) => setTimeout(() => reject(Object.assign(new Error('timed out'), { code: 'ETIMEDOUT' })), req.timeoutMs));
      },
    };
    const { proxy, port } = await proxyFor(FakeBalancer.of([1, 2]), { dialer, dialTimeoutsMs: [10, 20, 40] });
    expect((await clientOutcome(port)).code).toBe('ECONNRESET');
    await drained(proxy);
    expect(seen).toEqual([10, 20, 40]);
    expect(proxy.stats.dialFailures.timeout).toBe(3);
    expect(proxy.stats.dialExhausted).toBe(1);
  });
  it('takes a dialer that throws for one that rejects: retried, then the client is reset', async () => {
    const dialer: Dialer = {
      dial: () => {
        throw Object.assign(new Error('bad port'), { code: 'ERR_SOCKET_BAD_PORT' });
      },
    };
    const { proxy, port } = await proxyFor(FakeBalancer.of([1, 2]), { dialer, dialTimeoutsMs: [10, 20] });
    expect((await clientOutcome(port)).code).toBe('ECONNRESET');
    await drained(proxy);
    expect(proxy.stats).toMatchObject({ dialAttempts: 2, dialExhausted: 1, active: 0 });
    expect(proxy.stats.dialFailures.other).toBe(2);
  });
});

describe('TcpProxySocket: half-close and bulk data', () => {
  it('delivers the whole reply to a client that ended its sending side', async () => {
    const echo = await backend();
    const { proxy, port } = await proxyFor(FakeBalancer.of([echo.port]));
    const payload = randomBytes(MiB);
    const reply = await exchange(port, payload);
    expect(sha256(reply)).toBe(sha256(payload));
    await drained(proxy);
  });

  it('passes on a reply the endpoint writes after the client FIN', async () => {
    const late = await backend(LO, (s) => {
      let n = 0;
      s.on('data', (d: Buffer) => (n += d.length));
      s.on('end', () => {
        s.write(`got ${n}`);
        setImmediate(() => s.end(', bye'));
      });
    });
    const { proxy, port } = await proxyFor(FakeBalancer.of([late.port]));
    expect((await exchange(port, 'x'.repeat(1000))).toString()).toBe('got 1000, bye');
    await drained(proxy);
  });

  it('carries 10 MiB each way at once, byte-identical', async () => {
    const up = randomBytes(10 * MiB);
    const down = randomBytes(10 * MiB);
    let serverSaw!: (hash: string) => void;
    const serverHash = new Promise<string>((resolve) => (serverSaw = resolve));
    const peer = await backend(LO, (s) => {
      const h = createHash('sha256');
      s.on('data', (d: Buffer) => h.update(d));
      s.on('end', () => serverSaw(h.digest('hex')));
      s.end(down);
    });
    const { proxy, port } = await proxyFor(FakeBalancer.of([peer.port]));

    const { socket, got } = await connectTo(port);
    socket.end(up);
    const [received, upHash] = await withDeadline(Promise.all([got.ended, serverHash]), 20_000, '10 MiB each way');
    socket.destroy();
    expect(upHash).toBe(sha256(up));
    expect(sha256(received)).toBe(sha256(down));
    await drained(proxy);
    expect(proxy.stats.bytesToEndpoint).toBe(10 * MiB);
    expect(proxy.stats.bytesToClient).toBe(10 * MiB);
  });
});

describe('TcpProxySocket: the endpoint-to-client path (one shared read buffer)', () => {
  /**
   * The endpoint's bytes are read into one buffer shared by every connection and copied out before
   * they are written on. Slow readers make the writes to the clients go asynchronous (and the reads
   * stop and resume); two connections at once make each read land where the other's just was.
   */
  it('delivers every byte to slow readers on two connections at once', async () => {
    const replies = [randomBytes(8 * MiB), randomBytes(8 * MiB)];
    let next = 0;
    const peer = await backend(LO, (s) => {
      const reply = replies[next++] as Buffer;
      s.resume(); // the client's request is not needed
      s.end(reply);
    });
    const { proxy, port } = await proxyFor(FakeBalancer.of([peer.port]));

    const readSlowly = async (): Promise<Buffer> => {
      const socket = connect({ port, host: LO, allowHalfOpen: true });
      const chunks: Buffer[] = [];
      socket.on('data', (chunk: Buffer) => {
        chunks.push(chunk);
        // A pause per chunk of about 1 ms lets the proxy's writes back up.
        socket.pause();
        setTimeout(() => socket.resume(), 1);
      });
      socket.end('send it');
      await withDeadline(new Promise((resolve, reject) => socket.on('end', resolve).on('error', reject)), 30_000, 'the slow read');
      socket.destroy();
      return Buffer.concat(chunks);
    };
    const got = await Promise.all([readSlowly(), readSlowly()]);
    // Which connection got which reply depends on accept order; the set must match byte for byte.
    expect(got.map(sha256).sort()).toEqual(replies.map(sha256).sort());
    await drained(proxy);
    expect(proxy.stats.bytesToClient).toBe(16 * MiB);
  });

  it("passes the endpoint's FIN on while the client keeps sending", async () => {
    let serverGot!: (text: string) => void;
    const received = new Promise<string>((resolve) => (serverGot = resolve));
    const early = await backend(LO, (s) => {
      let text = '';
      s.setEncoding('utf8');
      s.on('data', (d: string) => (text += d));
      s.on('end', () => serverGot(text));
      s.end('bye first');
    });
    const { proxy, port } = await proxyFor(FakeBalancer.of([early.port]));
    const { socket, got } = await connectTo(port);
    expect((await withDeadline(got.ended, 5000, "the endpoint's FIN")).toString()).toBe('bye first');
    socket.write('still ');
    socket.end('talking');
    expect(await withDeadline(received, 5000, 'the client data after the FIN')).toBe('still talking');
    await drained(proxy);
    socket.destroy();
  });
});

describe('TcpProxySocket: a dialer that hands the socket over late', () => {
  /** Resolves only once the endpoint has sent its reply and FIN, as a slow tunnel or header-writing dialer might. */
  class LateDialer extends DirectDialer {
    override async dial(req: DialRequest): Promise<Socket> {
      const socket = await super.dial(req);
      await new Promise((resolve) => socket.once('end', resolve));
      return socket;
    }
  }

  it("passes on the endpoint's reply and FIN that came before the hand-over", async () => {
    const early = await backend(LO, (s) => {
      s.resume();
      s.end('hello');
    });
    const { proxy, port } = await proxyFor(FakeBalancer.of([early.port]), { dialer: new LateDialer() });
    const { socket, got } = await connectTo(port);
    expect((await withDeadline(got.ended, 5000, "the endpoint's FIN")).toString()).toBe('hello');
    socket.end();
    await drained(proxy);
    socket.destroy();
  });
});

describe('TcpProxySocket: a dialer that hands over a socket that failed meanwhile', () => {
  it('resets the client and lets the connection go', async () => {
    // The endpoint resets the connection when the dialer says so (a header it did not like, say).
    const peer = await backend(LO, (s) => {
      s.once('data', () => s.resetAndDestroy());
    });
    // The dialer owns the socket, and its errors, until it resolves: it sees the reset and hands over anyway.
    const dialer: Dialer = {
      dial: async (req) => {
        const socket = await new DirectDialer().dial(req);
        const failed = new Promise((resolve) => socket.once('error', resolve));
        socket.write('header');
        await failed;
        await new Promise((resolve) => socket.once('close', resolve));
        return socket;
      },
    };
    const { proxy, port } = await proxyFor(FakeBalancer.of([peer.port]), { dialer });
    const outcome = await clientOutcome(port);
    expect(outcome.code).toBe('ECONNRESET');
    await drained(proxy);
    expect(proxy.stats.active).toBe(0);
  });
});

describe('TcpProxySocket: a dialer that fails after the endpoint spoke', () => {
  it('resets the client rather than retrying: a second endpoint would continue the first one\'s stream', async () => {
    const greeter = await backend(LO, (s) => {
      s.resume();
      s.write('hello from A');
    });
    const echo = await backend();
    const balancer = FakeBalancer.of([greeter.port, echo.port]);
    let first = true;
    // The first dial lets the endpoint's greeting through to the client, then fails (a reply it did not like, say).
    const dialer: Dialer = {
      dial: async (req) => {
        if (!first) return new DirectDialer().dial(req);
        first = false;
        const onread = req.onread;
        if (onread === undefined) throw new Error('expected an onread');
        let relayed!: () => void;
        const greeted = new Promise<void>((resolve) => (relayed = resolve));
        const socket = await new DirectDialer().dial({
          ...req,
          onread: {
            buffer: onread.buffer,
            callback: (n, buf) => {
              const more = onread.callback(n, buf);
              relayed();
              return more;
            },
          },
        });
        await greeted;
        socket.destroy();
        throw Object.assign(new Error('bad greeting'), { code: 'EPROTO' });
      },
    };
    const { proxy, port } = await proxyFor(balancer, { dialer });
    const { socket, got } = await connectTo(port);
    socket.write('x');
    await expect(withDeadline(got.ended, 5000, 'the reset')).rejects.toMatchObject({ code: 'ECONNRESET' });
    await drained(proxy);
    socket.destroy();
    expect(balancer.calls).toHaveLength(1);
    expect(balancer.released).toEqual([`${LO}:${greeter.port}`]);
    expect(proxy.stats).toMatchObject({ dialAttempts: 1, dialExhausted: 1, active: 0 });
  });
});

describe('TcpProxySocket: a dialer that hands the socket over after backpressure', () => {
  it('reads on when the client drained before the hand-over', async () => {
    const reply = randomBytes(8 * MiB);
    const peer = await backend(LO, (s) => {
      s.resume();
      s.end(reply);
    });
    let accepted = 0;
    let stoppedAt!: (n: number) => void;
    const stopped = new Promise<number>((resolve) => (stoppedAt = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    // Holds the socket until the test says so, and notes when the relay first stopped reading.
    const dialer: Dialer = {
      dial: async (req) => {
        const onread = req.onread;
        if (onread === undefined) throw new Error('expected an onread');
        const callback = onread.callback;
        const socket = await new DirectDialer().dial({
          ...req,
          onread: {
            buffer: onread.buffer,
            callback: (n, buf) => {
              accepted += n;
              const more = callback(n, buf);
              if (more === false) stoppedAt(accepted);
              return more;
            },
          },
        });
        await released;
        return socket;
      },
    };
    const { proxy, port } = await proxyFor(FakeBalancer.of([peer.port]), { dialer });
    const { socket, got } = await connectTo(port);
    socket.pause(); // not read: the proxy's writes to it back up until the relay stops reading
    socket.end();
    const relayed = await withDeadline(stopped, 5000, 'the relay to stop reading');
    socket.resume();
    // Everything relayed so far reached the client: its socket in the proxy has drained.
    await got.until(relayed);
    await new Promise((resolve) => setImmediate(resolve));
    release();
    expect(sha256(await withDeadline(got.ended, 10_000, 'the rest of the reply'))).toBe(sha256(reply));
    await drained(proxy);
    socket.destroy();
  });
});

describe('TcpProxySocket: the client address', () => {
  /** Records what the proxy asks, and dials directly. */
  class RecordingDialer extends DirectDialer {
    readonly seen: { clientAddress: string; clientPort: number; localAddress: string; localPort: number }[] = [];
    override dial(req: DialRequest): Promise<Socket> {
      this.seen.push({ clientAddress: req.clientAddress, clientPort: req.clientPort, localAddress: req.localAddress, localPort: req.localPort });
      return super.dial(req);
    }
  }

  it('is not looked up for a balancer without client affinity, yet a dialer that asks gets it', async () => {
    const echo = await backend();
    const balancer = FakeBalancer.of([echo.port]); // not sticky: picks ignore the client
    const dialer = new RecordingDialer();
    const { proxy, port } = await proxyFor(balancer, { dialer });
    const { socket, got } = await connectTo(port);
    const clientPort = socket.localPort;
    socket.end('who');
    expect((await withDeadline(got.ended, 5000, 'the echo')).toString()).toBe('who');
    await drained(proxy);
    expect(balancer.calls).toEqual([{ clientIP: '', reset: false, picked: `${LO}:${echo.port}` }]);
    expect(dialer.seen).toEqual([{ clientAddress: LO, clientPort, localAddress: LO, localPort: port }]);
  });

  it('is looked up for a retry when affinity was switched on while the first dial ran', async () => {
    const echo = await backend();
    const balancer = FakeBalancer.of([1, echo.port]); // port 1: refused, so the first dial fails
    let first = true;
    const dialer: Dialer = {
      dial: (req) => {
        if (first) {
          first = false;
          balancer.sticky = true; // the Service's sessionAffinity became ClientIP meanwhile
        }
        return new DirectDialer().dial(req);
      },
    };
    const { port } = await proxyFor(balancer, { dialer });
    expect((await exchange(port, 'me')).toString()).toBe('me');
    expect(balancer.calls.map((c) => c.clientIP)).toEqual(['', LO]);
  });

  it('is handed to a balancer with client affinity', async () => {
    const echo = await backend();
    const balancer = FakeBalancer.of([echo.port], { sticky: true });
    const { port } = await proxyFor(balancer);
    expect((await exchange(port, 'me')).toString()).toBe('me');
    expect(balancer.calls.map((c) => c.clientIP)).toEqual([LO]);
  });
});

describe('TcpProxySocket: lifecycle', () => {
  it('close() stops accepting while an established connection lives on and completes', async () => {
    const echo = await backend();
    const { proxy, port } = await proxyFor(FakeBalancer.of([echo.port]));
    const { socket, got } = await connectTo(port);
    socket.write('one');
    await got.until(3);

    await proxy.close();
    expect(proxy.addresses()).toEqual([]);
    await expect(connectTo(port)).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    expect(proxy.active()).toBe(1);

    socket.end('two');
    expect((await withDeadline(got.ended, 5000, 'the rest')).toString()).toBe('onetwo');
    await drained(proxy);
    expect(proxy.active()).toBe(0);
  });

  it('destroyAll() resets what remains on both sides', async () => {
    const echo = await backend();
    const { proxy, port } = await proxyFor(FakeBalancer.of([echo.port]));
    const conns = [await connectTo(port), await connectTo(port)];
    for (const { socket, got } of conns) {
      socket.write('hi');
      await got.until(2);
    }
    expect(proxy.active()).toBe(2);

    proxy.destroyAll();
    for (const { got } of conns) await expect(withDeadline(got.ended, 5000, 'the reset')).rejects.toMatchObject({ code: 'ECONNRESET' });
    await drained(proxy);
    await waitUntil(() => echo.open.size === 0, 'the endpoint side to be cut');
    for (const { socket } of conns) socket.destroy();
  });

  it('leaves no descriptor behind after a batch of connections, failed ones included', async () => {
    const echo = await backend();
    // Every first dial is refused and every retry lands on the echo, however the dials interleave.
    const balancer = new FirstDialRefused([toEndpoint({ ip: LO, port: await closedTcpPort() }), toEndpoint({ ip: LO, port: echo.port })]);
    const { proxy, port } = await proxyFor(balancer);
    await exchange(port, 'warm-up');
    await drained(proxy);
    const before = openFdCount();

    for (let batch = 0; batch < 5; batch++) {
      const replies = await Promise.all(Array.from({ length: 10 }, (_, i) => exchange(port, `m${batch}.${i}`)));
      expect(replies.map(String)).toEqual(Array.from({ length: 10 }, (_, i) => `m${batch}.${i}`));
    }
    balancer.setEndpoints([]);
    for (let i = 0; i < 5; i++) expect((await clientOutcome(port)).code).toBe('ECONNRESET');

    await drained(proxy);
    await waitUntil(() => echo.open.size === 0 && openFdCount() <= before, `descriptors back to ${before} (now ${openFdCount()})`);
    expect(proxy.stats).toMatchObject({ noEndpointRejects: 5, dialExhausted: 0, dialAttempts: 102 });
  });
});

/** Picks the first endpoint on a first pick and the second on every retry. */
class FirstDialRefused extends FakeBalancer {
  protected override pick(_clientIP: string, reset: boolean): Endpoint | undefined {
    return this.endpoints[reset ? 1 : 0];
  }
}

/** The soft and hard RLIMIT_NOFILE of this process, from /proc. */
function nofileLimits(): { soft: string; hard: string } {
  const line = readFileSync('/proc/self/limits', 'utf8').split('\n').find((l) => l.startsWith('Max open files'));
  const [soft, hard] = (line ?? '').replace('Max open files', '').trim().split(/\s+/);
  if (!soft || !hard) throw new Error(`cannot read the descriptor limit: ${line}`);
  return { soft, hard };
}

function setNofile(soft: string | number, hard: string): void {
  execFileSync('prlimit', ['--pid', String(process.pid), `--nofile=${soft}:${hard}`], { stdio: 'ignore' });
}

describe('TcpProxySocket: descriptor exhaustion', () => {
  it('survives running out of descriptors and serves again once they free up', async () => {
    const echo = await backend();
    const { proxy, port, records } = await proxyFor(FakeBalancer.of([echo.port]));
    const held: Awaited<ReturnType<typeof connectTo>>[] = [];
    const fillers: number[] = [];
    const original = nofileLimits();
    const fdWarning = (): boolean => records.some((r) => r.msg.startsWith('out of file descriptors'));
    let outcomes: string[] = [];
    try {
      // Fillers shift the alignment: each connection costs four descriptors here (client, accepted,
      // dialed, backend's), and only running dry at the dial is visible to the proxy (libuv absorbs
      // an accept EMFILE itself by closing the pending connection with a reserved descriptor).
      for (let i = 0; i < 6; i++) fillers.push(openSync('/dev/null', 'r'));
      setNofile(openFdCount() + 20, original.hard);
      outcomes = await exhaust(port, held, fillers, fdWarning, proxy);
      expect(fdWarning()).toBe(true);
      expect(proxy.addresses()).toHaveLength(1);
    } finally {
      for (const { socket } of held) socket.destroy();
      for (const fd of fillers.splice(0)) closeSync(fd);
      await drained(proxy);
      await waitUntil(() => echo.open.size === 0, 'the backend to let go');
      setNofile(original.soft, original.hard);
    }
    expect(outcomes).toContain('ok');
    expect(outcomes).toContain('EMFILE-at-dial');
    expect(proxy.stats.dialFailures.other).toBeGreaterThan(0);
    expect((await exchange(port, 'alive again')).toString()).toBe('alive again');
  });
});

/**
 * Open echoing connections (kept open) until the proxy reports running out of descriptors at a
 * dial; after each failure free one filler so the next attempt runs dry one step later. Bounded.
 */
async function exhaust(port: number, held: Awaited<ReturnType<typeof connectTo>>[], fillers: number[], warned: () => boolean, proxy: TcpProxySocket): Promise<string[]> {
  const outcomes: string[] = [];
  for (let attempt = 0; attempt < 40 && !warned(); attempt++) {
    const conn = await echoOnce(port);
    if (conn) {
      held.push(conn);
      outcomes.push('ok');
      continue;
    }
    await waitUntil(() => proxy.active() === held.length, 'the failed connection to be released');
    outcomes.push(warned() ? 'EMFILE-at-dial' : 'failed');
    const fd = fillers.pop();
    if (fd !== undefined) closeSync(fd);
  }
  return outcomes;
}

/** One echoed round trip on a connection left open; undefined when the connection failed anyway. */
async function echoOnce(port: number): Promise<Awaited<ReturnType<typeof connectTo>> | undefined> {
  let conn: Awaited<ReturnType<typeof connectTo>> | undefined;
  try {
    conn = await connectTo(port);
    conn.socket.write('x');
    await Promise.race([conn.got.until(1, 3000), conn.got.ended.then(() => Promise.reject(new Error('ended')))]);
    return conn;
  } catch {
    conn?.socket.destroy();
    return undefined;
  }
}
