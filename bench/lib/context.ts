import type { Options } from './options.js';
import type { Pinning, Processes } from './proc.js';
import type { Tools } from './tools.js';

/** What every part of a run shares. */
export interface Context {
  options: Options;
  tools: Tools;
  pin: Pinning;
  procs: Processes;
  /** A temp directory for configs, state files and logs; removed at the end unless --keep-temp. */
  tmp: string;
  /** Where the proxies write CPU profiles (--profile), else undefined. */
  profileDir: string | undefined;
  /** The built proxy CLI (dist/bundle/main.js). */
  proxyMain: string;
  /** The node binary that runs it. */
  proxyNode: string;
  /** One line to the terminal (progress, skips). */
  say(line: string): void;
  /** A comparison that cannot run, with why: said once and recorded in the JSON. */
  skip(what: string, why: string): void;
}
