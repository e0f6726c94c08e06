import { createConnection, type Socket } from 'node:net';
import { errnoCode, ProxyError } from '../../core/errors.js';
import { HANDOVER_PROTOCOL, type HandoverMessage, type HandoverSettings, type HandoverWelcome } from '../../core/handover.js';
import { HandoverLine } from './json-lines.js';

/** The running proxy must answer a hello this soon; one that does not is treated as refusing. */
const ANSWER_TIMEOUT_MS = 10_000;
/** How long the old process may take to let go of the path once told `ready`. */
const RELEASE_TIMEOUT_MS = 30_000;

export type TakeOverStart =
  /** Nothing answers at the path (no file, or one a killed process left): a normal start. */
  | { kind: 'alone' }
  | { kind: 'refused'; pid: number; reason: string }
  | { kind: 'welcome'; welcome: HandoverWelcome; session: HandoverSession };

/**
 * The successor's end of a hand-over, once welcomed. The old process keeps serving until ready()
 * is sent; if it goes away before that (killed), `lost` resolves and this process simply carries
 * on as a normal start.
 */
export class HandoverSession {
  /** Resolves when the line to the old process closes. */
  readonly lost: Promise<void>;
  private released = false;

  constructor(private readonly line: HandoverLine) {
    this.lost = line.closed;
    line.onMessage((m) => {
      if (m.t === 'released') this.released = true;
    });
  }

  /**
   * Tells the old process this one serves. Resolves once it has let go of the path: 'released' when
   * it said so, 'gone' when the line closed without it (the old process died, or had before).
   */
  async ready(timeoutMs = RELEASE_TIMEOUT_MS): Promise<'released' | 'gone'> {
    if (!this.line.isClosed) this.line.send({ t: 'ready' });
    // An old process that neither lets go nor dies (hung) is not waited for: this one serves, and
    // binding the path then finds out whether anyone still answers there.
    const timer = setTimeout(() => this.line.destroy(), timeoutMs);
    await this.line.closed;
    clearTimeout(timer);
    return this.released ? 'released' : 'gone';
  }

  /** Abandons the hand-over (this process failed to start): the old one serves on. */
  abandon(): void {
    this.line.destroy();
  }
}

/**
 * Connects to `path` and asks the process there to hand over. Resolves 'alone' when nothing
 * answers (ENOENT, or ECONNREFUSED on a socket file a killed process left behind).
 */
export async function askToTakeOver(path: string, hello: HandoverSettings & { version: string; pid: number }): Promise<TakeOverStart> {
  let socket: Socket;
  try {
    socket = await connect(path);
  } catch (err) {
    const code = errnoCode(err);
    if (code === 'ENOENT' || code === 'ECONNREFUSED') return { kind: 'alone' };
    throw new ProxyError('HANDOVER', `--handover-socket ${path}: cannot connect: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
  const line = new HandoverLine(socket);
  const answer = await new Promise<HandoverMessage | undefined>((resolve) => {
    const timer = setTimeout(() => resolve(undefined), ANSWER_TIMEOUT_MS);
    line.onMessage((m) => {
      clearTimeout(timer);
      resolve(m);
    });
    void line.closed.then(() => {
      clearTimeout(timer);
      resolve(undefined);
    });
    line.send({ t: 'hello', protocol: HANDOVER_PROTOCOL, version: hello.version, pid: hello.pid, portal: hello.portal, bindAddress: hello.bindAddress });
  });
  if (answer?.t === 'welcome') return { kind: 'welcome', welcome: answer, session: new HandoverSession(line) };
  const wentAway = line.isClosed;
  line.destroy();
  if (answer?.t === 'refused') return { kind: 'refused', pid: answer.pid, reason: answer.reason };
  // It went away before answering (it was stopping, or killed): nobody serves there now.
  if (answer === undefined && wentAway) return { kind: 'alone' };
  return { kind: 'refused', pid: 0, reason: `the process at ${path} did not answer the hand-over in ${ANSWER_TIMEOUT_MS} ms` };
}

function connect(path: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = createConnection(path);
    s.once('connect', () => {
      s.off('error', reject);
      resolve(s);
    });
    s.once('error', reject);
  });
}
