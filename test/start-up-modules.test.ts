import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';

/** The built command module (what main.ts loads), imported by a fresh node: which of Node's own modules came with it. */
function builtinsLoadedByCommand(): string[] {
  const command = new URL('../dist/src/command.js', import.meta.url).href;
  const script = `await import(${JSON.stringify(command)}); process.stdout.write(JSON.stringify(process.moduleLoadList));`;
  return JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30_000 })) as string[];
}

describe("the binary's modules", () => {
  it('leave undici (fetch, WebSocket) unloaded with a state-file source: an ES import of node:http would load it at every such start', () => {
    expect(builtinsLoadedByCommand().filter((m) => m.includes('undici'))).toEqual([]);
  });
});
