import type { ClientRequest, IncomingMessage } from 'node:http';
import { http } from '../http/node-http.js';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import { StringDecoder } from 'node:string_decoder';
import type { KubeConfig } from '@kubernetes/client-node';
import { ProxyError, errnoCode } from '../../core/errors.js';

/**
 * The two API calls a reflector makes, GET a list and GET a watch stream, behind a seam.
 *
 * client-node supplies the credentials and TLS (KubeConfig.applyToHTTPSOptions: tokens, token
 * files, exec plugins, client certificates, proxies); the requests themselves go through
 * node:http(s), because client-node 1.4.0's own calls miss what a proxy that must keep serving
 * needs (checked in dist/):
 *  - `Watch` never times out: its `AbortSignal.timeout(30000)` is assigned and then overwritten,
 *    so a silently dead connection hangs until TCP keepalive gives up, minutes later;
 *  - `Watch.watch` returns its AbortController only once response headers arrive: a connect that
 *    hangs cannot be aborted, not even by stop();
 *  - `Watch` drops lines it cannot parse without a word, and non-200 answers lose their Status;
 *  - the generated list calls re-type objects through ObjectSerializer (Dates, unknown fields
 *    dropped), while watch events stay raw JSON: two shapes of one object. Here both are the
 *    JSON the server sent, as the file source reads it, so one translation path serves both.
 */

export type Query = Record<string, string | undefined>;

/** One line of a watch stream. */
export interface WatchEvent {
  type: string;
  object: unknown;
}

export interface WatchOptions {
  /** Each event, in order. An exception thrown here ends the stream and rejects with it. */
  onEvent: (e: WatchEvent) => void;
  /** The server answered 200: the stream is open. */
  onOpen?: () => void;
  signal: AbortSignal;
  /** The watch fails after this long without a byte. */
  idleTimeoutMs: number;
}

export interface KubeApi {
  /** The API server's address, for logs. */
  readonly server: string;
  /** GET `path` (a list): the parsed body. Rejects with KubeApiError, or the abort reason. */
  get(path: string, query: Query, signal: AbortSignal): Promise<unknown>;
  /**
   * GET `path` as a watch. Resolves when the server ends the stream; rejects with KubeApiError on
   * an error status, a dropped connection, a line that is not JSON, or a silence longer than
   * `idleTimeoutMs`, and with the abort reason when `signal` aborts.
   */
  watch(path: string, query: Query, opts: WatchOptions): Promise<void>;
}

/** Why a call failed, beyond an HTTP status: branch on these, never on message text. */
export type KubeApiFailure = 'Status' | 'Network' | 'Timeout' | 'BadResponse' | 'Credentials';

/** An API call failed. `status` is the HTTP status, or the `code` of a watch stream's Status. */
export class KubeApiError extends ProxyError {
  readonly failure: KubeApiFailure;
  readonly status: number | undefined;
  /** The Status object's `reason` (e.g. `Expired`), when the server sent one. */
  readonly reason: string | undefined;

  constructor(message: string, failure: KubeApiFailure, opts: { status?: number; reason?: string; cause?: unknown } = {}) {
    super('API', message, { cause: opts.cause });
    this.name = 'KubeApiError';
    this.failure = failure;
    this.status = opts.status;
    this.reason = opts.reason;
  }

  /** 410 Gone: the resourceVersion (or continue token) is older than the server keeps. */
  get expired(): boolean {
    return this.status === 410;
  }
}

/** A watch stream's `ERROR` event (or any Status body) as an error. */
export function statusError(status: unknown, where: string, httpStatus?: number): KubeApiError {
  const s = isRecord(status) ? status : {};
  const code = typeof s.code === 'number' ? s.code : httpStatus;
  const reason = typeof s.reason === 'string' ? s.reason : undefined;
  const message = typeof s.message === 'string' ? s.message : 'no message';
  return new KubeApiError(`${where}: ${code ?? 'error'}${reason ? ` ${reason}` : ''}: ${message}`, 'Status', { status: code, reason });
}

export interface HttpKubeApiOptions {
  /** A list request fails after this long without a byte; default 60 s. */
  requestTimeoutMs?: number;
  /**
   * TCP keepalive idle time: after this long without a segment from the API server, the kernel
   * probes the connection; a peer gone without FIN or RST then fails the request with ETIMEDOUT
   * some 10 s later (see KEEPALIVE_IDLE_MS). Whole seconds, at least 1 s; default 30 s.
   */
  keepAliveIdleMs?: number;
  /** A watch line (one object) larger than this ends the watch; default 64 MiB. */
  maxLineBytes?: number;
  userAgent?: string;
}

