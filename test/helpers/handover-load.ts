import { spawn } from 'node:child_process';

/**
 * The client side of the hand-over tests, run inside the test's namespace (`ip netns exec`): one
 * process that holds `long` long-lived TCP connections exchanging numbered lines with an echo
 * backend (prefixed `be:`), and runs a loop of new TCP connections and a loop of UDP queries,
 * until told `stop` on stdin (or its time runs out). It counts what a client would see: refusals,
 * resets, bytes that came back other than sent, queries left unanswered. Bounded: every loop stops
 * at `maxSeconds`, and the short connections and queries are at most `maxShort`/`maxUdp`.
 */
const SCRIPT = String.raw`
const net = require('node:net'), dgram = require('node:dgram');
const o = JSON.parse(process.argv[1]);
const r = { longOpened: 0, longCompleted: 0, longErrors: [], longMismatch: 0, longBytes: 0,
  shortOk: 0, shortRefused: 0, shortReset: 0, shortOther: [], shortMismatch: 0,
  udpOk: 0, udpRetried: 0, udpRetries: 0, udpFailed: 0, udpLost: 0, udpLate: 0, udpWrongSource: 0, timedOut: false };
let stopping = false;
const hard = setTimeout(() => { r.timedOut = true; finish(); }, o.maxSeconds * 1000); hard.unref();
function finish() { process.stdout.write('RESULT ' + JSON.stringify(r) + '\n'); process.exit(0); }
function progress() { process.stdout.write('PROGRESS ' + JSON.stringify({ short: r.shortOk, udp: r.udpOk, refused: r.shortRefused, reset: r.shortReset, other: r.shortOther.slice(-3), longErrors: r.longErrors.length }) + '\n'); }
let attempts = 0;
function classify(e) { return e && e.code === 'ECONNREFUSED' ? 'refused' : e && (e.code === 'ECONNRESET' || e.code === 'EPIPE') ? 'reset' : 'other'; }

// Long-lived connections: a numbered line every chunkMs; what comes back must be be: + every
// byte sent, in order.
const longs = [];
function openLong(i) {
  return new Promise((resolve, reject) => {
    const c = { sent: 'be:', got: '', seq: 0, s: net.connect({ host: o.host, port: o.tcpPort, allowHalfOpen: true }), done: false };
    c.s.setEncoding('utf8');
    c.s.on('connect', () => { r.longOpened++; c.send(); resolve(c); });
    c.send = () => { const line = 'L' + i + '-' + (c.seq++) + '-' + 'x'.repeat(32) + '\n'; c.sent += line; c.s.write(line); };
    c.s.on('data', (d) => { c.got += d; r.longBytes += d.length; if (!c.sent.startsWith(c.got)) { r.longMismatch++; c.s.destroy(); } });
    c.s.on('error', (e) => { r.longErrors.push(i + ':' + (e.code || e.message)); reject(e); });
    c.s.on('end', () => { if (c.got === c.sent) { r.longCompleted++; } else { r.longMismatch++; } c.done = true; c.s.destroy(); c.onDone && c.onDone(); });
    longs.push(c);
  });
}

// New connections: each sends one message and half-closes; the reply must be be: + message.
async function shortLoop(w) {
  let n = 0;
  while (!stopping && r.shortOk + r.shortRefused + r.shortReset + r.shortOther.length < o.maxShort) {
    const msg = 's' + w + '-' + (n++);
    try {
      const reply = await new Promise((resolve, reject) => {
        const chunks = [];
        const s = net.connect({ host: o.host, port: o.tcpPort, allowHalfOpen: true });
        s.setTimeout(5000, () => { s.destroy(); reject(Object.assign(new Error('timeout'), { code: 'TIMEOUT' })); });
        s.on('connect', () => s.end(msg));
        s.on('data', (d) => chunks.push(d));
        s.on('end', () => { s.destroy(); resolve(Buffer.concat(chunks).toString()); });
        s.on('error', reject);
      });
      if (reply === 'be:' + msg) r.shortOk++; else r.shortMismatch++;
    } catch (e) {
      const k = classify(e);
      if (k === 'refused') r.shortRefused++; else if (k === 'reset') r.shortReset++; else r.shortOther.push(e.code || e.message);
    }
    if (++attempts % 200 === 0) progress();
  }
}

// UDP queries: a new socket (a new flow) each, or with 'persistent' one socket (one flow, one
// session) for every query of the loop; a query unanswered in udpWaitMs is sent again on the same
// socket, up to udpTries times in all. Every reply must come from the service's address and port.
// Each try says its number. A query answered by a later try than its first had a try lost, unless
// that try's reply still comes (late: a busy machine): such a socket stays open a while to see.
const unanswered = new Set();
const lingering = new Set();
async function udpLoop(w, persistent) {
  let n = 0;
  let s;
  let handler = () => undefined;
  const open = () => {
    const sock = dgram.createSocket('udp4');
    sock.on('message', (m, rinfo) => {
      if (rinfo.address !== o.host || rinfo.port !== o.udpPort) r.udpWrongSource++;
      const text = m.toString();
      if (unanswered.delete(text.slice(3))) r.udpLate++;
      handler(text);
    });
    sock.on('error', () => undefined);
    return sock;
  };
  while (!stopping && r.udpOk + r.udpFailed < o.maxUdp) {
    const msg = 'u' + w + '-' + (n++);
    if (s === undefined) s = open();
    let tries = 0;
    let answeredBy = 0;
    const ok = await new Promise((resolve) => {
      let timer;
      handler = (m) => { if (m.startsWith('be:' + msg + '#')) { answeredBy = Number(m.slice(msg.length + 4)); clearTimeout(timer); resolve(true); } };
      const send = () => {
        if (tries++ >= o.udpTries) { resolve(false); return; }
        s.send(msg + '#' + tries, o.udpPort, o.host, () => undefined);
        timer = setTimeout(send, o.udpWaitMs);
      };
      send();
    });
    handler = () => undefined;
    for (let k = 1; k < answeredBy; k++) unanswered.add(msg + '#' + k);
    if (!persistent) {
      const done = s;
      s = undefined;
      if (answeredBy > 1) { lingering.add(done); setTimeout(() => { if (lingering.delete(done)) done.close(); }, 3000); } else done.close();
    }
    if (ok) { r.udpOk++; if (tries > 1) { r.udpRetried++; r.udpRetries += tries - 1; } if (r.udpOk % 100 === 0) progress(); } else r.udpFailed++;
    if (persistent) await new Promise((resolve) => setTimeout(resolve, o.chunkMs / 10));
  }
  if (s !== undefined) lingering.add(s);
}

/** After the loops: late replies have had their time (bounded); what is still unanswered was lost. */
async function settleUdp() {
  const until = Date.now() + 3000;
  while (unanswered.size > 0 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 50));
  r.udpLost = unanswered.size;
  for (const s of lingering) s.close();
  lingering.clear();
}

(async () => {
  for (let i = 0; i < o.long; i += 50) await Promise.all(Array.from({ length: Math.min(50, o.long - i) }, (_, k) => openLong(i + k)));
  // Every long-lived connection has had its first echo before the restarts begin.
  await new Promise((resolve) => { const t = setInterval(() => { if (longs.every((c) => c.got === c.sent)) { clearInterval(t); resolve(); } }, 10); });
  process.stdout.write('LONG-READY\n');
  const tick = setInterval(() => { for (const c of longs) if (!c.done) c.send(); }, o.chunkMs);
  const loops = [...Array.from({ length: o.shortConcurrency }, (_, w) => shortLoop(w)),
    ...Array.from({ length: o.udpConcurrency ?? 1 }, (_, w) => udpLoop(w, false)),
    ...Array.from({ length: o.udpPersistent ?? 0 }, (_, w) => udpLoop('p' + w, true))];
  await new Promise((resolve) => process.stdin.on('data', (d) => { if (String(d).includes('stop')) resolve(); }));
  stopping = true;
  await Promise.all(loops);
  await settleUdp();
  clearInterval(tick);
  // A last line each, then a half-close: the backend's end comes after every echo.
  await Promise.all(longs.map((c) => new Promise((resolve) => { if (c.done) { resolve(); return; } c.onDone = resolve; c.send(); c.s.end(); })));
  finish();
})().catch((e) => { r.longErrors.push('setup:' + (e.code || e.message)); finish(); });
`;

