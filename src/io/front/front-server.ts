import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { hostPort } from '../../core/address.js';
import { FrontHandshake, type FrontRequest, type HandshakeStep } from '../../core/front-handshake.js';
import { connectedReply, frontTarget, refusalReply } from '../../core/front-target.js';
import type { Logger } from '../../seams/logger.js';
import type { ServiceResolver } from '../../seams/service-resolver.js';
import type { TcpHandOffs } from '../../seams/tcp-hand-off.js';

/**
 * The SOCKS5 and HTTP CONNECT front (`--socks-bind-address`): one TCP port where a client names a
 * Service (`svc.ns.svc.<domain>`, `svc.ns.svc`, `svc.ns`, or a ClusterIP) and a port, and gets a
 * byte stream to it. The way in where 127/8 aliases or DNS settings are not to be had.
 *
 * It does not pick an endpoint itself. When the units live in this process (`handOffs`: no
 * --workers), it hands the client socket to the Service port's own TCP proxy socket once the
 * tunnel is open (seams/tcp-hand-off.ts), so the connection is one of that port's: balancer,
 * session affinity on the client's own address, retries on the next endpoint, the dialer (direct
 * or port-forward), hold-when-empty, passive health and the port's metrics, and no listener of the
 * port is needed: on macOS without root, where the loopback portal's 127.96.x.y addresses cannot
 * be bound, the front still reaches every Service. With --workers, the units live in other
 * processes, which only a connection to where the proxy serves the port (the resolver's answer:
 * the Service's loopback address under the loopback portal, its ClusterIP under the others)
 * reaches; ClientIP affinity then sees the front's own address (127.0.0.1) as every front client's.
 *
 * Either way the tunnel opens before an endpoint answers (at the hand-off, or as soon as the proxy
 * accepts the local connection): a Service whose endpoints all fail reads as an opened tunnel that
 * is reset, as a direct connection to the Service is.
 *
 * Bounds: the handshake (up to the tunnel's opening) gets `handshakeTimeoutMs` in all, however the
 * bytes trickle in (a client that sends one byte a second is still cut); a request head is at most
 * `maxHeaderBytes`; at most `maxConnections` front connections are open at once (past it, new
 * ones are closed at accept).
 */

export interface FrontServerOptions {
  resolver: ServiceResolver;
  /** The unit set of this process, whose TCP proxy sockets take the clients; absent with --workers. */
  handOffs?: TcpHandOffs;
  /** `--cluster-domain`: which names are the cluster's (the others are refused as outside). */
  domain: string;
  logger: Logger;
  handshakeTimeoutMs?: number;
  maxHeaderBytes?: number;
  maxConnections?: number;
  /** SO_REUSEPORT (--handover-socket): a successor binds the same address before this one closes. */
  reusePort?: boolean;
}

export const DEFAULT_HANDSHAKE_TIMEOUT_MS = 5000;
export const DEFAULT_MAX_FRONT_CONNECTIONS = 512;

export class FrontServer {
  private readonly opts: FrontServerOptions;
  private readonly log: Logger;
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();