/**
 * A watch whose API server vanished without FIN or RST (host lost, path blackholed) must be
 * noticed in about the time kube-proxy takes: client-go's HTTP/2 health check reads 30 s of
 * silence, then sends a PING with 15 s to answer, some 45 s in all. Without a check the watch
 * waits for its own deadline (timeoutSeconds + grace, 5 to 10 minutes).
 *
 * Here it is TCP keepalive on every socket to the API server, because it probes this very
 * connection and needs nothing from the server:
 *  - Node sets TCP_KEEPIDLE from setKeepAlive's delay, and libuv >= 1.49 sets TCP_KEEPINTVL = 1 s
 *    and TCP_KEEPCNT = 10 on Linux (read back with getsockopt under Node 24.21 / libuv 1.52.1,
 *    in a namespace whose sysctls say 75 s and 9): a dead peer fails the socket with ETIMEDOUT
 *    about idle + 10 s after its last segment, ~40 s by default. Node cannot set the interval or
 *    the count; with an older libuv the kernel's net.ipv4.tcp_keepalive_intvl/probes apply
 *    (75 s x 9 unless tuned) and the watch's own deadline stays the backstop.
 *  - An idle timer on the stream alone cannot tell a quiet watch from a dead one: the API server
 *    sends a BOOKMARK about once a minute (the watch cache's defaultBookmarkFrequency), so any
 *    timer under a minute would cut healthy watches.
 *  - HTTP/2 PING (client-go's way) needs node:http2, which takes no http.Agent: the agents the
 *    kubeconfig builds (client certificates, proxies) would have to be rebuilt by hand.
 *  - TCP_USER_TIMEOUT bounds only unacknowledged data we sent (a watch sends none once open),
 *    and Node cannot set it.
 * Keepalive does not run while our own data is unacknowledged (a request being sent): that case
 * stays with the request's idle timer.
 */
const KEEPALIVE_IDLE_MS = 30_000;

/** A request whose socket-level failure (timeout, reset) is remembered for whoever reads its response. */
interface Exchange {
  req: ClientRequest;
  res: IncomingMessage;
  failure(): Error | undefined;
}

export class HttpKubeApi implements KubeApi {
  private readonly requestTimeoutMs: number;
  private readonly keepAliveIdleMs: number;
  private readonly maxLineBytes: number;
  private readonly userAgent: string;

  constructor(
    private readonly kc: KubeConfig,
    opts: HttpKubeApiOptions = {},
  ) {
    this.requestTimeoutMs = opts.requestTimeoutMs ?? 60_000;
    // Node passes whole seconds to the kernel, and 0 would leave the system's 2 hours in place.
    this.keepAliveIdleMs = Math.max(1000, opts.keepAliveIdleMs ?? KEEPALIVE_IDLE_MS);
    this.maxLineBytes = opts.maxLineBytes ?? 64 * 1024 * 1024;
    this.userAgent = opts.userAgent ?? 'kube-userspace-proxy';
  }

  get server(): string {
    return this.kc.getCurrentCluster()?.server ?? '';
  }

  async get(path: string, query: Query, signal: AbortSignal): Promise<unknown> {
    const ex = await this.open(path, query, signal, this.requestTimeoutMs);
    const text = await readAll(ex, Infinity);
    try {
      return JSON.parse(text) as unknown;
    } catch (err) {
      throw new KubeApiError(`GET ${path}: the answer is not JSON`, 'BadResponse', { cause: err });
    }
  }

