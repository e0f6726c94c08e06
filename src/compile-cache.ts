import { lstatSync, mkdirSync } from 'node:fs';
import { enableCompileCache } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * V8's code cache on disk (Node's compile cache): a start after the first compiles none of the
 * proxy's modules or its libraries' again, about a twentieth of the CPU of a start with 10,000
 * Services (bench/README.md). Quiet by design: a directory that cannot be used leaves it off.
 *
 * NODE_COMPILE_CACHE chooses the directory (Node has then enabled it already);
 * NODE_DISABLE_COMPILE_CACHE=1 turns it off. Otherwise the cache lives in a directory of this
 * user's own under the temporary directory, never Node's default `node-compile-cache` there: the
 * proxy often runs as root, and code cache is code, so a directory another local user could have
 * made first (or one open to others) is not used. The worker processes inherit the choice through
 * NODE_COMPILE_CACHE; command.ts writes the cache once the proxy serves.
 */
export function enableProxyCompileCache(env: NodeJS.ProcessEnv = process.env): void {
  if (env.NODE_COMPILE_CACHE !== undefined && env.NODE_COMPILE_CACHE !== '') return;
  const dir = privateDirectory(join(tmpdir(), `kube-userspace-proxy-compile-cache-${process.getuid?.() ?? 'user'}`));
  if (dir === undefined) return;
  if (enableCompileCache(dir).directory !== undefined) env.NODE_COMPILE_CACHE = dir;
}

/** The directory, made if missing; undefined unless it is a real directory, ours, closed to others. */
function privateDirectory(dir: string): string | undefined {
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') return undefined;
  }
  try {
    const st = lstatSync(dir);
    const uid = process.getuid?.();
    if (!st.isDirectory() || (uid !== undefined && st.uid !== uid) || (st.mode & 0o077) !== 0) return undefined;
    return dir;
  } catch {
    return undefined;
  }
}