  constructor(opts: FrontServerOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'socks-front' });
  }

  async listen(address: string, port: number): Promise<{ host: string; port: number }> {
    // An empty host is every IPv4 address, as the other bind-address flags read it.
    const host = address === '' ? '0.0.0.0' : address === 'localhost' ? '127.0.0.1' : address;
    // allowHalfOpen: a client's FIN is passed on to the Service, which may still answer.
    const server = createServer({ allowHalfOpen: true }, (s) => this.accept(s));
    server.maxConnections = this.opts.maxConnections ?? DEFAULT_MAX_FRONT_CONNECTIONS;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port, ipv6Only: false, reusePort: this.opts.reusePort === true }, () => {
        server.off('error', reject);
        server.on('error', (err) => this.log.warn({ err }, 'SOCKS front server error'));
        resolve();
      });
    });
    this.server = server;
    const a = server.address() as AddressInfo;
    return { host: a.address, port: a.port };
  }

  /**
   * Stops accepting and cuts every front connection still its own: handshakes, and tunnels relayed
   * to a local address (--workers). Connections handed to a Service port are that port's.
   */
  async close(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const s of this.sockets) s.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** Front connections open now (the listener's own count: what maxConnections bounds). */
  connectionCount(): Promise<number> {
    const server = this.server;
    if (server === undefined) return Promise.resolve(0);
    return new Promise((resolve, reject) => server.getConnections((err, n) => (err ? reject(err) : resolve(n))));
  }

  private track(s: Socket): void {
    this.sockets.add(s);
    s.on('close', () => this.sockets.delete(s));
  }

  private accept(client: Socket): void {
    this.track(client);
    const onError = (): void => {
      client.destroy();
    };
    client.on('error', onError);
    const handshake = new FrontHandshake(this.opts.maxHeaderBytes === undefined ? {} : { maxHeaderBytes: this.opts.maxHeaderBytes });
    // One deadline for the whole handshake, not an idle timer: trickling bytes does not extend it.
    const deadline = setTimeout(() => {
      this.debug(client, 'handshake timed out');
      client.destroy();
    }, this.opts.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS);
    client.once('close', () => clearTimeout(deadline));
    let handshaking = true;
    const onData = (chunk: Buffer): void => {
      let step: HandshakeStep;
      try {
        step = handshake.push(chunk);
      } catch (err) {
        // The parser takes any bytes: a throw is a bug, and costs this client only.
        this.log.error({ err }, 'bug: the SOCKS front handshake threw; connection closed');
        client.destroy();
        return;
      }
      if (step.reply !== undefined && step.reply.length > 0) client.write(step.reply);
      if (step.kind === 'more') return;
      handshaking = false;
      client.off('data', onData);
      // What the client sends from here on stays in the socket until the tunnel is piped.
      client.pause();
      if (step.kind === 'refuse') {
        this.debug(client, step.reason);
        refuse(client);
        return;
      }
      this.open(client, step.request, step.rest, deadline, () => {
        client.off('error', onError);
        client.off('end', onEnd);
      });
    };
    client.on('data', onData);
    // A client that closes its side mid-handshake has nothing more to ask.
    const onEnd = (): void => {
      if (handshaking) client.destroy();
    };
    client.on('end', onEnd);
  }

  /** `release` takes the front's own listeners off the client, for a hand-off. */
  private open(client: Socket, request: FrontRequest, rest: Buffer, deadline: NodeJS.Timeout, release: () => void): void {
    const { domain, handOffs } = this.opts;
    const target = frontTarget(request, (h, p, proto) => (handOffs === undefined ? this.opts.resolver.resolve(h, p, proto) : this.opts.resolver.locate(h, p, proto)), domain);
    if (target.kind === 'refuse') {
      this.debug(client, `refused (${target.why})`, request);
      refuse(client, refusalReply(request, target.why, domain));
      return;
    }
    if (handOffs !== undefined && target.servicePort !== undefined) {
      this.handOff(client, request, rest, deadline, release, handOffs, { host: target.host, port: target.port, servicePort: target.servicePort });
      return;
    }
    const upstream = connect({ host: target.host, port: target.port, allowHalfOpen: true });
    this.track(upstream);
    const onDialError = (err: Error): void => {
      this.debug(client, `dial to ${hostPort(target)} failed: ${err.message}`, request);
      upstream.destroy();
      if (!client.destroyed) refuse(client, refusalReply(request, 'unavailable', domain));
    };
    upstream.once('error', onDialError);
    // The client gone before the dial ends: nothing to open.
    const onClientClose = (): void => {
      upstream.destroy();
    };
    client.once('close', onClientClose);
    upstream.once('connect', () => {
      clearTimeout(deadline);
      upstream.off('error', onDialError);
      client.off('close', onClientClose);
      client.write(connectedReply(request, { host: upstream.localAddress ?? '0.0.0.0', port: upstream.localPort ?? 0 }));
      if (rest.length > 0) upstream.write(rest);
      this.relay(client, upstream);
    });
  }

  /**
   * The tunnel opens now, and the client becomes a connection of the Service port's own proxy
   * socket. The bytes the client sent after its request are put back in front of the stream, so
   * the endpoint reads them first; the reply's bytes are the front's, not the endpoint's (the
   * proxy socket may still retry another endpoint after them).
   */
  private handOff(client: Socket, request: FrontRequest, rest: Buffer, deadline: NodeJS.Timeout, release: () => void, handOffs: TcpHandOffs, target: { host: string; port: number; servicePort: string }): void {
    const to = handOffs.tcpHandOff(target.servicePort);
    if (to === undefined) {
      // Gone between the lookup and now, or the proxy is shutting down.
      this.debug(client, `refused (unavailable: ${target.servicePort} takes no connections)`, request);
      refuse(client, refusalReply(request, 'unavailable', this.opts.domain));
      return;
    }
    clearTimeout(deadline);
    release();
    // The Service's address stands for where the tunnel leads; no socket of ours is bound to it.
    client.write(connectedReply(request, { host: target.host, port: target.port }));
    if (rest.length > 0) client.unshift(rest);
    if (!to.adopt(client, client.bytesWritten)) {
      client.destroy();
      return;
    }
    // The Service port's connection now: it drains with the proxy's own (a hand-over, SIGTERM),
    // so closing the front does not cut it.
    this.sockets.delete(client);
    this.debug(client, `handed to ${target.servicePort}`, request);
  }

  /**
   * Bytes both ways: pipe() holds a side's reads while the other's writes are queued (backpressure)
   * and passes each FIN on (half-close); an error on one side resets the other, as the proxy's own
   * connections do, so a Service that resets its client is seen as a reset through the front too.
   */
  private relay(client: Socket, upstream: Socket): void {
    client.on('error', () => upstream.resetAndDestroy());
    upstream.on('error', () => client.resetAndDestroy());
    upstream.on('close', () => {
      // The upstream gone with bytes unsent to it, or without its FIN (destroyed): the client
      // cannot be answered any more.
      if (!client.writableEnded) client.destroy();
    });
    client.on('close', () => {
      if (!upstream.writableEnded) upstream.destroy();
    });
    client.pipe(upstream);
    upstream.pipe(client);
  }

  private debug(client: Socket, msg: string, request?: FrontRequest): void {
    if (!this.log.isLevelEnabled('debug')) return;
    this.log.debug({ client: client.remoteAddress, ...(request ? { protocol: request.protocol, target: `${request.host}:${request.port}` } : {}) }, msg);
  }
}

/**
 * Sends the refusal and ends our side; what the client still sends is read and dropped, so that
 * its FIN closes the connection (an unread byte would turn our close into a reset, which could
 * overtake the refusal). The handshake's deadline still bounds a client that never closes.
 */
function refuse(client: Socket, reply?: Buffer): void {
  if (reply === undefined) client.end();
  else client.end(reply);
  client.resume();
}
