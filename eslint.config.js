// @ts-check
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'bench/results/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-console': 'error',
    },
  },
  {
    // core/ holds pure decisions: no sockets, processes, files or clocks of its own (STYLE.md).
    files: ['src/core/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [
          { group: ['**/io/**', '../io/*', '../../io/*'], message: 'core/ must not import from io/' },
          { group: ['node:net', 'node:dgram', 'node:child_process', 'node:fs', 'node:fs/promises', 'node:http', 'net', 'dgram', 'child_process', 'fs', 'http'], message: 'core/ is pure: side effects come in through interfaces' },
        ],
      }],
      'no-restricted-globals': ['error', { name: 'setTimeout', message: 'core/ takes its clock by injection' }, { name: 'setInterval', message: 'core/ takes its clock by injection' }],
      'no-restricted-properties': ['error', { object: 'Date', property: 'now', message: 'core/ takes its clock by injection' }, { object: 'Math', property: 'random', message: 'core/ takes its random source by injection' }],
    },
  },
  {
    files: ['src/cli.ts', 'src/main.ts', 'src/demo.ts', 'bench/**/*.ts'],
    rules: { 'no-console': 'off' },
  },
);
