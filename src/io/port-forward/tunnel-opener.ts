import type { IncomingMessage } from 'node:http';
import { http } from '../http/node-http.js';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { KubeConfig } from '@kubernetes/client-node';
import { errnoCode } from '../../core/errors.js';
import type { PodRef } from '../../core/model.js';
import type { Logger } from '../../seams/logger.js';
import { PortForwardError } from './port-forward-error.js';
import { WebSocketPipe, websocketAccept, websocketKey } from './websocket-pipe.js';

/** A tunnel as opened: a byte stream carrying SPDY/3.1 frames. */
export interface OpenedTunnel {
  pipe: Duplex;
  /** Bytes that came with the upgrade's answer, past its headers: the first frames. */
  head?: Buffer;
  transport: 'websocket' | 'spdy';
}

/** Opens a tunnel to a pod's port-forward subresource. Rejects with a PortForwardError. */
export interface TunnelOpener {
  open(pod: PodRef): Promise<OpenedTunnel>;
}

/** Which transports to try: both (WebSocket first, as kubectl since 1.31), or one. */
export type TunnelTransport = 'auto' | 'websocket' | 'spdy';

export interface HttpTunnelOpenerOptions {
  kc: KubeConfig;
  logger: Logger;
  transport?: TunnelTransport;
  /** An upgrade unanswered this long fails; default 30 s. */
  timeoutMs?: number;
  userAgent?: string;
}

/** The port-forward protocol, as `X-Stream-Protocol-Version` names it. */
export const PORT_FORWARD_PROTOCOL = 'portforward.k8s.io';
/** KEP-4006: SPDY tunnelled through a WebSocket, one binary message per write. */
export const WEBSOCKET_TUNNEL_PROTOCOL = `SPDY/3.1+${PORT_FORWARD_PROTOCOL}`;

/** Keepalive probes on the tunnel's TCP connection after this long idle (the PINGs also watch it). */
const TCP_KEEPALIVE_MS = 30_000;

/**
 * Opens tunnels through the API server with the kubeconfig's credentials and TLS
 * (KubeConfig.applyToHTTPSOptions, as the API source's requests do):
 *
 * - WebSocket first (GET, subprotocol `SPDY/3.1+portforward.k8s.io`): API servers from 1.30/1.31
 *   answer 101 and carry the SPDY bytes to the kubelet in binary messages.
 * - When the server does not switch to it (any answer but 101 with that subprotocol: API
 *   servers before 1.30, proxies that strip WebSockets, and an RBAC that grants `create` but not
 *   `get` on pods/portforward), the SPDY/3.1 upgrade (POST) follows, as kubectl's fallback
 *   dialer does; API servers from 1.20 on speak it. Once it has served, later tunnels go straight
 *   to SPDY. A network error is not a refusal: it is reported, not retried the other way.
 */
export class HttpTunnelOpener implements TunnelOpener {
  private readonly timeoutMs: number;
  private readonly userAgent: string;
  private readonly log: Logger;
  /** Set once the WebSocket was refused and SPDY then served: later tunnels skip the WebSocket. */
  private websocketRefused = false;

  constructor(private readonly opts: HttpTunnelOpenerOptions) {
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.userAgent = opts.userAgent ?? 'kube-userspace-proxy';
    this.log = opts.logger.child({ component: 'port-forward' });
  }

  get server(): string {
    return this.opts.kc.getCurrentCluster()?.server ?? '';
  }

  async open(pod: PodRef): Promise<OpenedTunnel> {
    const transport = this.opts.transport ?? 'auto';
    const url = new URL(`${this.server.replace(/\/+$/, '')}/api/v1/namespaces/${encodeURIComponent(pod.namespace)}/pods/${encodeURIComponent(pod.name)}/portforward`);
    const base = await this.requestOptions();
    if (transport === 'spdy' || (transport === 'auto' && this.websocketRefused)) return this.openSpdy(url, base);
    try {
      return await this.openWebSocket(url, base);
    } catch (err) {
      if (transport === 'websocket' || !(err instanceof PortForwardError) || !isRefusal(err)) throw err;
      this.log.debug({ pod: `${pod.namespace}/${pod.name}`, err: err.message }, 'the WebSocket tunnel was refused: trying the SPDY upgrade');
      const opened = await this.openSpdy(url, base);
      if (!this.websocketRefused) {
        this.websocketRefused = true;
        this.log.info({ server: this.server, websocket: err.message }, 'the API server does not tunnel port-forward over WebSocket: using the SPDY/3.1 upgrade');
      }
      return opened;
    }
  }

  private async requestOptions(): Promise<RequestOptions> {
    const opts: RequestOptions = {};
    try {
      await this.opts.kc.applyToHTTPSOptions(opts);
    } catch (err) {
      throw new PortForwardError('credentials', `cannot get credentials for ${this.server}: ${(err as Error).message}`, { cause: err });
    }
    const headers = { ...(opts.headers as Record<string, string> | undefined), 'User-Agent': this.userAgent };
    return { agent: opts.agent, headers, ...(opts.auth ? { auth: opts.auth } : {}) };
  }

