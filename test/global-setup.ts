import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/**
 * Black-box tests spawn the built CLI (dist/src/main.js), as a user would run it: build once
 * before any test file runs.
 */
export default function setup(): void {
  const root = fileURLToPath(new URL('..', import.meta.url));
  execFileSync(process.execPath, [`${root}node_modules/typescript/bin/tsc`, '-p', `${root}tsconfig.build.json`], { cwd: root, stdio: 'inherit' });
}
