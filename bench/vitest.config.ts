import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

/** The benchmark harness's brief run (`npm run test:bench-harness`): kept out of `npm test`. */
export default defineConfig({
  root: fileURLToPath(new URL('..', import.meta.url)),
  test: {
    include: ['bench/test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 200_000,
    hookTimeout: 30_000,
    pool: 'forks',
    maxWorkers: 1,
  },
});