  /**
   * The WebSocket handshake (RFC 6455) as a node:http upgrade, then WebSocketPipe for the framing.
   * Any answer but 101 with our subprotocol and the right accept key is a refusal.
   */
  private openWebSocket(url: URL, base: RequestOptions): Promise<OpenedTunnel> {
    const key = websocketKey();
    return this.upgrade(url, base, 'GET', 'WebSocket', {
      Connection: 'Upgrade',
      Upgrade: 'websocket',
      'Sec-WebSocket-Version': '13',
      'Sec-WebSocket-Key': key,
      'Sec-WebSocket-Protocol': WEBSOCKET_TUNNEL_PROTOCOL,
    }, (res, socket, head) => {
      const upgrade = String(res.headers.upgrade ?? '').toLowerCase();
      const protocol = String(res.headers['sec-websocket-protocol'] ?? '');
      if (upgrade !== 'websocket' || res.headers['sec-websocket-accept'] !== websocketAccept(key)) {
        return new PortForwardError('upgrade', `the WebSocket upgrade answered Upgrade "${upgrade}" without a valid Sec-WebSocket-Accept`);
      }
      if (protocol !== WEBSOCKET_TUNNEL_PROTOCOL) {
        return new PortForwardError('upgrade', `the WebSocket upgrade chose subprotocol "${protocol}", not ${WEBSOCKET_TUNNEL_PROTOCOL}`);
      }
      return { pipe: new WebSocketPipe({ socket, head, role: 'client' }), transport: 'websocket' };
    });
  }

  private openSpdy(url: URL, base: RequestOptions): Promise<OpenedTunnel> {
    return this.upgrade(url, base, 'POST', 'SPDY', {
      Connection: 'Upgrade',
      Upgrade: 'SPDY/3.1',
      'X-Stream-Protocol-Version': PORT_FORWARD_PROTOCOL,
    }, (res, socket, head) => {
      const upgrade = String(res.headers.upgrade ?? '').toLowerCase();
      const protocol = String(res.headers['x-stream-protocol-version'] ?? '');
      if (!upgrade.includes('spdy/3.1') || protocol !== PORT_FORWARD_PROTOCOL) {
        return new PortForwardError('upgrade', `the SPDY upgrade answered Upgrade "${upgrade}", protocol "${protocol}"; expected SPDY/3.1 and ${PORT_FORWARD_PROTOCOL}`);
      }
      return { pipe: socket, head, transport: 'spdy' };
    });
  }

  /**
   * One upgrade request: resolves with what `accept` makes of a 101, rejects with the Status of
   * any other answer, a network failure, or silence past the timeout.
   */
  private upgrade(
    url: URL,
    base: RequestOptions,
    method: 'GET' | 'POST',
    what: string,
    upgradeHeaders: Record<string, string>,
    accept: (res: IncomingMessage, socket: Socket, head: Buffer) => OpenedTunnel | PortForwardError,
  ): Promise<OpenedTunnel> {
    const send = url.protocol === 'https:' ? httpsRequest : http.request;
    const req = send(url, { ...base, method, headers: { ...(base.headers as Record<string, string>), ...upgradeHeaders } });
    return new Promise<OpenedTunnel>((resolve, reject) => {
      let settled = false;
      const fail = (err: PortForwardError): void => {
        if (settled) return;
        settled = true;
        req.destroy();
        reject(err);
      };
      req.setTimeout(this.timeoutMs, () => fail(new PortForwardError('network', `${url.host}: no answer to the ${what} upgrade within ${Math.round(this.timeoutMs / 1000)} s`)));
      req.on('upgrade', (res: IncomingMessage, socket: Socket, head: Buffer) => {
        if (settled) {
          socket.destroy();
          return;
        }
        // The request's idle timer is on this very socket: the tunnel has its own keepalive.
        socket.setTimeout(0);
        const outcome = accept(res, socket, head);
        if (outcome instanceof PortForwardError) {
          socket.destroy();
          fail(outcome);
          return;
        }
        settled = true;
        socket.setNoDelay(true);
        socket.setKeepAlive(true, TCP_KEEPALIVE_MS);
        resolve(outcome);
      });
      req.on('response', (res: IncomingMessage) => {
        void readBody(res).then((body) => fail(statusFailure(what, url, res.statusCode ?? 0, body)));
      });
      req.on('error', (err) => fail(networkFailure(url, err)));
      req.end();
    });
  }
}

/** A refusal the other transport may get past: an answer other than the upgrade asked for. */
function isRefusal(err: PortForwardError): boolean {
  return err.failure === 'status' || err.failure === 'upgrade';
}

/** Up to 64 KiB of an error answer's body. */
function readBody(res: IncomingMessage): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => {
      if (text.length < 64 * 1024) text += chunk;
    });
    res.on('end', () => resolve(text));
    res.on('error', () => resolve(text));
    res.on('close', () => resolve(text));
  });
}

/** The API server's Status, as one line: `403 Forbidden: pods "web-0" is forbidden: ...`. */
function statusFailure(transport: string, url: URL, status: number, body: string): PortForwardError {
  let message = body.trim().split('\n')[0] ?? '';
  try {
    const parsed = JSON.parse(body) as { message?: unknown; reason?: unknown };
    if (typeof parsed.message === 'string') message = `${typeof parsed.reason === 'string' ? `${parsed.reason}: ` : ''}${parsed.message}`;
  } catch {
    // not a Status: the first line of the body as it is
  }
  return new PortForwardError('status', `${transport} upgrade of ${url.pathname}: ${status}${message ? ` ${message}` : ''}`, { status });
}

function networkFailure(url: URL, err: Error): PortForwardError {
  return new PortForwardError('network', `${url.host}: ${errnoCode(err) ?? err.message}`, { cause: err });
}
