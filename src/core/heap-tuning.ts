/**
 * glibc's malloc settings the proxy wants from the start of the process, and whether this process
 * still needs them.
 *
 * Node allocates a 64 KiB buffer for each read of an accepted socket. glibc hands memory back to
 * the kernel as soon as 128 KiB are free at the top of the heap (M_TRIM_THRESHOLD), so under bulk
 * traffic the heap shrinks and grows without pause and the proxy spends a sixth of its cycles on
 * page faults (bench/README.md has the figures). glibc reads these settings from the environment
 * once, when the process starts, and Node has no mallopt(): the container image sets them, and a
 * proxy started directly re-executes itself once with them (main.ts).
 */
export const HEAP_TUNING: Readonly<Record<string, string>> = {
  /** Keep up to 256 MiB free at the top of the heap before giving it back. */
  MALLOC_TRIM_THRESHOLD_: '268435456',
  /** Grow the heap 16 MiB at a time. */
  MALLOC_TOP_PAD_: '16777216',
};

/**
 * The environment to re-execute with, or undefined when there is nothing to do: not Linux (other
 * C libraries ignore these names), the settings already present (the image, a second pass), or
 * the user chose their own (any value of either name, or a glibc.malloc tunable, wins).
 */
export function heapTuningEnv(platform: string, env: Readonly<Record<string, string | undefined>>): Record<string, string> | undefined {
  if (platform !== 'linux') return undefined;
  if (Object.keys(HEAP_TUNING).some((name) => env[name] !== undefined)) return undefined;
  if (/glibc\.malloc\.(trim_threshold|top_pad)/.test(env.GLIBC_TUNABLES ?? '')) return undefined;
  return { ...definedEnv(env), ...HEAP_TUNING };
}

/** The environment without its unset names, as execve takes it. */
export function definedEnv(env: Readonly<Record<string, string | undefined>>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out[k] = v;
  return out;
}

/**
 * V8's young generation, a question of footprint too. V8 sizes a semi-space from the heap limit,
 * and new space holds two: with Node's default limit on a machine of 24 GiB (4 GiB of heap), a
 * semi-space grows to 64 MiB, 128 MiB of new space, most of it resident once start-up has filled
 * it. Start-up keeps nearly everything it allocates (the state, the balancers, a socket per
 * service port), so a scavenge copies what is live whatever the size of new space: a larger one
 * costs memory, not less copying. Per connection the proxy allocates little and briefly, which a
 * 16 MiB semi-space holds as well (bench/README.md has the figures, at start-up and under load).
 */
export const V8_HEAP_FLAGS: readonly string[] = ['--max-semi-space-size=16'];

/**
 * The node flags to re-execute with: none when the process has them, or when the user sized the
 * heap themself, on the command line or in NODE_OPTIONS (either spelling, dashes or underscores);
 * V8 refuses --max-heap-size beside both other sizes, so that counts as a choice too.
 */
export function heapTuningFlags(execArgv: readonly string[], nodeOptions: string | undefined): string[] {
  const given = [...execArgv, ...nodeOptionTokens(nodeOptions)].map((a) => a.replace(/_/g, '-'));
  if (given.some((a) => /^--(max-semi-space-size|min-semi-space-size|max-heap-size)\b/.test(a))) return [];
  return [...V8_HEAP_FLAGS];
}

/**
 * Whether node runs under a debugger (--inspect, --inspect-brk, --inspect-wait), on its command
 * line or in NODE_OPTIONS (which node leaves out of execArgv): re-executing would stop twice at
 * --inspect-brk and lose the session.
 */
export function underDebugger(execArgv: readonly string[], nodeOptions: string | undefined): boolean {
  return [...execArgv, ...nodeOptionTokens(nodeOptions)].some((a) => a.startsWith('--inspect'));
}

/**
 * NODE_OPTIONS as node reads it, near enough for the flags above: words split at white space,
 * each word's surrounding double quotes dropped (node accepts `"--max-semi-space-size=4"`).
 */
function nodeOptionTokens(nodeOptions: string | undefined): string[] {
  return (nodeOptions ?? '')
    .split(/\s+/)
    .filter((a) => a !== '')
    .map((a) => a.replace(/^"(.*)"$/, '$1'));
}
