/**
 * Parsers of what the load generators and /proc print. Pure: text in, numbers out; a parser that
 * cannot find a figure throws, so a changed output format fails loudly instead of reading as 0.
 */

export class ParseError extends Error {
  constructor(tool: string, what: string, text: string) {
    super(`${tool}: cannot find ${what} in its output: ${tail(text)}`);
    this.name = 'ParseError';
  }
}

export function tail(text: string, lines = 6): string {
  return text.trim().split('\n').slice(-lines).join(' | ');
}

function stripAnsi(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.replace(/\u001b\[[0-9;]*m/g, '');
}

function num(tool: string, what: string, text: string, re: RegExp): number {
  const m = re.exec(text);
  const v = m?.[1] === undefined ? NaN : Number(m[1]);
  if (!Number.isFinite(v)) throw new ParseError(tool, what, text);
  return v;
}

/** iperf3 -J: the receiver's throughput, in Gbit/s. */
export function parseIperf3(json: string): { gbps: number; retransmits: number } {
  let doc: { error?: string; end?: { sum_received?: { bits_per_second?: number }; sum_sent?: { retransmits?: number } } };
  try {
    doc = JSON.parse(json) as typeof doc;
  } catch {
    throw new ParseError('iperf3', 'a JSON report', json);
  }
  if (doc.error) throw new Error(`iperf3: ${doc.error}`);
  const bps = doc.end?.sum_received?.bits_per_second;
  if (typeof bps !== 'number') throw new ParseError('iperf3', 'end.sum_received.bits_per_second', json);
  return { gbps: bps / 1e9, retransmits: doc.end?.sum_sent?.retransmits ?? 0 };
}

/** The line bench's wrk script (WRK_SCRIPT) prints from its done() hook. */
export interface WrkReport {
  requests: number;
  durationUs: number;
  errors: number;
  p50Us: number;
  p90Us: number;
  p99Us: number;
  maxUs: number;
  meanUs: number;
}

/** A wrk script whose done() prints one JSON line, so nothing depends on wrk's human-readable units. */
export const WRK_SCRIPT = `done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK_JSON {"requests":%d,"durationUs":%d,"errors":%d,"p50Us":%d,"p90Us":%d,"p99Us":%d,"maxUs":%d,"meanUs":%.1f}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
`;

export function parseWrk(stdout: string): WrkReport {
  const line = stdout.split('\n').find((l) => l.startsWith('WRK_JSON '));
  if (!line) throw new ParseError('wrk', 'the WRK_JSON line of the bench script', stdout);
  const r = JSON.parse(line.slice('WRK_JSON '.length)) as WrkReport;
  if (!(r.durationUs > 0)) throw new ParseError('wrk', 'a positive duration', stdout);
  return r;
}

export interface SockperfReport {
  /** Round-trip times in microseconds (run with --full-rtt). */
  avgUs: number;
  p50Us: number;
  p99Us: number;
  p999Us: number;
  maxUs: number;
  observations: number;
  dropped: number;
}

export function parseSockperf(output: string): SockperfReport {
  const t = stripAnsi(output);
  const pct = (p: string): number => num('sockperf', `percentile ${p}`, t, new RegExp(`percentile ${p.replace('.', '\\.')} =\\s*([\\d.]+)`));
  return {
    avgUs: num('sockperf', 'avg-rtt', t, /avg-(?:rtt|lat)=([\d.]+)/),
    p50Us: pct('50.000'),
    p99Us: pct('99.000'),
    p999Us: pct('99.900'),
    maxUs: num('sockperf', '<MAX> observation', t, /<MAX> observation =\s*([\d.]+)/),
    observations: num('sockperf', 'observations', t, /Total (\d+) observations/),
    dropped: num('sockperf', 'dropped messages', t, /# dropped messages = (\d+)/),
  };
}

export interface DnsperfReport {
  sent: number;
  completed: number;
  lost: number;
  qps: number;
  avgLatencyMs: number;
}

export function parseDnsperf(output: string): DnsperfReport {
  return {
    sent: num('dnsperf', 'Queries sent', output, /Queries sent:\s+(\d+)/),
    completed: num('dnsperf', 'Queries completed', output, /Queries completed:\s+(\d+)/),
    lost: num('dnsperf', 'Queries lost', output, /Queries lost:\s+(\d+)/),
    qps: num('dnsperf', 'Queries per second', output, /Queries per second:\s+([\d.]+)/),
    avgLatencyMs: num('dnsperf', 'Average Latency', output, /Average Latency \(s\):\s+([\d.]+)/) * 1000,
  };
}

/** One row of /proc/net/tcp or /proc/net/udp (IPv4). */
export interface ProcNetSocket {
  host: string;
  port: number;
  /** Kernel state in hex: 0A is LISTEN for TCP; 07 is an unconnected UDP socket. */
  state: string;
}

/** Rows of /proc/net/tcp or /proc/net/udp. Addresses are printed as little-endian hex words. */
export function parseProcNet(text: string): ProcNetSocket[] {
  const out: ProcNetSocket[] = [];
  const lines = text.split('\n');
  for (let i = 1; i < lines.length; i++) {
    const f = (lines[i] as string).trim().split(/\s+/);
    const local = f[1];
    const state = f[3];
    if (!local || !state || local.length !== 13) continue;
    const word = parseInt(local.slice(0, 8), 16);
    const host = `${word & 0xff}.${(word >>> 8) & 0xff}.${(word >>> 16) & 0xff}.${word >>> 24}`;
    out.push({ host, port: parseInt(local.slice(9), 16), state });
  }
  return out;
}

/** utime + stime of /proc/<pid>/stat, in clock ticks, and the parent pid. */
export function parseProcStat(text: string): { ppid: number; ticks: number } {
  // The command name may hold spaces and parentheses: fields are counted from the last ')'.
  const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
  const ppid = Number(rest[1]);
  const ticks = Number(rest[11]) + Number(rest[12]);
  if (!Number.isFinite(ppid) || !Number.isFinite(ticks)) throw new ParseError('/proc/<pid>/stat', 'ppid, utime and stime', text);
  return { ppid, ticks };
}

/** VmRSS of /proc/<pid>/status, in bytes. */
export function parseVmRss(text: string): number {
  return num('/proc/<pid>/status', 'VmRSS', text, /VmRSS:\s+(\d+) kB/) * 1024;
}

/**
 * /proc/net/netstat or /proc/net/snmp: pairs of lines, names then values, each led by its group
 * (`TcpExt:`). Keys are `Group.Name` (`TcpExt.ListenOverflows`).
 */
export function parseNetstat(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  const lines = text.split('\n').filter((l) => l.trim() !== '');
  for (let i = 0; i + 1 < lines.length; i += 2) {
    const names = (lines[i] as string).trim().split(/\s+/);
    const values = (lines[i + 1] as string).trim().split(/\s+/);
    const group = names[0]?.replace(/:$/, '');
    if (group === undefined || values[0] !== names[0]) throw new ParseError('/proc/net/netstat', 'name and value lines in pairs', text);
    for (let k = 1; k < names.length; k++) out[`${group}.${names[k] as string}`] = Number(values[k]);
  }
  return out;
}
