import type { V1Service } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import { KubeApiError, type KubeApi, type Query, type WatchOptions } from '../src/io/kube/api-client.js';
import { Reflector } from '../src/io/kube/reflector.js';
import { waitFor } from './helpers/net.js';
import { captureLogger } from './helpers/proxy-fixtures.js';

/**
 * One list fails (an outage), the next succeeds, a watch opens and stays quiet (no event, no
 * bookmark) then ends as at its timeout; the next watch gets 410. A watch that lived ends the
 * outage's streak of failures, so that 410 is re-listed at once, not after the backoff.
 */
class ScriptedApi implements KubeApi {
  readonly server = 'scripted';
  lists = 0;
  watches = 0;
  async get(_path: string, _query: Query, _signal: AbortSignal): Promise<unknown> {
    this.lists++;
    if (this.lists === 1) throw new KubeApiError('list: 503', 'Status', { status: 503 });
    return { items: [], metadata: { resourceVersion: String(this.lists) } };
  }
  async watch(_path: string, _query: Query, opts: WatchOptions): Promise<void> {
    this.watches++;
    opts.onOpen?.();
    if (this.watches === 1) {
      // Quiet, then ended by the server (a timeout, or a cut without a bookmark).
      await new Promise((r) => setTimeout(r, 1100));
      return;
    }
    if (this.watches === 2) {
      opts.onEvent({ type: 'ERROR', object: { kind: 'Status', code: 410, reason: 'Expired', message: 'too old resource version' } });
      return;
    }
    await new Promise<void>((resolve) => opts.signal.addEventListener('abort', () => resolve()));
  }
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('Reflector: backoff left over from an outage', () => {
  it('a 410 after a quiet healthy watch re-lists at once', async () => {
    const api = new ScriptedApi();
    const { logger } = captureLogger('debug');
    const reflector = new Reflector<V1Service>({
      name: 'services',
      api,
      path: '/api/v1/services',
      handlers: { replace: () => {}, upsert: () => {}, remove: () => {} },
      logger,
      // First failure waits 20 ms; a second one in the same streak would wait an hour.
      backoff: { initialMs: 20, maxMs: 3_600_000, factor: 180_000, jitter: 0 },
    });
    cleanups.push(() => reflector.stop());
    reflector.start();
    await waitFor(() => reflector.stats.expired >= 1, 'the 410');
    await new Promise((r) => setTimeout(r, 300));
    // lists: 1 failed + 1 good + the re-list after the 410.
    expect(api.lists).toBe(3);
  });
});
