import { statSync } from 'node:fs';
import type { StateFileRead } from '../../src/io/kube/state-file-read.js';

/**
 * An early read of `path` (io/kube/state-file-read.ts) holding `content` in a buffer of its own,
 * with the file's stat as it is now, as if opened well after its last change.
 */
export function earlyReadOf(path: string, content: string): StateFileRead {
  const buf = Buffer.allocUnsafeSlow(Buffer.byteLength(content));
  buf.write(content);
  return { buf, stat: statSync(path, { bigint: true }), openedAtMs: Date.now() + 60_000 };
}
