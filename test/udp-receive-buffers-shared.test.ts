import { spawn, type ChildProcess } from 'node:child_process';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { ServicePortStats } from '../src/core/stats.js';
import { parseProcNetUdp } from '../src/io/net/proc-net-udp.js';
import { UdpReceiveBuffers } from '../src/io/net/udp-receive-buffers.js';
import { silentLogger } from '../src/log.js';
import { withDeadline } from './helpers/proxy-fixtures.js';

/**
 * With `--workers`, every worker binds each UDP listener's address (SO_REUSEPORT), and
 * /proc/net/udp lists one line per worker's socket: a worker must count its own socket's drops
 * only, found by inode, not every socket's on that address.
 */

const LO = '127.0.0.1';
const cleanups: Array<() => void> = [];

afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

async function bindReusePort(port: number): Promise<UdpSocket> {
  const s = createSocket({ type: 'udp4', reusePort: true });
  await new Promise<void>((resolve, reject) => {
    s.once('error', reject);
    s.bind(port, LO, () => resolve());
  });
  cleanups.push(() => s.close());
  return s;
}

/** Another process on the same address, stopped (SIGSTOP) so its small buffer fills and drops. */
async function stoppedSibling(port: number): Promise<ChildProcess> {
  const script = `const s = require('node:dgram').createSocket({ type: 'udp4', reusePort: true });
    s.bind(${port}, '${LO}', () => { s.setRecvBufferSize(2048); process.stdout.write('ready\\n'); });`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  cleanups.push(() => child.kill('SIGKILL'));
  await withDeadline(new Promise((resolve) => child.stdout?.once('data', resolve)), 10_000, 'the sibling to bind');
  child.kill('SIGSTOP');
  return child;
}

function dropsOn(port: number): number {
  return parseProcNetUdp(readFileSync('/proc/net/udp', 'utf8')).get(`${LO}:${port}`) ?? 0;
}

describe('UDP receive-buffer drops on an address shared with other processes', () => {
  it.skipIf(process.platform !== 'linux')("counts this process's socket's drops, not a sibling's", async () => {
    const ours = await bindReusePort(0);
    const port = ours.address().port;
    ours.on('message', () => undefined); // reads everything: drops nothing
    const stats = new ServicePortStats();
    const shared = new UdpReceiveBuffers({ logger: silentLogger(), sharedAddresses: true });
    shared.watch(ours, { host: LO, port }, stats);
    // What one proxy process counts (an address names one socket): here it would take the sibling's.
    const naive = new ServicePortStats();
    const unshared = new UdpReceiveBuffers({ logger: silentLogger(), bytes: 0 });
    unshared.watch(ours, { host: LO, port }, naive);
    await shared.refresh();
    await unshared.refresh();
    await stoppedSibling(port);
    // Datagrams from many client ports: the kernel hashes some to the sibling, whose buffer fills.
    const clients = await Promise.all(Array.from({ length: 16 }, async () => {
      const c = createSocket('udp4');
      await new Promise<void>((resolve) => c.bind(0, LO, () => resolve()));
      cleanups.push(() => c.close());
      return c;
    }));
    for (let round = 0; round < 200 && dropsOn(port) === 0; round++) {
      for (const c of clients) c.send(Buffer.alloc(512), port, LO);
      await new Promise((r) => setImmediate(r));
    }
    expect(dropsOn(port)).toBeGreaterThan(0);
    await shared.refresh();
    await unshared.refresh();
    expect(stats.udpReceiveBufferDrops).toBe(0);
    expect(naive.udpReceiveBufferDrops).toBeGreaterThan(0);

    // Now our own socket drops too: a small buffer, and a sender in another process while this
    // event loop is blocked.
    ours.setRecvBufferSize(4096);
    const sender = spawn(process.execPath, ['-e', `const d = require('node:dgram');
      const socks = Array.from({ length: 16 }, () => d.createSocket('udp4'));
      let n = 0; for (let r = 0; r < 300; r++) for (const s of socks) s.send(Buffer.alloc(512), ${port}, '${LO}', () => { if (++n === 4800) process.exit(0); });`], { stdio: 'ignore' });
    cleanups.push(() => sender.kill('SIGKILL'));
    const exited = new Promise((resolve) => sender.once('exit', resolve));
    const until = performance.now() + 1500;
    while (performance.now() < until) {
      // Blocked on purpose: nothing reads our socket meanwhile.
    }
    await withDeadline(exited, 10_000, 'the sender to finish');
    await shared.refresh();
    await unshared.refresh();
    expect(stats.udpReceiveBufferDrops).toBeGreaterThan(0);
    expect(stats.udpReceiveBufferDrops).toBeLessThan(naive.udpReceiveBufferDrops);
    expect(naive.udpReceiveBufferDrops).toBe(dropsOn(port));
  });
});
