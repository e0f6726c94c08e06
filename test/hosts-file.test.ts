import { execFile, spawnSync } from 'node:child_process';
import { chmod, mkdtemp, readFile, readdir, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { HOSTS_BEGIN, HOSTS_END } from '../src/core/hosts-block.js';
import { HostsFile, removeHostsBlock } from '../src/io/names/hosts-file.js';
import { createLogger, silentLogger } from '../src/log.js';

/** The adapter on real files in a temporary directory: written, updated, removed, nothing else touched. */
let dir: string;
const CAN_BIND_MOUNT = process.getuid?.() === 0 && spawnSync('unshare', ['-m', 'true']).status === 0;
const HOSTS_FILE_JS = fileURLToPath(new URL('../dist/src/io/names/hosts-file.js', import.meta.url));
const LOG_JS = fileURLToPath(new URL('../dist/src/log.js', import.meta.url));

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kup-hosts-'));
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const ORIGINAL = '127.0.0.1 localhost\r\n# keep me\r\n10.0.0.1 db.local # and me, with no line break at the end';
const L1 = ['127.96.0.10 web.default.svc.cluster.local web.default.svc web.default'];
const L2 = [...L1, '127.96.0.11 api.default.svc.cluster.local api.default.svc api.default'];

function capture(): { logger: ReturnType<typeof createLogger>; lines: string[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _e, cb) {
      lines.push(...chunk.toString().split('\n').filter(Boolean));
      cb();
    },
  });
  return { logger: createLogger('info', sink), lines };
}

