import type { RandomSource } from '../../src/core/clock.js';
import { seededRandom } from '../../src/core/balancer/shared-order.js';

/** mulberry32 (the workers' shared order uses the same), so shuffles and port picks are reproducible. */
export function seeded(seed: number): RandomSource {
  return seededRandom(seed);
}
