import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { unlink } from 'node:fs/promises';
import { errnoCode, ProxyError } from '../../core/errors.js';
import { refuseReason, type HandoverHello, type HandoverProxyPort, type HandoverSettings } from '../../core/handover.js';
import type { Logger } from '../../seams/logger.js';
import { HandoverLine } from './json-lines.js';

export interface HandoverPeer {
  pid: number;
  version: string;
}

export interface HandoverServerOptions {
  path: string;
  settings: HandoverSettings;
  version: string;
  pid: number;
  logger: Logger;
  /** Every unit's proxy port now: the successor binds the same (the portal points there). */
  proxyPorts(): HandoverProxyPort[];
  /** The units served now, every listener bound (ids): the successor must listen for each. */
  servedUnits?: () => Promise<string[]>;
  /**
   * The successor serves: stop accepting and drain. Called once, after this server has stopped
   * answering on the path (so the successor can bind it).
   */
  onHandedOver(peer: HandoverPeer): void;
  /**
   * A successor was welcomed (its peer), or went away before it served (undefined). Not called at
   * ready: this process is handing over for good then.
   */
  onSuccessor?: (peer: HandoverPeer | undefined) => void;
}

/** A hello must come this soon after connecting; a silent peer is not a proxy. */
const HELLO_TIMEOUT_MS = 10_000;

/**
 * The running proxy's end of `--handover-socket`. It takes one successor at a time: while one is
 * taking over, another is refused. Until the successor says `ready` nothing is closed here, so a
 * successor that dies or goes quiet leaves this process serving as before, and a later one may try
 * again. On `ready` it stops answering on the path (closing the server removes the socket file),
 * tells the successor `released`, and hands control to onHandedOver.
 */
export class HandoverServer {
  private readonly log: Logger;
  private current: HandoverLine | undefined;
  private handedOver = false;
  private closed = false;
  private settleWaiters: Array<() => void> = [];
  private readonly peers = new WeakMap<HandoverLine, HandoverPeer>();
  private readonly lines = new Set<HandoverLine>();

  private constructor(private readonly server: Server, private readonly opts: HandoverServerOptions) {
    this.log = opts.logger.child({ component: 'handover' });
    server.on('connection', (s) => this.onConnection(s));
    server.on('error', (err) => this.log.error({ err }, 'hand-over socket error'));
  }

  /**
   * Binds `path`. A socket file nobody answers on (left by a process killed with SIGKILL) is
   * removed first; one that answers belongs to a live proxy, which is an error here.
   */
  static async listen(opts: HandoverServerOptions): Promise<HandoverServer> {
    const server = createServer();
    try {
      await bindUnix(server, opts.path);
    } catch (err) {
      if (errnoCode(err) !== 'EADDRINUSE') throw startupError(opts.path, err);
      if (await answers(opts.path)) throw new ProxyError('STARTUP', `--handover-socket ${opts.path}: another proxy answers there (started at the same time as this one?)`);
      await unlink(opts.path).catch(() => undefined);
      try {
        await bindUnix(server, opts.path);
      } catch (again) {
        throw startupError(opts.path, again);
      }
    }
    return new HandoverServer(server, opts);
  }

  /** A successor is between hello and ready. */
  get busy(): boolean {
    return this.current !== undefined;
  }

  /** Resolves when no hand-over is under way (at once when none is). */
  settled(): Promise<void> {
    if (this.current === undefined) return Promise.resolve();
    return new Promise((resolve) => this.settleWaiters.push(resolve));
  }

  /** Stops answering on the path and removes the socket file (a hand-over under way is dropped). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // server.close() waits for the connections it accepted: end them first.
    for (const line of this.lines) line.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private onConnection(socket: Socket): void {
    const line = new HandoverLine(socket);
    this.lines.add(line);
    void line.closed.then(() => this.lines.delete(line));
    const timer = setTimeout(() => line.destroy(), HELLO_TIMEOUT_MS);
    timer.unref();
    let greeted = false;
    line.onMessage((m) => {
      if (!greeted) {
        greeted = true;
        clearTimeout(timer);
        if (m.t !== 'hello') {
          line.destroy();
          return;
        }
        this.onHello(line, m);
        return;
      }
      if (m.t === 'ready' && this.current === line) this.onReady(line, this.peers.get(line));
    });
    void line.closed.then(() => clearTimeout(timer));
  }

  private onHello(line: HandoverLine, hello: HandoverHello): void {
    const reason = this.handedOver || this.closed ? 'this process is already handing over or stopping' : refuseReason(hello, this.opts.settings, this.current !== undefined);
    if (reason !== undefined) {
      this.log.warn({ pid: hello.pid, version: hello.version, reason }, 'refused a hand-over: serving on');
      line.end({ t: 'refused', pid: this.opts.pid, reason });
      return;
    }
    this.current = line;
    this.peers.set(line, { pid: hello.pid, version: hello.version });
    this.log.info({ pid: hello.pid, version: hello.version }, 'a new process is taking over: serving on until it is ready');
    this.opts.onSuccessor?.({ pid: hello.pid, version: hello.version });
    void this.welcome(line);
    void line.closed.then(() => {
      if (this.current !== line) return;
      // Gone before it served (killed, or it failed to start): nothing was closed here.
      this.current = undefined;
      this.log.warn({ pid: hello.pid }, 'the new process went away before it served: hand-over abandoned, serving on');
      this.opts.onSuccessor?.(undefined);
      this.wakeSettled();
    });
  }

  /** Taken already (this.current): a second hello meanwhile is refused. */
  private async welcome(line: HandoverLine): Promise<void> {
    const units = await this.opts.servedUnits?.().catch((err: unknown) => {
      this.log.warn({ err }, 'cannot list the units served: the successor will not check that it listens for them');
      return undefined;
    });
    line.send({ t: 'welcome', pid: this.opts.pid, version: this.opts.version, proxyPorts: this.opts.proxyPorts(), ...(units === undefined ? {} : { units }) });
  }

  private onReady(line: HandoverLine, peer: HandoverPeer | undefined): void {
    this.handedOver = true;
    this.current = undefined;
    this.closed = true;
    // Closing the server removes the socket file at once; the accepted line stays open.
    this.server.close();
    line.end({ t: 'released' });
    this.opts.onHandedOver(peer ?? { pid: 0, version: 'unknown' });
    this.wakeSettled();
  }

  private wakeSettled(): void {
    for (const wake of this.settleWaiters.splice(0)) wake();
  }
}

function bindUnix(server: Server, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/** Whether a process accepts connections on the unix socket at `path`. */
export function answers(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createConnection(path);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

function startupError(path: string, err: unknown): ProxyError {
  return new ProxyError('STARTUP', `--handover-socket ${path}: cannot listen: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
}
