import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { createServer, type Server, type Socket } from 'node:net';
import { ipFamily } from '../../core/address.js';
import { errnoCode } from '../../core/errors.js';
import type { Logger } from '../../seams/logger.js';

/**
 * The DNS responder's sockets: UDP and TCP on one address and port. Bytes only: `handler` (the
 * pure core/dns-answer.ts) decides every answer and never throws on input; a throw would be a bug,
 * logged, and the message dropped.
 *
 * TCP carries messages with a two-byte length before each (RFC 1035 4.2.2; RFC 7766): several per
 * connection, answered in order. A connection idle for `tcpIdleTimeoutMs` is closed (RFC 7766 6.2.3
 * suggests seconds), and at most `maxTcpConnections` are open at once, so a client cannot hold the
 * process's descriptors.
 */

export type DnsHandler = (message: Buffer, transport: 'udp' | 'tcp') => Buffer | undefined;

export interface DnsServerOptions {
  handler: DnsHandler;
  logger: Logger;
  tcpIdleTimeoutMs?: number;
  maxTcpConnections?: number;
  /** SO_REUSEPORT on both sockets (--handover-socket): the next process binds them beside these. */
  reusePort?: boolean;
}

/** A message and its length prefix never exceed this; nothing more is buffered per connection. */
const MAX_TCP_MESSAGE = 65535;
/** A client that stops reading its answers is cut past this much unsent. */
const MAX_TCP_BACKLOG = 1 << 20;
/** With port 0, tries to find a port free on both UDP and TCP. */
const PORT_ATTEMPTS = 10;

export class DnsServer {
  private readonly opts: DnsServerOptions;
  private readonly log: Logger;
  private udp: UdpSocket | undefined;
  private tcp: Server | undefined;
  private readonly connections = new Set<Socket>();

  constructor(opts: DnsServerOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'dns' });
  }

  /** Binds UDP, then TCP on the same port. Port 0: the kernel picks one free for both. */
  async listen(address: string, port: number): Promise<{ host: string; port: number }> {
    // An empty host is every IPv4 address (as the other bind-address flags read it); `::` is
    // every address of both families.
    const host = address === '' ? '0.0.0.0' : address === 'localhost' ? '127.0.0.1' : address;
    for (let attempt = 1; ; attempt++) {
      const udp = await this.bindUdp(host, port);
      const bound = udp.address().port;
      try {
        this.tcp = await this.listenTcp(host, bound);
        this.udp = udp;
        return { host: udp.address().address, port: bound };
      } catch (err) {
        udp.close();
        if (port !== 0 || errnoCode(err) !== 'EADDRINUSE' || attempt >= PORT_ATTEMPTS) throw err;
      }
    }
  }

  async close(): Promise<void> {
    const udp = this.udp;
    const tcp = this.tcp;
    this.udp = undefined;
    this.tcp = undefined;
    for (const c of this.connections) c.destroy();
    await Promise.all([
      udp ? new Promise<void>((resolve) => udp.close(() => resolve())) : undefined,
      tcp ? new Promise<void>((resolve) => tcp.close(() => resolve())) : undefined,
    ]);
  }

  private bindUdp(host: string, port: number): Promise<UdpSocket> {
    const udp = createSocket({ type: ipFamily(host) === 4 ? 'udp4' : 'udp6', ipv6Only: false, reusePort: this.opts.reusePort ?? false });
    return new Promise((resolve, reject) => {
      udp.once('error', reject);
      udp.bind(port, host, () => {
        udp.off('error', reject);
        udp.on('error', (err) => this.log.warn({ err }, 'DNS UDP socket error'));
        udp.on('message', (msg, rinfo) => {
          // Port 0 cannot be answered (and a send to it fails).
          if (rinfo.port === 0) return;
          const reply = this.answer(msg, 'udp');
          if (reply) udp.send(reply, rinfo.port, rinfo.address, () => undefined);
        });
        resolve(udp);
      });
    });
  }

  private listenTcp(host: string, port: number): Promise<Server> {
    const server = createServer((s) => this.serveConnection(s));
    server.maxConnections = this.opts.maxTcpConnections ?? 256;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port, ipv6Only: false, reusePort: this.opts.reusePort ?? false }, () => {
        server.off('error', reject);
        server.on('error', (err) => this.log.warn({ err }, 'DNS TCP server error'));
        resolve(server);
      });
    });
  }

  private serveConnection(s: Socket): void {
    this.connections.add(s);
    s.setTimeout(this.opts.tcpIdleTimeoutMs ?? 10_000, () => s.destroy());
    s.on('error', () => s.destroy());
    s.on('close', () => this.connections.delete(s));
    let buffered: Buffer = Buffer.alloc(0);
    s.on('data', (chunk: Buffer) => {
      buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
      while (buffered.length >= 2) {
        const len = buffered.readUInt16BE(0);
        if (buffered.length < 2 + len) break;
        const message = buffered.subarray(2, 2 + len);
        buffered = buffered.subarray(2 + len);
        const reply = this.answer(message, 'tcp');
        // A message that earns no answer (too short, or not a query) ends the conversation.
        if (reply === undefined || reply.length > MAX_TCP_MESSAGE) {
          s.destroy();
          return;
        }
        const prefix = Buffer.alloc(2);
        prefix.writeUInt16BE(reply.length, 0);
        s.write(Buffer.concat([prefix, reply]));
        if (s.writableLength > MAX_TCP_BACKLOG) {
          s.destroy();
          return;
        }
      }
      // What is left is less than one message (at most 65,536 bytes): copy it out of the chunk.
      if (buffered.length > 0) buffered = Buffer.from(buffered);
    });
    s.on('end', () => s.end());
  }

  private answer(message: Buffer, transport: 'udp' | 'tcp'): Buffer | undefined {
    try {
      return this.opts.handler(message, transport);
    } catch (err) {
      this.log.error({ err, bytes: message.length, transport }, 'bug: the DNS handler threw; message dropped');
      return undefined;
    }
  }
}
