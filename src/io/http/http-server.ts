import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { http } from './node-http.js';
import type { AddressInfo } from 'node:net';
import type { Logger } from '../../seams/logger.js';

export type Route = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = `${JSON.stringify(body, null, 2)}\n`;
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), 'X-Content-Type-Options': 'nosniff' });
  res.end(text);
}

export function sendText(res: ServerResponse, status: number, text: string, contentType = 'text/plain; charset=utf-8'): void {
  res.writeHead(status, { 'Content-Type': contentType, 'Content-Length': Buffer.byteLength(text) });
  res.end(text);
}

/**
 * A small HTTP server with exact-path routes (GET and HEAD only): the admin, health and metrics
 * endpoints need nothing more, so no framework.
 */
export class HttpServer {
  private readonly server: Server;
  private readonly routes = new Map<string, Route>();

  constructor(private readonly logger: Logger) {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    this.server.keepAliveTimeout = 5000;
  }

  route(path: string, handler: Route): this {
    this.routes.set(path, handler);
    return this;
  }

  paths(): string[] {
    return [...this.routes.keys()];
  }

  /** `reusePort`: a successor process binds the same address while this one serves (--handover-socket). */
  async listen(host: string, port: number, reusePort = false): Promise<AddressInfo> {
    await new Promise<void>((resolve, reject) => {
      const onError = (err: Error): void => reject(err);
      this.server.once('error', onError);
      this.server.listen({ host: host || undefined, port, reusePort }, () => {
        this.server.off('error', onError);
        resolve();
      });
    });
    this.server.on('error', (err) => this.logger.error({ err }, 'HTTP server error'));
    return this.server.address() as AddressInfo;
  }

  async close(): Promise<void> {
    if (!this.server.listening) return;
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = pathOf(req.url ?? '/');
    const route = this.routes.get(path);
    if (!route) {
      sendText(res, 404, `404 page not found; try ${this.paths().join(', ')}\n`);
      return;
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      sendText(res, 405, 'method not allowed\n');
      return;
    }
    try {
      await route(req, res);
    } catch (err) {
      this.logger.error({ err, path }, 'HTTP handler failed');
      if (!res.headersSent) sendText(res, 500, 'internal error\n');
      else res.destroy();
    }
  }
}

/**
 * The request-target's path: origin-form (`/healthz?x`) as most clients send it, or absolute-form
 * (`http://node:10256/healthz`), which a request through a forward proxy carries and Go's server,
 * kube-proxy's, routes by its path alike (RFC 9112 §3.2.2).
 */
function pathOf(target: string): string {
  if (target.startsWith('/')) return target.split('?')[0] as string;
  try {
    return new URL(target).pathname;
  } catch {
    return target;
  }
}
