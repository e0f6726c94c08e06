import { describe, expect, it } from 'vitest';
import { descriptorBudget, MIN_RESERVED } from '../src/core/descriptor-budget.js';

describe('descriptorBudget', () => {
  it('keeps what the expected connections need, at most half the limit and at least MIN_RESERVED', () => {
    // 20,000 (this machine kind's hard limit): 64 + 2 x 4096 kept, the rest may listen.
    expect(descriptorBudget(20_000)).toEqual({ limit: 20_000, reserved: 8256, maxListeners: 11_744 });
    // A low limit still serves some Services: half is kept.
    expect(descriptorBudget(2048)).toEqual({ limit: 2048, reserved: 1024, maxListeners: 1024 });
    expect(descriptorBudget(300)).toEqual({ limit: 300, reserved: MIN_RESERVED, maxListeners: 44 });
    expect(descriptorBudget(100)).toEqual({ limit: 100, reserved: 100, maxListeners: 0 });
    expect(descriptorBudget(Infinity).maxListeners).toBe(Infinity);
    expect(descriptorBudget(1_048_576, 1000)).toEqual({ limit: 1_048_576, reserved: 2064, maxListeners: 1_046_512 });
  });
});
