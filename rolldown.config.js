// @ts-check
import { defineConfig } from 'rolldown';

/**
 * The binary as it ships: tsc's output (dist/src) bundled into dist/bundle, the command's entry
 * and the worker processes', with the chunks they share. Node then loads about 15 files where it
 * resolved, read and ran some 230 at every start: a start with 10,000 Services takes about a
 * tenth less time, `--version` a third less (bench/README.md, ninth session). tsc stays the
 * compiler; this only joins its output.
 *
 * The chunks stay beside the entries: start-workers.ts finds worker-main.js beside the chunk it
 * is in, and version.ts finds package.json two folders up (test/bundle.test.ts fails otherwise).
 *
 * @kubernetes/client-node stays outside, loaded from node_modules when a cluster is the source,
 * as before: it is imported only then, and Node keeps quiet about deprecated APIs only for code
 * inside node_modules, so its dependencies' `punycode` and `new Buffer()` would print warnings at
 * every such start from a bundle.
 */
export default defineConfig({
  input: ['dist/src/main.js', 'dist/src/worker-main.js'],
  platform: 'node',
  external: ['@kubernetes/client-node'],
  logLevel: 'warn',
  output: { dir: 'dist/bundle', format: 'esm', cleanDir: true },
});
