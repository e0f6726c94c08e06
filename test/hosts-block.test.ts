import { describe, expect, it } from 'vitest';
import { HOSTS_BEGIN, HOSTS_END, hostsBlockLines, spliceHostsBlock } from '../src/core/hosts-block.js';

const A = ['127.96.0.10 web.default.svc.cluster.local web.default.svc web.default'];
const B = ['127.96.0.10 web.default.svc.cluster.local web.default.svc web.default', '127.96.0.11 api.default.svc.cluster.local api.default.svc api.default'];

/** Put a block in, change it, take it out: the file must come back byte for byte. */
function roundTrip(original: string): void {
  const withA = spliceHostsBlock(original, A, 'hosts');
  expect(withA.startsWith(original)).toBe(true);
  expect(hostsBlockLines(withA, 'hosts')).toEqual(A);
  const withB = spliceHostsBlock(withA, B, 'hosts');
  expect(hostsBlockLines(withB, 'hosts')).toEqual(B);
  expect(spliceHostsBlock(withB, B, 'hosts')).toBe(withB);
  expect(spliceHostsBlock(withB, undefined, 'hosts')).toBe(original);
  expect(spliceHostsBlock(withA, undefined, 'hosts')).toBe(original);
}

describe('spliceHostsBlock', () => {
  it('appends after the last line and takes it out again, byte for byte', () => {
    const original = '127.0.0.1\tlocalhost\n::1 localhost ip6-localhost\n';
    const withA = spliceHostsBlock(original, A, 'hosts');
    expect(withA).toBe(`${original}${HOSTS_BEGIN}\n${A[0]}\n${HOSTS_END}\n`);
    roundTrip(original);
  });

  it('keeps a file without a trailing line break as it was', () => {
    const original = '127.0.0.1 localhost\n10.0.0.1 db # no newline at the end';
    const withA = spliceHostsBlock(original, A, 'hosts');
    expect(withA).toBe(`${original}\n${HOSTS_BEGIN}\n${A[0]}\n${HOSTS_END}`);
    roundTrip(original);
  });

  it('follows CRLF line breaks', () => {
    const original = '127.0.0.1 localhost\r\n# comment\r\n';
    const withA = spliceHostsBlock(original, A, 'hosts');
    expect(withA).toBe(`${original}${HOSTS_BEGIN}\r\n${A[0]}\r\n${HOSTS_END}\r\n`);
    roundTrip(original);
    roundTrip('127.0.0.1 localhost\r\n# no break at the end');
  });

  it('works on an empty file, and on one that is only blank lines', () => {
    expect(spliceHostsBlock('', A, 'hosts')).toBe(`${HOSTS_BEGIN}\n${A[0]}\n${HOSTS_END}\n`);
    roundTrip('');
    roundTrip('\n\n');
  });

  it('replaces a block between other lines without touching them, and removes it with its line break', () => {
    const before = '127.0.0.1 localhost\n# before\n';
    const after = '# after: a user added this line below the block\n10.1.1.1 other\n';
    const text = `${before}${HOSTS_BEGIN}\n old line\n${HOSTS_END}\n${after}`;
    expect(spliceHostsBlock(text, B, 'hosts')).toBe(`${before}${HOSTS_BEGIN}\n${B.join('\n')}\n${HOSTS_END}\n${after}`);
    expect(spliceHostsBlock(text, undefined, 'hosts')).toBe(before + after);
    // An empty block keeps its markers.
    expect(spliceHostsBlock(text, [], 'hosts')).toBe(`${before}${HOSTS_BEGIN}\n${HOSTS_END}\n${after}`);
  });

  it('leaves a file with no block alone when asked to remove it', () => {
    for (const t of ['', 'x', '127.0.0.1 localhost\n', '# BEGIN kube-userspace-proxy-other\n']) expect(spliceHostsBlock(t, undefined, 'hosts')).toBe(t);
  });

  it('refuses a broken block, naming the file and the line, rather than guess', () => {
    expect(() => spliceHostsBlock(`a\n${HOSTS_BEGIN}\nb\n`, A, '/etc/hosts')).toThrow(`/etc/hosts: "${HOSTS_BEGIN}" without its "${HOSTS_END}" line`);
    expect(() => spliceHostsBlock(`a\n${HOSTS_END}\n`, undefined, '/etc/hosts')).toThrow(`/etc/hosts:2: "${HOSTS_END}" without its`);
    expect(() => spliceHostsBlock(`${HOSTS_BEGIN}\n${HOSTS_END}\n${HOSTS_BEGIN}\n${HOSTS_END}\n`, A, '/etc/hosts')).toThrow('/etc/hosts:3: a second');
  });
});
