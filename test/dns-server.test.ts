import { execFile, spawnSync } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import { connect } from 'node:net';
import { promisify } from 'node:util';
import dnsPacket from 'dns-packet';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answerDnsQuery } from '../src/core/dns-answer.js';
import { ServiceDirectory, type DirectoryUnit } from '../src/core/service-directory.js';
import { DnsServer } from '../src/io/dns/dns-server.js';
import { silentLogger } from '../src/log.js';
import { seeded } from './helpers/seeded.js';

/**
 * The responder on real loopback sockets, asked by real clients: dig (Debian's bind9-dnsutils) over
 * UDP and TCP, and Node's own resolver (c-ares).
 */
const run = promisify(execFile);
const HAVE_DIG = spawnSync('dig', ['-v']).status === 0;

const units: DirectoryUnit[] = [];
function unit(service: string, portName: string, port: number, clusterIPs: string[], protocol = 'TCP'): DirectoryUnit {
  return { service, servicePort: `${service}:${portName}`, protocol, portals: clusterIPs.map((ip) => ({ kind: 'clusterIP' as const, ip, port })) };
}
const directory = new ServiceDirectory({ domain: 'cluster.local', units: () => units, clientAddresses: (_s, ips) => ips.map((ip) => (ip.includes(':') ? ip : ip.replace(/^10\./, '127.'))) });
let server: DnsServer;
let port: number;

beforeAll(async () => {
  units.push(unit('default/web', 'http', 80, ['10.96.0.10', 'fd00::10']), unit('kube-system/kube-dns', 'dns', 53, ['10.96.0.53'], 'UDP'));
  server = new DnsServer({ logger: silentLogger(), handler: (m, transport) => answerDnsQuery(m, { directory, ttlSeconds: 5, transport, ready: true }) });
  port = (await server.listen('127.0.0.1', 0)).port;
});

afterAll(async () => {
  await server?.close();
});

async function dig(...args: string[]): Promise<string> {
  const { stdout } = await run('dig', [`@127.0.0.1`, '-p', String(port), '+time=2', '+tries=1', ...args]);
  return stdout;
}

function resolver(): Resolver {
  const r = new Resolver({ timeout: 2000, tries: 1 });
  r.setServers([`127.0.0.1:${port}`]);
  return r;
}

describe(HAVE_DIG ? 'DNS responder, asked by dig' : 'DNS responder, asked by dig: skipped, dig not found (apt-get install bind9-dnsutils)', () => {
  it.skipIf(!HAVE_DIG)('answers A over UDP and TCP, and AAAA', async () => {
    expect((await dig('+short', 'web.default.svc.cluster.local')).trim()).toBe('127.96.0.10');
    expect((await dig('+short', '+tcp', 'web.default.svc.cluster.local')).trim()).toBe('127.96.0.10');
    expect((await dig('+short', 'AAAA', 'Web.Default.Svc')).trim()).toBe('fd00::10');
    const full = await dig('+tcp', 'web.default');
    expect(full).toMatch(/status: NOERROR/);
    expect(full).toMatch(/flags: qr aa rd;/);
    expect(full).toMatch(/\(TCP\)/);
  });

  it.skipIf(!HAVE_DIG)('answers SRV, NXDOMAIN with an SOA, and REFUSED', async () => {
    expect((await dig('+short', 'SRV', '_http._tcp.web.default.svc.cluster.local')).trim()).toBe('0 100 80 web.default.svc.cluster.local.');
    const nx = await dig('nope.default.svc.cluster.local');
    expect(nx).toMatch(/status: NXDOMAIN/);
    expect(nx).toMatch(/cluster\.local\.\s+5\s+IN\s+SOA\s+ns\.dns\.cluster\.local\./);
    expect(await dig('+tcp', 'example.com')).toMatch(/status: REFUSED/);
  });

  it.skipIf(!HAVE_DIG)('follows a change of the running Services', async () => {
    units.push(unit('default/late', 'http', 8080, ['10.96.0.77']));
    directory.invalidate();
    expect((await dig('+short', 'late.default.svc.cluster.local')).trim()).toBe('127.96.0.77');
    units.pop();
    directory.invalidate();
    expect(await dig('late.default.svc.cluster.local')).toMatch(/status: NXDOMAIN/);
  });
});

