import { cp, mkdtemp, readFile, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { isBuiltin } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, type Spawned } from './helpers/cli.js';
import { freePort, tcpEchoServer, tcpRequest } from './helpers/net.js';
import { endpointSlice, list, service } from './helpers/objects.js';

/**
 * The bundle (rolldown.config.js) runs from the files the image's runtime stage has: dist/bundle,
 * package.json and node_modules, no dist/src. The rest of the suite runs it from the tree, where
 * dist/src sits beside it, so a chunk that still reached into dist/src would pass there. The
 * node_modules here is the tree's, dev dependencies and all: that the bundle needs no package the
 * image prunes (npm prune --omit=dev) is checked on its import specifiers instead.
 */

const ROOT = join(import.meta.dirname, '..');
const WEB = '127.96.62.1'; // loopback portal address of ClusterIP 10.96.62.1
const BACKEND = '127.0.62.1';

let dir: string;
let main: string;
let stateFile: string;
let webPort: number;
let echo: { close(): Promise<void> } | undefined;
const running: Spawned[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-bundle-'));
  await cp(join(ROOT, 'dist', 'bundle'), join(dir, 'app', 'dist', 'bundle'), { recursive: true });
  await cp(join(ROOT, 'package.json'), join(dir, 'app', 'package.json'));
  await symlink(join(ROOT, 'node_modules'), join(dir, 'app', 'node_modules'));
  main = join(dir, 'app', 'dist', 'bundle', 'main.js');
  const port = await freePort(BACKEND);
  echo = await tcpEchoServer(BACKEND, 'b0', port);
  webPort = await freePort(WEB);
  stateFile = join(dir, 'state.json');
  await writeFile(stateFile, list([
    service({ name: 'web', clusterIP: '10.96.62.1', ports: [{ name: 'http', port: webPort, targetPort: port }] }),
    endpointSlice({ service: 'web', ports: [{ name: 'http', port }], endpoints: [{ ip: BACKEND }] }),
  ]));
});

afterAll(async () => {
  for (const r of running) r.kill();
  await echo?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('the bundle, with only what the image copies', () => {
  it("imports from outside itself nothing but Node's own modules and package.json's dependencies", async () => {
    const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
    const files = (await readdir(join(ROOT, 'dist', 'bundle'), { recursive: true })).filter((f) => /\.[cm]?js$/.test(f));
    expect(files).toEqual(expect.arrayContaining(['main.js', 'worker-main.js']));
    const outside = new Set<string>();
    for (const f of files) {
      const text = await readFile(join(ROOT, 'dist', 'bundle', f), 'utf8');
      // Import and re-export statements (at the start of a line, as rolldown writes them), dynamic
      // imports, and the require() rolldown keeps for bundled CommonJS (__require). The last two
      // match in comments too (commander's JSDoc names "./option.js" so): relative specifiers,
      // the bundle's own chunks, are not looked at.
      const specs = /^(?:import|export)\b[^;]*?\bfrom\s*"([^"]+)"|^import\s*"([^"]+)"|\bimport\(\s*"([^"]+)"\s*\)|\b__require\(\s*"([^"]+)"\s*\)/gm;
      for (const m of text.matchAll(specs)) {
        const spec = (m[1] ?? m[2] ?? m[3] ?? m[4]) as string;
        if (spec.startsWith('./') || spec.startsWith('../')) continue;
        const name = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : (spec.split('/')[0] as string);
        if (isBuiltin(spec) || Object.hasOwn(pkg.dependencies, name)) continue;
        outside.add(`${f}: ${spec}`);
      }
    }
    expect([...outside]).toEqual([]);
  });

  it('tells its version from package.json', async () => {
    const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string };
    const r = runCli(['--version'], { main, cwd: join(dir, 'app') });
    running.push(r);
    expect(await r.exited).toBe(0);
    expect(r.stdout().trim()).toBe(pkg.version);
  });

  it('serves a Service from two worker processes started from the bundle, and stops cleanly', async () => {
    const r = runCli(['--state', stateFile, '--workers', '2', '--metrics-bind-address', '127.0.0.1:0', '--healthz-bind-address', '127.0.0.1:0', '--shutdown-grace-period', '1s'], { main, cwd: join(dir, 'app') });
    running.push(r);
    await r.waitForLine(/synced proxy rules/);
    expect(await tcpRequest(WEB, webPort, 'through the bundle\n')).toBe('b0:through the bundle\n');
    r.child.kill('SIGTERM');
    expect(await r.exited).toBe(0);
    expect(r.stderr()).toBe('');
  });
});
