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
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out[k] = v;
  return { ...out, ...HEAP_TUNING };
}