export interface LoadOptions {
  host: string;
  tcpPort: number;
  udpPort: number;
  long: number;
  chunkMs: number;
  shortConcurrency: number;
  maxShort: number;
  maxUdp: number;
  udpWaitMs: number;
  udpTries: number;
  /** Loops of UDP queries each on a new flow (default 1). */
  udpConcurrency?: number;
  /** Loops of UDP queries each on one flow for all its queries, which keeps one session (default 0). */
  udpPersistent?: number;
  maxSeconds: number;
}

export interface LoadResult {
  longOpened: number;
  longCompleted: number;
  longErrors: string[];
  longMismatch: number;
  longBytes: number;
  shortOk: number;
  shortRefused: number;
  shortReset: number;
  shortOther: string[];
  shortMismatch: number;
  udpOk: number;
  udpRetried: number;
  udpRetries: number;
  udpFailed: number;
  /** Tries never answered, even late, of queries a retry answered: datagrams (or replies) lost. */
  udpLost: number;
  /** Tries answered after a retry had gone out: slow, not lost. */
  udpLate: number;
  /** Replies whose source was not the service's address and port. */
  udpWrongSource: number;
  timedOut: boolean;
}

export interface Load {
  pid: number | undefined;
  /** Resolves once every long-lived connection is open and has had its first echo. */
  longReady: Promise<void>;
  /** Resolves when the short connections answered reach `n` (counted in steps of 200). */
  shortAtLeast(n: number, timeoutMs?: number): Promise<void>;
  shortOk(): number;
  stop(): Promise<LoadResult>;
  kill(): void;
}

