import { readFile, writeFile } from 'node:fs/promises';
import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { waitFor } from './helpers/net.js';
import { createHandoverNode, HO, type HandoverNode } from './helpers/handover-node.js';
import { netnsSkipReason, reportSkip } from './helpers/netns.js';

/**
 * A proxy stopped by SIGTERM with no successor drains for --shutdown-grace-period; a proxy started
 * meanwhile (nothing answers on the hand-over socket any more: a normal start) writes the
 * hosts-file block. When the first one's drain ends, the block it removes is the running one's.
 */
reportSkip('handover-hosts-drain.test.ts', netnsSkipReason);

let node: HandoverNode | undefined;
let client: ReturnType<typeof spawn> | undefined;
afterEach(async () => {
  client?.kill('SIGKILL');
  await node?.destroy();
  node = undefined;
});

describe('a draining proxy and its hosts-file block', () => {
  it.skipIf(netnsSkipReason !== undefined)('the block of a proxy started during another\'s drain stays when that drain ends', async () => {
    node = await createHandoverNode('hohostsdr');
    const hosts = `${node.dir}/hosts`;
    await writeFile(hosts, '127.0.0.1 localhost\n');
    const old = node.proxy(['--hosts-file', hosts]);
    await old.waitForLine(/answering hand-overs/, 30_000);
    // A long-lived connection keeps the old process draining.
    const script = `const s = require('node:net').connect(${HO.tcpPort}, '${HO.loopbackIP}', () => s.write('x')); s.once('data', () => process.stdout.write('open\\n')); process.stdin.on('data', () => s.end()); s.on('close', () => process.exit(0));`;
    client = spawn('ip', ['netns', 'exec', node.ns, process.execPath, '-e', script], { stdio: ['pipe', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => client!.stdout!.once('data', () => resolve()));
    old.child.kill('SIGTERM');
    await old.waitForLine(/shutting down/);
    const next = node.proxy(['--hosts-file', hosts]);
    await next.waitForLine(/answering hand-overs/, 30_000);
    const block = await waitFor(async () => {
      const text = await readFile(hosts, 'utf8');
      return text.includes('echo.default.svc.cluster.local') ? text : undefined;
    }, 'the hosts-file block');
    // The old one's last connection ends: it finishes its drain and exits.
    client.stdin!.write('done');
    expect(await old.exited).toBe(0);
    expect(next.child.exitCode).toBeNull();
    expect(await readFile(hosts, 'utf8')).toBe(block);
  }, 120_000);
});
