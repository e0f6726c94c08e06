// @ts-check
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

/**
 * The layers, from the bottom up; each imports only from itself and the layers below it:
 *   src/core/     pure decisions: no sockets, processes, files or clocks of their own
 *   src/seams/    the interfaces the proxier, the sources and the adapters meet through
 *   src/io/       thin adapters: sockets, the Kubernetes API, files, portals, HTTP
 *   src/proxier/  the sync loop and the unit set: drive the seams, never an adapter directly
 *   src/workers/  the worker pool (controller side) and the worker's message loop: drive the
 *                 seams (worker processes, unit sets) like proxier/, beside it
 *   src/*.ts      the composition root (main, command, app, cli, config, worker-main): builds and wires everything
 */
const LAYER_IMPORTS = {
  core: { allowed: ['core'], message: 'core/ is pure: it imports only core/' },
  seams: { allowed: ['core', 'seams'], message: 'seams/ holds interfaces: it imports only core/ and seams/' },
  io: { allowed: ['core', 'seams', 'io'], message: 'io/ imports only io/, core/ and seams/: what it needs from above comes in through a seam' },
  proxier: { allowed: ['core', 'seams', 'proxier'], message: 'proxier/ drives adapters through seams: it imports only core/, seams/ and proxier/' },
  workers: { allowed: ['core', 'seams', 'workers'], message: 'workers/ drives worker processes and unit sets through seams: it imports only core/, seams/ and workers/' },
};
const LAYERS = ['core', 'seams', 'io', 'proxier', 'workers'];

/**
 * Patterns (relative specifiers) that leave `layer` for somewhere it may not import from, for a file
 * `depth` folders below src/ (src/core/x.ts is depth 1, src/core/rules/x.ts depth 2): from there
 * exactly `depth` steps up reach src/, where the composition root and the other layers live.
 */
function forbiddenFrom(layer, depth) {
  const { allowed, message } = LAYER_IMPORTS[layer];
  const up = `(\\.\\./){${depth}}`;
  const others = LAYERS.filter((l) => !allowed.includes(l));
  return [
    { regex: `^${up}[^./][^/]*\\.js$`, message: `${message} (not the composition root in src/)` },
    ...others.map((l) => ({ regex: `^${up}${l}/`, message })),
  ];
}

/** One config per layer and folder depth (layers are at most four folders deep). */
function layerRules() {
  const configs = [];
  for (const layer of LAYERS) {
    for (let depth = 1; depth <= 4; depth++) {
      const below = '*/'.repeat(depth - 1);
      configs.push({
        files: [`src/${layer}/${below}*.ts`],
        rules: {
          '@typescript-eslint/no-restricted-imports': ['error', {
            patterns: [
              ...forbiddenFrom(layer, depth),
              // seams/ may name node's socket types in its interfaces; nothing below io/ may do I/O.
              ...(layer === 'io' ? [] : [{ group: NODE_IO, message: `${layer}/ does no I/O of its own: side effects come in through a seam`, allowTypeImports: layer === 'seams' }]),
            ],
          }],
        },
      });
    }
  }
  return configs;
}

/** Node's modules that do I/O (or read the host: os), each as `node:x` and as bare `x`. */
const NODE_IO = ['net', 'dgram', 'child_process', 'fs', 'fs/promises', 'http', 'https', 'http2', 'os', 'dns', 'dns/promises', 'tls']
  .flatMap((m) => [`node:${m}`, m]);

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'bench/results/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
  },
  { files: ['**/*.js'], ...tseslint.configs.disableTypeChecked },
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-console': 'error',
    },
  },
  ...layerRules(),
  {
    // core/ takes its clock and random source by injection (STYLE habit 2).
    files: ['src/core/**/*.ts'],
    rules: {
      'no-restricted-globals': ['error', { name: 'setTimeout', message: 'core/ takes its clock by injection' }, { name: 'setInterval', message: 'core/ takes its clock by injection' }],
      'no-restricted-properties': ['error', { object: 'Date', property: 'now', message: 'core/ takes its clock by injection' }, { object: 'Math', property: 'random', message: 'core/ takes its random source by injection' }],
    },
  },
  {
    // The loop and the unit set take their timers by injection (runner.ts's RunnerTimers), so that
    // tests drive them: runner.ts's realTimers is the one default, and says so where it does.
    files: ['src/proxier/**/*.ts'],
    rules: {
      'no-restricted-globals': ['error', { name: 'setTimeout', message: 'proxier/ takes its timers by injection (RunnerTimers)' }, { name: 'setInterval', message: 'proxier/ takes its timers by injection (RunnerTimers)' }],
    },
  },
  {
    rules: {
      // An async method that does not await implements a Promise-returning seam: a throw in it
      // becomes a rejection, which is what its callers handle.
      '@typescript-eslint/require-await': 'off',
    },
  },
  {
    // Tests and the bench stringify what they captured and hand methods of fakes around on purpose.
    files: ['test/**/*.ts', 'bench/**/*.ts'],
    rules: {
      '@typescript-eslint/no-base-to-string': 'off',
      '@typescript-eslint/unbound-method': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/prefer-promise-reject-errors': 'off',
    },
  },
  {
    files: ['src/cli.ts', 'src/main.ts', 'src/command.ts', 'src/demo.ts', 'bench/**/*.ts'],
    rules: { 'no-console': 'off' },
  },
);
