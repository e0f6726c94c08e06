/** Flags after which the command exits without a source. */
const NO_PROXY = new Set(['-h', '--help', '--version', '--cleanup', '--write-config-to']);

/**
 * The `--state` argument, found without loading commander: main.ts begins reading the file
 * before the rest of the proxy is loaded. `--state FILE` or `--state=FILE`, the last one given,
 * none after `--`: commander's reading in every line where no other option takes `--state` as its
 * value (`--hostname-override --state=x` gives no state to commander, `x` here). Only a head
 * start: the file source takes the early read only if this path is the one the parsed options
 * name (create-source.ts), so a line read differently here costs the read of a regular file for
 * nothing (let go of once the source is made), never a wrong state. None with --help, --version,
 * --cleanup or --write-config-to, which exit without a source.
 */
export function stateArgument(argv: readonly string[]): string | undefined {
  let path: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') break;
    // These print or write something and exit: the file would be read for nothing.
    if (NO_PROXY.has(arg) || arg.startsWith('--write-config-to=')) return undefined;
    if (arg === '--state' && i + 1 < argv.length) path = argv[++i];
    else if (arg.startsWith('--state=')) path = arg.slice('--state='.length);
  }
  return path === '' ? undefined : path;
}