export function startLoad(ns: string, opts: LoadOptions): Load {
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', SCRIPT, JSON.stringify(opts)], { stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  let short = 0;
  const waiters: Array<() => void> = [];
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
    for (const m of out.matchAll(/PROGRESS (\{[^\n]*\})/g)) short = Math.max(short, (JSON.parse(m[1]!) as { short: number }).short);
    for (const w of waiters.splice(0)) w();
  });
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const until = (test: () => boolean, what: string, timeoutMs: number): Promise<void> => new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`load: no ${what} within ${timeoutMs} ms; stdout:\n${out.slice(-2000)}\nstderr:\n${err}`)), timeoutMs);
    const check = (): void => {
      if (test()) {
        clearTimeout(timer);
        resolve();
      } else if (child.exitCode !== null) {
        clearTimeout(timer);
        reject(new Error(`load exited before ${what}; stdout:\n${out.slice(-2000)}\nstderr:\n${err}`));
      } else waiters.push(check);
    };
    check();
  });
  return {
    pid: child.pid,
    longReady: until(() => out.includes('LONG-READY'), 'LONG-READY', 60_000),
    shortAtLeast: (n, timeoutMs = 30_000) => until(() => short >= n, `${n} short connections`, timeoutMs),
    shortOk: () => short,
    async stop() {
      child.stdin.write('stop\n');
      await until(() => out.includes('RESULT '), 'RESULT', opts.maxSeconds * 1000 + 10_000);
      await exited;
      const line = out.split('\n').find((l) => l.startsWith('RESULT ')) ?? '';
      return JSON.parse(line.slice('RESULT '.length)) as LoadResult;
    },
    kill() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
}
