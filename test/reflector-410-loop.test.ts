import type { V1Service } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import { HttpKubeApi, type KubeApi, type Query, type WatchOptions } from '../src/io/kube/api-client.js';
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

describe('reflector: a watch that answers 410 after every list', () => {
  it('re-lists at once after the first 410 only; the second waits out the backoff', async () => {
    const server = await FakeApiServer.start();
    cleanups.push(() => server.close());
    server.apply('services', service({ name: 'web', clusterIP: '10.96.1.1', ports: [{ name: 'http', port: 80 }] }));
    // Every watch is refused with 410 Gone, however fresh its resourceVersion.
    server.fail('services', { status: 410, watch: true, times: 1000 });
    const api = new CountingApi(new HttpKubeApi(server.kubeConfig(), { requestTimeoutMs: 5000 }));
    const { logger } = captureLogger('debug');
    const reflector = new Reflector<V1Service>({
      name: 'services',
      api,
      path: '/api/v1/services',
      handlers: { replace: () => {}, upsert: () => {}, remove: () => {} },
      logger,
      // An hour: a second re-list inside this test can only come from a skipped backoff.
      backoff: { initialMs: 3_600_000, maxMs: 3_600_000 },
    });
    cleanups.push(() => reflector.stop());
    reflector.start();
    await waitFor(() => reflector.stats.expired >= 2, 'two 410s');
    // The reflector has handled the second 410 (its stats say so): a re-list it started at once
    // would have been counted by now, since the call is made before any I/O.
    expect(reflector.stats.lists).toBe(2);
    expect(api.lists).toBe(2);
  });
});
