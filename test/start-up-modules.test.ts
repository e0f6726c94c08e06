import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { MAIN } from './helpers/cli.js';

/** The built command module (what main.ts loads), imported by a fresh node: which of Node's own modules came with it. */
function builtinsLoadedByCommand(): string[] {
  const command = new URL('../dist/src/command.js', import.meta.url).href;
  const script = `await import(${JSON.stringify(command)}); process.stdout.write(JSON.stringify(process.moduleLoadList));`;
  return JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30_000 })) as string[];
}

/** Node's own modules loaded by the bundled binary (MAIN) by the time `--version` has been answered. */
function builtinsLoadedByBundle(): string[] {
  const dir = mkdtempSync(join(tmpdir(), 'kup-modules-'));
  try {
    const out = join(dir, 'modules.json');
    const preload = join(dir, 'preload.cjs');
    writeFileSync(preload, `process.on('exit', () => require('node:fs').writeFileSync(${JSON.stringify(out)}, JSON.stringify(process.moduleLoadList)));\n`);
    execFileSync(process.execPath, ['--require', preload, MAIN, '--version'], { encoding: 'utf8', timeout: 30_000 });
    return JSON.parse(readFileSync(out, 'utf8')) as string[];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("the binary's modules", () => {
  it('leave undici (fetch, WebSocket) unloaded with a state-file source: an ES import of node:http would load it at every such start', () => {
    expect(builtinsLoadedByCommand().filter((m) => m.includes('undici'))).toEqual([]);
  });

  it('leave undici unloaded in the bundle too, which loads every module of the command at once', () => {
    const loaded = builtinsLoadedByBundle();
    expect(loaded).toContain('NativeModule net'); // the command's modules were loaded
    expect(loaded.filter((m) => m.includes('undici'))).toEqual([]);
  });
});
