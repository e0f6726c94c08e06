import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Black-box tests spawn the built CLI as it ships (dist/bundle/main.js, rolldown.config.js), as a
 * user would run it: build once, as `npm run build` does, before any test file runs.
 */
export default function setup(): () => void {
  const root = fileURLToPath(new URL('..', import.meta.url));
  execFileSync(process.execPath, [`${root}node_modules/typescript/bin/tsc`, '-p', `${root}tsconfig.build.json`], { cwd: root, stdio: 'inherit' });
  // Its table of chunks is left out; warnings and errors are not.
  execFileSync(process.execPath, [`${root}node_modules/rolldown/bin/cli.mjs`, '-c'], { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] });
  // The CLI keeps V8's compile cache (src/main.ts), in the system's temporary directory unless
  // NODE_COMPILE_CACHE says where: the processes the tests start keep theirs in one of the run's
  // own (the test files' forks inherit this environment), removed at the end.
  const cache = mkdtempSync(join(tmpdir(), 'kup-test-compile-cache-'));
  process.env.NODE_COMPILE_CACHE = cache;
  return () => rmSync(cache, { recursive: true, force: true });
}
