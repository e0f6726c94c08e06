import { describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { buildConfig } from '../src/config.js';
import { decodeHandoverLine, encodeHandoverMessage, HANDOVER_PROTOCOL, NONE_OF_THEM, refuseReason, unservedMessage, unservedUnits, type HandoverHello, type HandoverMessage } from '../src/core/handover.js';
import { parseKubeProxyConfiguration } from '../src/kube-proxy-config.js';

/** The hand-over protocol's messages and the old process's decision (src/core/handover.ts). */
const hello = (over: Partial<HandoverHello> = {}): HandoverHello => ({ t: 'hello', protocol: HANDOVER_PROTOCOL, version: '0.1.0', pid: 42, portal: 'iptables', bindAddress: '0.0.0.0', ...over });
const mine = { portal: 'iptables', bindAddress: '0.0.0.0' };

describe('the hand-over messages', () => {
  it('round-trip through one JSON line each', () => {
    const messages: HandoverMessage[] = [
      hello(),
      { t: 'welcome', pid: 7, version: '0.1.0', proxyPorts: [{ id: 'default/web:http/TCP', port: 40001 }] },
      { t: 'welcome', pid: 7, version: '0.1.0', proxyPorts: [], units: ['default/web:http/TCP'] },
      { t: 'refused', pid: 7, reason: 'no' },
      { t: 'ready' },
      { t: 'released' },
    ];
    for (const m of messages) {
      const line = encodeHandoverMessage(m);
      expect(line.endsWith('\n')).toBe(true);
      expect(line.slice(0, -1)).not.toContain('\n');
      expect(decodeHandoverLine(line.slice(0, -1))).toEqual(m);
    }
  });

  it('reads anything else as no message: the peer is not a proxy', () => {
    for (const line of ['', 'GET / HTTP/1.1', '[]', '{"t":"hello"}', '{"t":"welcome","pid":1,"version":"x","proxyPorts":[{"id":1}]}', '{"t":"welcome","pid":1,"version":"x","proxyPorts":[],"units":[1]}', '{"t":"bye"}']) {
      expect(decodeHandoverLine(line)).toBeUndefined();
    }
  });
});

describe('the old process takes a newcomer', () => {
  it('with the same protocol, portal and bind address, when no other is taking over', () => {
    expect(refuseReason(hello({ version: '0.2.0' }), mine, false)).toBeUndefined();
  });

  it('refuses, saying why in one line: another protocol, another portal or bind address, one already taking over', () => {
    expect(refuseReason(hello({ protocol: HANDOVER_PROTOCOL + 1 }), mine, false)).toMatch(/^hand-over protocol 2 .* is not this process's 1/);
    expect(refuseReason(hello({ portal: 'bind' }), mine, false)).toBe('--portal bind differs from the running process\'s --portal iptables: the portal cannot change in a hand-over (stop the running proxy, then start)');
    expect(refuseReason(hello({ bindAddress: '10.0.0.1' }), mine, false)).toMatch(/^--bind-address 10\.0\.0\.1 differs/);
    expect(refuseReason(hello(), mine, true)).toBe('another process is taking over right now; only one can');
    for (const r of [refuseReason(hello({ portal: 'bind' }), mine, false), refuseReason(hello(), mine, true)]) expect(r).not.toContain('\n');
  });
});

describe('the new process says ready only if it listens for what the old one serves', () => {
  const err = (name: string, ...errors: string[]): { name: string; errors: string[] } => ({ name, errors });

  it('names the units the old process serves that have a listen error here; not those it lacks or that listen', () => {
    const mine = [err('a'), err('b', 'cannot listen on 10.0.0.1:53: the address is not local to this node'), err('c', 'x'), err('d', 'y')];
    expect(unservedUnits(['a', 'b', 'd', 'gone'], mine)).toEqual([mine[1], mine[3]]);
    expect(unservedUnits([], mine)).toEqual([]);
  });

  it('names every unit the old process serves when the new one runs none of them (its source is wrong, not the cluster)', () => {
    expect(unservedUnits(['a', 'b'], [err('c')])).toEqual([{ name: 'a', errors: [NONE_OF_THEM] }, { name: 'b', errors: [NONE_OF_THEM] }]);
    expect(unservedUnits(['a', 'b'], [])).toHaveLength(2);
    // One of them still there: the others' Services went away meanwhile.
    expect(unservedUnits(['a', 'b'], [err('a')])).toEqual([]);
  });

  it('says so in one line: the first unit with its error, a few more by name', () => {
    expect(unservedMessage(7, [err('default/dns:dns/UDP', 'cannot listen on 10.0.0.1:53: permission denied')])).toBe('hand-over abandoned: 1 service port the running proxy (pid 7) serves cannot listen here: default/dns:dns/UDP: cannot listen on 10.0.0.1:53: permission denied; it serves on');
    const many = ['a', 'b', 'c', 'd', 'e'].map((n) => err(n, `e-${n}`));
    expect(unservedMessage(7, many)).toBe('hand-over abandoned: 5 service ports the running proxy (pid 7) serves cannot listen here: a: e-a; also b, c and 2 more; it serves on');
  });
});

describe('--handover-socket', () => {
  it('is a flag and a config field (empty: off)', () => {
    const parsed = parseCommandLine(['--handover-socket', '/run/kup/handover.sock']);
    if (parsed.kind !== 'run') throw new Error(parsed.output);
    expect(buildConfig(parsed.options).handoverSocket).toBe('/run/kup/handover.sock');
    const { options } = parseKubeProxyConfiguration('apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nkubeUserspaceProxy:\n  handoverSocket: /run/kup/h.sock\n', 'c.yaml');
    expect(buildConfig(options).handoverSocket).toBe('/run/kup/h.sock');
    const { options: none } = parseKubeProxyConfiguration('apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nkubeUserspaceProxy:\n  handoverSocket: ""\n', 'c.yaml');
    expect(buildConfig(none).handoverSocket).toBeUndefined();
  });
});
