import type { V1Service } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import { HttpKubeApi, KubeApiError, type KubeApi, type Query, type WatchOptions } from '../src/io/kube/api-client.js';
import { Reflector } from '../src/io/kube/reflector.js';
import { FakeApiServer } from './helpers/fake-apiserver.js';
import { waitFor } from './helpers/net.js';
import { service } from './helpers/objects.js';
import { captureLogger } from './helpers/proxy-fixtures.js';

/**
 * A watch that answers 410 Gone right after every successful list (an API server whose watch
 * cache lags the list, a proxy in between) must meet a growing backoff, as client-go's
 * reflector does (BackoffUntil between ListAndWatch rounds): the first 410 re-lists at once,
 * the following ones wait. The list's success must not reset the backoff the 410s build up.
 */

/** Counts the list calls the reflector makes, at the call (before any byte reaches the server). */
class CountingApi implements KubeApi {
  lists = 0;
  constructor(private readonly inner: KubeApi) {}
  get server(): string {
    return this.inner.server;
  }
  get(path: string, query: Query, signal: AbortSignal): Promise<unknown> {
    this.lists++;
    return this.inner.get(path, query, signal);
  }
  watch(path: string, query: Query, opts: WatchOptions): Promise<void> {
    return this.inner.watch(path, query, opts);
  }
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function startReflector(api: KubeApi, backoff: { initialMs: number; maxMs: number; factor?: number; jitter?: number }): Reflector<V1Service> {
  const { logger } = captureLogger('debug');
  const reflector = new Reflector<V1Service>({
    name: 'services',
    api,
    path: '/api/v1/services',
    handlers: { replace: () => {}, upsert: () => {}, remove: () => {} },
    logger,
    backoff,
  });
  cleanups.push(() => reflector.stop());
  reflector.start();
  return reflector;
}

describe('reflector: a watch that answers 410 after every list', () => {
  it('re-lists at once after the first 410 only; the second waits out the backoff', async () => {
    const server = await FakeApiServer.start();
    cleanups.push(() => server.close());
    server.apply('services', service({ name: 'web', clusterIP: '10.96.1.1', ports: [{ name: 'http', port: 80 }] }));
    // Every watch is refused with 410 Gone, however fresh its resourceVersion.
    server.fail('services', { status: 410, watch: true, times: 1000 });
    const api = new CountingApi(new HttpKubeApi(server.kubeConfig(), { requestTimeoutMs: 5000 }));
    // An hour: a second re-list inside this test can only come from a skipped backoff.
    const reflector = startReflector(api, { initialMs: 3_600_000, maxMs: 3_600_000 });
    await waitFor(() => reflector.stats.expired >= 2, 'two 410s');
    // The reflector has handled the second 410 (its stats say so): a re-list it started at once
    // would have been counted by now, since the call is made before any I/O.
    expect(reflector.stats.lists).toBe(2);
    expect(api.lists).toBe(2);
  });
});

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

describe('reflector: backoff left over from an outage', () => {
  it('a 410 after a quiet healthy watch re-lists at once', async () => {
    const api = new ScriptedApi();
    // The outage's failure waits 20 ms; a second one in the same streak would wait an hour.
    const reflector = startReflector(api, { initialMs: 20, maxMs: 3_600_000, factor: 180_000, jitter: 0 });
    await waitFor(() => reflector.stats.expired >= 1, 'the 410');
    // Lists: the failed one, the good one, and the re-list after the 410, at once.
    await waitFor(() => api.lists >= 3, 'the re-list after the 410');
    expect(api.lists).toBe(3);
  });
});
