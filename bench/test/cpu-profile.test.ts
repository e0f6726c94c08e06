import { describe, expect, it } from 'vitest';
import { summarizeProfile, type CpuProfile } from '../lib/cpu-profile.js';

/** A profile of a root with one child per URL, `hits` samples each. */
function profileOf(frames: Array<{ url: string; fn: string; hits: number }>): CpuProfile {
  const nodes = [
    { id: 1, callFrame: { functionName: '(root)', url: '', lineNumber: -1 }, hitCount: 0, children: frames.map((_, i) => i + 2) },
    ...frames.map((f, i) => ({ id: i + 2, callFrame: { functionName: f.fn, url: f.url, lineNumber: 10 }, hitCount: f.hits })),
  ];
  return { nodes, startTime: 0, endTime: 1_000_000 };
}

describe('the CPU profile summary', () => {
  it("counts the bundle's code as the proxy's, as it counts dist/src", () => {
    const text = summarizeProfile(
      profileOf([
        { url: 'file:///app/dist/bundle/command-9uNIhW0p.js', fn: 'relay', hits: 60 },
        { url: 'file:///repo/dist/src/core/units.js', fn: 'planUnits', hits: 30 },
        { url: 'node:net', fn: 'onconnection', hits: 10 },
      ]),
    );
    expect(text).toMatch(/^\s+90\.0%\s+the proxy's own JS/m);
    expect(text).toMatch(/^\s+10\.0%\s+Node's JS internals/m);
  });
});
