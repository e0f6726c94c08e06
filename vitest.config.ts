import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Namespace tests share the host's netns machinery and the CLI tests spawn processes: keep files
    // in separate forks but bounded, as the machine has two cores.
    pool: 'forks',
    maxWorkers: 2,
    reporters: ['default'],
  },
});
