import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { netnsSkipReason, nsExec, reportSkip, run } from './helpers/netns.js';

/**
 * Why the hand-over turns on net.ipv4.tcp_migrate_req (docs/handover.md): two listeners of one
 * SO_REUSEPORT group, as the old and the new process hold them during a hand-over; the "old" one
 * has connections waiting in its accept queue (its event loop is busy) when it closes. With the
 * sysctl they move to the other listener; without it they are reset. In a namespace of the
 * test's own, where the sysctl is set either way.
 */
reportSkip('handover-migrate.test.ts', netnsSkipReason);

const PORT = 18090;
const LISTENER = String.raw`
const net = require('node:net');
const [name, port] = process.argv.slice(1);
const srv = net.createServer((s) => { s.on('error', () => undefined); s.end(name); });
srv.listen({ host: '127.0.0.1', port: Number(port), reusePort: true }, () => process.stdout.write('listening\n'));
process.stdin.on('data', () => {
  // Busy: the kernel completes handshakes into the accept queue, nobody accepts them. Then close.
  process.stdout.write('blocking\n');
  const until = Date.now() + 2500;
  while (Date.now() < until);
  srv.close();
  process.stdout.write('closed\n');
});`;

const CLIENT = String.raw`
const net = require('node:net');
const [port, count] = process.argv.slice(1).map(Number);
const r = { A: 0, B: 0, reset: 0, other: 0 };
Promise.all(Array.from({ length: count }, () => new Promise((resolve) => {
  let got = '';
  const s = net.connect({ host: '127.0.0.1', port });
  s.setTimeout(8000, () => { r.other++; s.destroy(); resolve(); });
  s.on('data', (d) => { got += d; });
  s.on('end', () => { if (got === 'A' || got === 'B') r[got]++; else r.other++; resolve(); });
  s.on('error', (e) => { if (e.code === 'ECONNRESET') r.reset++; else r.other++; resolve(); });
}))).then(() => process.stdout.write(JSON.stringify(r)));`;

describe('listeners of a SO_REUSEPORT group closing with connections queued', () => {
  const cleanups: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  async function scenario(tag: string, migrate: '0' | '1'): Promise<{ A: number; B: number; reset: number; other: number }> {
    const ns = `kup-${process.pid}-${tag}`;
    await run('ip', ['netns', 'add', ns]);
    cleanups.push(() => run('ip', ['netns', 'del', ns]).catch(() => undefined));
    await nsExec(ns, 'ip', ['link', 'set', 'lo', 'up']);
    await nsExec(ns, 'sh', ['-c', `echo ${migrate} > /proc/sys/net/ipv4/tcp_migrate_req`]);
    const start = (name: string): { out: () => string; wait: (re: RegExp) => Promise<void>; poke: () => void } => {
      const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', LISTENER, name, String(PORT)], { stdio: ['pipe', 'pipe', 'ignore'] });
      cleanups.push(async () => {
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
        if (child.exitCode === null && child.signalCode === null) await new Promise((r) => child.once('exit', r));
      });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      return {
        out: () => out,
        wait: (re) => new Promise((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`${name}: no ${re}: ${out}`)), 10_000);
          const check = (): void => {
            if (!re.test(out)) return;
            clearTimeout(timer);
            child.stdout.off('data', check);
            resolve();
          };
          child.stdout.on('data', check);
          check();
        }),
        poke: () => child.stdin.write('go\n'),
      };
    };
    const a = start('A');
    await a.wait(/listening/);
    const b = start('B');
    await b.wait(/listening/);
    a.poke();
    await a.wait(/blocking/);
    const { stdout } = await nsExec(ns, process.execPath, ['-e', CLIENT, String(PORT), '200'], { timeoutMs: 20_000 });
    await a.wait(/closed/);
    return JSON.parse(stdout) as { A: number; B: number; reset: number; other: number };
  }

  it.skipIf(netnsSkipReason !== undefined)('tcp_migrate_req=1: the queued connections move to the listener that stays; none is reset', async () => {
    const r = await scenario('mig1', '1');
    expect(r).toMatchObject({ A: 0, reset: 0, other: 0, B: 200 });
  }, 60_000);

  it.skipIf(netnsSkipReason !== undefined)('tcp_migrate_req=0: the queued connections are reset (what a hand-over without it risks)', async () => {
    const r = await scenario('mig0', '0');
    expect(r.reset).toBeGreaterThan(0);
    expect(r.reset + r.B).toBe(200);
  }, 60_000);
});