describe('DNS responder, asked by Node\'s resolver', () => {
  it('resolves A, AAAA and SRV, and reports an unknown name as not found', async () => {
    const r = resolver();
    expect(await r.resolve4('web.default.svc.cluster.local')).toEqual(['127.96.0.10']);
    expect(await r.resolve6('web.default.svc.cluster.local')).toEqual(['fd00::10']);
    expect(await r.resolveSrv('_dns._udp.kube-dns.kube-system.svc.cluster.local')).toMatchObject([{ name: 'kube-dns.kube-system.svc.cluster.local', port: 53, priority: 0, weight: 100 }]);
    await expect(r.resolve4('nope.default.svc.cluster.local')).rejects.toMatchObject({ code: 'ENOTFOUND' });
    await expect(r.resolve4('www.example.com')).rejects.toMatchObject({ code: 'EREFUSED' });
  });
});

describe('DNS responder, on the wire', () => {
  it('answers several length-prefixed queries on one TCP connection, sent in pieces', async () => {
    const msgs = ['web.default.svc.cluster.local', 'nope.default.svc.cluster.local', 'kube-dns.kube-system.svc'].map((name, i) => {
      const q = dnsPacket.encode({ type: 'query', id: 100 + i, questions: [{ name, type: 'A' }] });
      const framed = Buffer.alloc(2 + q.length);
      framed.writeUInt16BE(q.length, 0);
      q.copy(framed, 2);
      return framed;
    });
    const all = Buffer.concat(msgs);
    const replies = await new Promise<Array<{ id?: number; rcode?: string }>>((resolve, reject) => {
      const s = connect(port, '127.0.0.1');
      let buf = Buffer.alloc(0);
      const out: Array<{ id?: number; rcode?: string }> = [];
      s.on('error', reject);
      s.on('data', (d: Buffer) => {
        buf = Buffer.concat([buf, d]);
        while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
          out.push(dnsPacket.decode(buf.subarray(2, 2 + buf.readUInt16BE(0))));
          buf = buf.subarray(2 + buf.readUInt16BE(0));
        }
        if (out.length === 3) {
          s.destroy();
          resolve(out);
        }
      });
      // One byte, then the rest split across the second message's length prefix.
      s.write(all.subarray(0, 1));
      setImmediate(() => {
        s.write(all.subarray(1, msgs[0]!.length + 1));
        setImmediate(() => s.write(all.subarray(msgs[0]!.length + 1)));
      });
    });
    expect(replies.map((r) => [r.id, r.rcode])).toEqual([[100, 'NOERROR'], [101, 'NXDOMAIN'], [102, 'NOERROR']]);
  });

  it('keeps answering after random bytes over UDP and TCP', async () => {
    const random = seeded(7);
    const udp = createSocket('udp4');
    for (let i = 0; i < 200; i++) {
      const junk = Buffer.alloc(1 + Math.floor(random() * 60));
      for (let j = 0; j < junk.length; j++) junk[j] = Math.floor(random() * 256);
      udp.send(junk, port, '127.0.0.1');
    }
    await new Promise<void>((resolve) => {
      const s = connect(port, '127.0.0.1', () => {
        const junk = Buffer.alloc(300);
        for (let j = 0; j < junk.length; j++) junk[j] = Math.floor(random() * 256);
        s.end(junk);
      });
      s.on('error', () => resolve());
      s.on('close', () => resolve());
      s.resume();
    });
    udp.close();
    expect(await resolver().resolve4('web.default.svc.cluster.local')).toEqual(['127.96.0.10']);
  });

  it('names the address when the port is taken', async () => {
    const other = new DnsServer({ logger: silentLogger(), handler: () => undefined });
    await expect(other.listen('127.0.0.1', port)).rejects.toMatchObject({ code: 'EADDRINUSE' });
    await other.close();
  });
});