  async watch(path: string, query: Query, opts: WatchOptions): Promise<void> {
    const { onEvent, signal } = opts;
    const ex = await this.open(path, query, signal, opts.idleTimeoutMs);
    const { res } = ex;
    opts.onOpen?.();
    const decoder = new StringDecoder('utf8');
    let buffered = '';
    return new Promise<void>((resolve, reject) => {
      let settled = false;
      const fail = (err: unknown): void => {
        if (settled) return;
        settled = true;
        res.destroy();
        reject(err instanceof Error ? err : new Error(String(err)));
      };
      const deliver = (line: string): void => {
        if (line.trim() === '') return;
        let ev: unknown;
        try {
          ev = JSON.parse(line);
        } catch (err) {
          throw new KubeApiError(`watch ${path}: a line of the stream is not JSON`, 'BadResponse', { cause: err });
        }
        if (!isRecord(ev) || typeof ev.type !== 'string') {
          throw new KubeApiError(`watch ${path}: a line of the stream is not a watch event`, 'BadResponse');
        }
        onEvent({ type: ev.type, object: ev.object });
      };
      res.on('data', (chunk: Buffer) => {
        if (settled) return;
        buffered += decoder.write(chunk);
        let start = 0;
        try {
          for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n', start)) {
            const line = buffered.slice(start, nl);
            start = nl + 1;
            deliver(line);
            if (settled) return;
          }
        } catch (err) {
          fail(err);
          return;
        }
        buffered = buffered.slice(start);
        if (buffered.length > this.maxLineBytes) {
          fail(new KubeApiError(`watch ${path}: an event larger than ${this.maxLineBytes} bytes`, 'BadResponse'));
        }
      });
      res.on('end', () => {
        if (settled) return;
        try {
          deliver(buffered + decoder.end());
        } catch (err) {
          fail(err);
          return;
        }
        settled = true;
        resolve();
      });
      res.on('error', (err) => fail(ex.failure() ?? networkError(`GET ${path}`, err)));
      res.on('close', () => {
        if (!res.complete) fail(ex.failure() ?? (signal.aborted ? signal.reason : new KubeApiError(`watch ${path}: the connection closed mid-stream`, 'Network')));
      });
    });
  }

  /**
   * POST `body` as JSON to `path`, creating an object (an Event): the created object. Rejects with
   * KubeApiError, or the abort reason.
   */
  async post(path: string, body: unknown, signal: AbortSignal): Promise<unknown> {
    const ex = await this.open(path, {}, signal, this.requestTimeoutMs, JSON.stringify(body));
    const text = await readAll(ex, 1024 * 1024);
    return parseOrUndefined(text);
  }

  /**
   * Sends the GET (or, with a body, the POST); resolves with a 200 response (or 201 Created),
   * rejects with the Status of any other answer.
   */
  private async open(path: string, query: Query, signal: AbortSignal, timeoutMs: number, body?: string): Promise<Exchange> {
    const method = body === undefined ? 'GET' : 'POST';
    const opts: RequestOptions = {};
    try {
      await this.kc.applyToHTTPSOptions(opts);
    } catch (err) {
      throw new KubeApiError(`cannot get credentials for ${this.server}: ${(err as Error).message}`, 'Credentials', { cause: err });
    }
    signal.throwIfAborted();
    const url = new URL(this.server + path);
    for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, v);
    const headers: Record<string, string> = { ...(opts.headers as Record<string, string> | undefined), Accept: 'application/json', 'User-Agent': this.userAgent };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const send = url.protocol === 'https:' ? httpsRequest : http.request;
    const reqOpts: RequestOptions = { method, agent: opts.agent, headers, signal };
    if (opts.auth) reqOpts.auth = opts.auth;
    const req = send(url, reqOpts);
    // On every socket, a fresh one or one an agent reuses (applied once it connects).
    req.on('socket', (socket) => socket.setKeepAlive(true, this.keepAliveIdleMs));
    let failure: Error | undefined;
    // Idle time on the socket: covers a connect that hangs, slow headers and a silent stream.
    req.setTimeout(timeoutMs, () => {
      failure = new KubeApiError(`${method} ${path}: no answer within ${Math.round(timeoutMs / 1000)}s`, 'Timeout');
      req.destroy(failure);
    });
    return new Promise<Exchange>((resolve, reject) => {
      req.on('error', (err) => {
        failure ??= signal.aborted ? (signal.reason as Error) : networkError(`${method} ${path}`, err);
        reject(failure);
      });
      req.on('response', (res) => {
        const ex: Exchange = { req, res, failure: () => failure };
        if (res.statusCode === 200 || (method === 'POST' && res.statusCode === 201)) {
          resolve(ex);
          return;
        }
        const status = res.statusCode ?? 0;
        readAll(ex, 64 * 1024).then(
          (text) => reject(statusError(parseOrUndefined(text), `${method} ${path}`, status)),
          () => reject(statusError(undefined, `${method} ${path}`, status)),
        );
      });
      req.end(body);
    });
  }
}

/** The whole body as text, up to `limit` characters (then the rest is dropped, and the socket with it). */
function readAll(ex: Exchange, limit: number): Promise<string> {
  const { res } = ex;
  const decoder = new StringDecoder('utf8');
  let text = '';
  return new Promise((resolve, reject) => {
    res.on('data', (chunk: Buffer) => {
      text += decoder.write(chunk);
      if (text.length > limit) {
        resolve(text.slice(0, limit));
        res.destroy();
      }
    });
    res.on('end', () => resolve(text + decoder.end()));
    res.on('error', (err) => reject(ex.failure() ?? err));
    res.on('close', () => {
      if (!res.complete) reject(ex.failure() ?? new KubeApiError('the connection closed before the answer was complete', 'Network'));
    });
  });
}

function networkError(request: string, err: unknown): KubeApiError {
  const code = errnoCode(err);
  return new KubeApiError(`${request}: ${code ?? (err instanceof Error ? err.message : String(err))}`, 'Network', { cause: err });
}

function parseOrUndefined(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