describe('HostsFile', () => {
  it('writes the block, rewrites it only when its lines change, removes it, and keeps every other byte and the mode', async () => {
    const file = join(dir, 'hosts');
    await writeFile(file, ORIGINAL);
    await chmod(file, 0o640);
    const hosts = new HostsFile({ path: file, logger: silentLogger() });
    await hosts.check();
    hosts.set(L1);
    await hosts.flush();
    expect(await readFile(file, 'utf8')).toBe(`${ORIGINAL}\r\n${HOSTS_BEGIN}\r\n${L1[0]}\r\n${HOSTS_END}`);
    expect((await stat(file)).mode & 0o777).toBe(0o640);
    const inode = (await stat(file)).ino;
    hosts.set([...L1]);
    await hosts.flush();
    expect((await stat(file)).ino).toBe(inode); // the same lines: not written again
    hosts.set(L2);
    await hosts.flush();
    expect((await stat(file)).ino).not.toBe(inode); // replaced by rename, not rewritten in place
    expect(await readFile(file, 'utf8')).toBe(`${ORIGINAL}\r\n${HOSTS_BEGIN}\r\n${L2.join('\r\n')}\r\n${HOSTS_END}`);
    expect((await stat(file)).mode & 0o777).toBe(0o640);
    await hosts.remove();
    expect(await readFile(file, 'utf8')).toBe(ORIGINAL);
    // No temporary file is left beside it.
    expect(await readdir(dir)).toEqual(['hosts']);
    // Nothing is written after removal.
    hosts.set(L1);
    await hosts.flush();
    expect(await readFile(file, 'utf8')).toBe(ORIGINAL);
  });

  it('keeps bytes that are not UTF-8 outside the block as they are (a Latin-1 comment)', async () => {
    const file = join(dir, 'hosts-latin1');
    const original = Buffer.concat([Buffer.from('127.0.0.1 localhost # caf'), Buffer.from([0xe9]), Buffer.from('\n')]);
    await writeFile(file, original);
    const hosts = new HostsFile({ path: file, logger: silentLogger() });
    await hosts.check();
    hosts.set(L1);
    await hosts.flush();
    expect((await readFile(file)).subarray(0, original.length).equals(original)).toBe(true);
    await hosts.remove();
    expect((await readFile(file)).equals(original)).toBe(true);
  });

  it('keeps lines a user added around the block meanwhile', async () => {
    const file = join(dir, 'hosts');
    await writeFile(file, '127.0.0.1 localhost\n');
    const hosts = new HostsFile({ path: file, logger: silentLogger() });
    hosts.set(L1);
    await hosts.flush();
    const edited = `# added above\n${await readFile(file, 'utf8')}10.9.9.9 added-below\n`;
    await writeFile(file, edited);
    hosts.set(L2);
    await hosts.flush();
    expect(await readFile(file, 'utf8')).toBe(`# added above\n127.0.0.1 localhost\n${HOSTS_BEGIN}\n${L2.join('\n')}\n${HOSTS_END}\n10.9.9.9 added-below\n`);
    await hosts.remove();
    expect(await readFile(file, 'utf8')).toBe('# added above\n127.0.0.1 localhost\n10.9.9.9 added-below\n');
  });

  it('rewrites in place when the file cannot be replaced (a bind mount: EBUSY), and says so once', async () => {
    const file = join(dir, 'hosts');
    await writeFile(file, ORIGINAL);
    const { logger, lines } = capture();
    const busy = async (): Promise<void> => {
      throw Object.assign(new Error('EBUSY: resource busy or locked, rename'), { code: 'EBUSY' });
    };
    const hosts = new HostsFile({ path: file, logger, rename: busy });
    const inode = (await stat(file)).ino;
    hosts.set(L2);
    await hosts.flush();
    hosts.set(L1);
    await hosts.flush();
    expect(await readFile(file, 'utf8')).toBe(`${ORIGINAL}\r\n${HOSTS_BEGIN}\r\n${L1[0]}\r\n${HOSTS_END}`);
    await hosts.remove();
    expect(await readFile(file, 'utf8')).toBe(ORIGINAL);
    expect((await stat(file)).ino).toBe(inode);
    expect(await readdir(dir)).toEqual(['hosts']);
    expect(lines.filter((l) => l.includes('rewriting it in place'))).toHaveLength(1);
  });

  it.skipIf(!CAN_BIND_MOUNT)(CAN_BIND_MOUNT ? 'rewrites in place a file bind-mounted over, as /etc/hosts is in a container' : 'bind mount: skipped, needs root and unshare', async () => {
    // In a mount namespace of its own (gone with the process): a file bind-mounted onto `hosts`.
    const file = join(dir, 'hosts');
    const source = join(dir, 'mounted');
    await writeFile(file, '');
    await writeFile(source, ORIGINAL);
    const script = `
      const { HostsFile } = await import(${JSON.stringify(HOSTS_FILE_JS)});
      const { silentLogger } = await import(${JSON.stringify(LOG_JS)});
      const { readFile } = await import('node:fs/promises');
      const h = new HostsFile({ path: ${JSON.stringify(file)}, logger: silentLogger() });
      h.set(${JSON.stringify(L1)});
      await h.flush();
      const written = await readFile(${JSON.stringify(file)}, 'utf8');
      await h.remove();
      console.log(JSON.stringify({ written, removed: await readFile(${JSON.stringify(file)}, 'utf8') }));`;
    const { stdout } = await promisify(execFile)('unshare', ['-m', 'sh', '-c', `mount --bind "$1" "$2" && exec "$3" --input-type=module -e "$4"`, 'sh', source, file, process.execPath, script]);
    const seen = JSON.parse(stdout) as { written: string; removed: string };
    expect(seen.written).toBe(`${ORIGINAL}\r\n${HOSTS_BEGIN}\r\n${L1[0]}\r\n${HOSTS_END}`);
    expect(seen.removed).toBe(ORIGINAL);
    expect(await readFile(source, 'utf8')).toBe(ORIGINAL);
    expect((await readdir(dir)).sort()).toEqual(['hosts', 'mounted']);
  });

  it('writes through a symbolic link, leaving the link', async () => {
    const real = join(dir, 'real-hosts');
    const link = join(dir, 'hosts');
    await writeFile(real, '127.0.0.1 localhost\n');
    await symlink(real, link);
    const hosts = new HostsFile({ path: link, logger: silentLogger() });
    hosts.set(L1);
    await hosts.flush();
    expect((await readFile(real, 'utf8')).includes(L1[0]!)).toBe(true);
    expect((await stat(link)).isFile()).toBe(true);
    await hosts.remove();
    expect(await readFile(real, 'utf8')).toBe('127.0.0.1 localhost\n');
  });

  it('creates a file that does not exist yet', async () => {
    const file = join(dir, 'new-hosts');
    const hosts = new HostsFile({ path: file, logger: silentLogger() });
    await hosts.check();
    hosts.set(L1);
    await hosts.flush();
    expect(await readFile(file, 'utf8')).toBe(`${HOSTS_BEGIN}\n${L1[0]}\n${HOSTS_END}\n`);
    await hosts.remove();
    expect(await readFile(file, 'utf8')).toBe('');
  });

  it('at start, names the flag for a file it cannot write or a broken block', async () => {
    await expect(new HostsFile({ path: join(dir, 'no-such-dir', 'hosts'), logger: silentLogger() }).check()).rejects.toThrow(/^--hosts-file .*no-such-dir\/hosts: cannot write it: no such directory$/);
    const broken = join(dir, 'broken');
    await writeFile(broken, `${HOSTS_BEGIN}\n1.2.3.4 x\n`);
    await expect(new HostsFile({ path: broken, logger: silentLogger() }).check()).rejects.toThrow(`${broken}: "${HOSTS_BEGIN}" without its "${HOSTS_END}" line`);
    if (process.getuid?.() !== 0) {
      const ro = join(dir, 'ro');
      await writeFile(ro, '');
      await chmod(ro, 0o444);
      await expect(new HostsFile({ path: ro, logger: silentLogger() }).check()).rejects.toThrow('cannot write it: permission denied');
    }
  });

  it('--cleanup: removeHostsBlock takes out a block left by a killed run, and nothing else', async () => {
    const file = join(dir, 'hosts');
    await writeFile(file, `127.0.0.1 localhost\n${HOSTS_BEGIN}\n${L1[0]}\n${HOSTS_END}\n# after\n`);
    expect(await removeHostsBlock(file)).toBe(true);
    expect(await readFile(file, 'utf8')).toBe('127.0.0.1 localhost\n# after\n');
    expect(await removeHostsBlock(file)).toBe(false);
    expect(await removeHostsBlock(join(dir, 'absent'))).toBe(false);
  });
});
