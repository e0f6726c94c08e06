import { execFile } from 'node:child_process';
import { accessSync, constants, existsSync } from 'node:fs';
import { delimiter, join } from 'node:path';

/**
 * The external programs the harness drives. Nothing is installed at run time: a tool that is not
 * there skips what needs it, with a line naming the Debian package that provides it.
 */
export type ToolName = 'taskset' | 'prlimit' | 'nginx' | 'nginx-stream' | 'haproxy' | 'wrk' | 'iperf3' | 'sockperf' | 'dnsperf' | 'dnsmasq';

export const PACKAGES: Readonly<Record<ToolName, string>> = {
  taskset: 'util-linux',
  prlimit: 'util-linux',
  nginx: 'nginx-core',
  'nginx-stream': 'libnginx-mod-stream',
  haproxy: 'haproxy',
  wrk: 'wrk',
  iperf3: 'iperf3',
  sockperf: 'sockperf',
  dnsperf: 'dnsperf',
  dnsmasq: 'dnsmasq-base',
};

const BINARIES: Readonly<Record<Exclude<ToolName, 'nginx-stream'>, string>> = {
  taskset: 'taskset',
  prlimit: 'prlimit',
  nginx: 'nginx',
  haproxy: 'haproxy',
  wrk: 'wrk',
  iperf3: 'iperf3',
  sockperf: 'sockperf',
  dnsperf: 'dnsperf',
  dnsmasq: 'dnsmasq',
};

/** Where Debian's nginx-core looks for dynamic modules; the stream module may also be built in. */
const STREAM_MODULE = '/usr/lib/nginx/modules/ngx_stream_module.so';

export interface Tools {
  /** Absolute path per tool found. For nginx-stream: the module to load, or '' when built in. */
  found: Partial<Record<ToolName, string>>;
  versions: Partial<Record<ToolName, string>>;
}

export function has(tools: Tools, ...names: ToolName[]): boolean {
  return names.every((n) => tools.found[n] !== undefined);
}

export function path(tools: Tools, name: ToolName): string {
  const p = tools.found[name];
  if (p === undefined) throw new Error(`bug: ${name} used without checking it was found`);
  return p;
}

/** "needs wrk (Debian package wrk), iperf3 (iperf3)" for the tools of `names` that are missing. */
export function missingLine(tools: Tools, names: readonly ToolName[]): string | undefined {
  const missing = names.filter((n) => tools.found[n] === undefined);
  if (missing.length === 0) return undefined;
  return `not found: ${missing.map((n) => `${n} (Debian package ${PACKAGES[n]})`).join(', ')}`;
}

function which(binary: string): string | undefined {
  // sbin is searched too: nginx, haproxy and dnsmasq live there and a user's PATH may lack it.
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/local/sbin', '/usr/sbin', '/sbin'];
  for (const dir of dirs) {
    if (!dir) continue;
    const candidate = join(dir, binary);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

function firstLine(cmd: string, args: string[]): Promise<string> {
  return new Promise((resolve) => {
    execFile(cmd, args, { timeout: 5000 }, (_err, stdout, stderr) => {
      const line = `${stdout}\n${stderr}`.split('\n').map((l) => l.trim()).find((l) => /\d+\.\d+/.test(l));
      resolve(line ?? '');
    });
  });
}

const VERSION_ARGS: Readonly<Record<Exclude<ToolName, 'nginx-stream' | 'taskset' | 'prlimit'>, string[]>> = {
  nginx: ['-v'],
  haproxy: ['-v'],
  wrk: ['--version'],
  iperf3: ['--version'],
  sockperf: ['--version'],
  dnsperf: ['-h'],
  dnsmasq: ['--version'],
};

async function streamModule(nginx: string): Promise<string | undefined> {
  if (existsSync(STREAM_MODULE)) return STREAM_MODULE;
  const configure = await new Promise<string>((resolve) => {
    execFile(nginx, ['-V'], { timeout: 5000 }, (_err, stdout, stderr) => resolve(`${stdout}${stderr}`));
  });
  return /--with-stream(\s|$)/.test(configure) ? '' : undefined;
}

export async function findTools(): Promise<Tools> {
  const tools: Tools = { found: {}, versions: {} };
  for (const [name, binary] of Object.entries(BINARIES) as Array<[Exclude<ToolName, 'nginx-stream'>, string]>) {
    const p = which(binary);
    if (p !== undefined) tools.found[name] = p;
  }
  if (tools.found.nginx) {
    const mod = await streamModule(tools.found.nginx);
    if (mod !== undefined) tools.found['nginx-stream'] = mod;
  }
  await Promise.all(
    (Object.keys(VERSION_ARGS) as Array<keyof typeof VERSION_ARGS>)
      .filter((n) => tools.found[n])
      .map(async (n) => {
        tools.versions[n] = await firstLine(tools.found[n] as string, VERSION_ARGS[n]);
      }),
  );
  return tools;
}
