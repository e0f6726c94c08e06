import { describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { buildConfig } from '../src/config.js';
import { parseKubeProxyConfiguration, renderKubeProxyConfiguration } from '../src/kube-proxy-config.js';
import { workerInit } from '../src/start-workers.js';

/** `--workers` and `kubeUserspaceProxy.workers`: values, defaults, and each worker's share of --max-udp-sessions. */

const HEAD = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n';

function flags(...argv: string[]): ReturnType<typeof buildConfig> {
  const outcome = parseCommandLine(argv);
  if (outcome.kind !== 'run') throw new Error(outcome.output);
  return buildConfig(outcome.options);
}

describe('--workers', () => {
  it('takes auto or a whole number', () => {
    expect(flags('--workers', 'auto').workers).toBe('auto');
    expect(flags('--workers', '3').workers).toBe(3);
    expect(flags('--workers', '1').workers).toBe(1);
  });

  it.each(['0', '-1', '1.5', 'two', '', '257'])('refuses %j with one line naming the flag', (v) => {
    expect(() => flags('--workers', v)).toThrow(/^--workers: ".*" is neither auto nor a whole number from 1 to 256$/);
  });

  it('defaults to every core where the proxy serves the node (iptables, bind), to one process with loopback', () => {
    expect(flags().workers).toBe(1);
    expect(flags('--portal', 'loopback').workers).toBe(1);
    expect(flags('--portal', 'iptables').workers).toBe('auto');
    expect(flags('--portal', 'bind').workers).toBe('auto');
  });

  it('says so in --help', () => {
    const outcome = parseCommandLine(['--help']);
    expect(outcome.kind === 'exit' ? outcome.output : '').toMatch(/--workers <n>[\s\S]*default: auto with --portal iptables or bind, 1 with loopback/);
    expect(outcome.kind === 'exit' ? outcome.output : '').toMatch(/--max-udp-sessions <n>[\s\S]*shared equally among the workers/);
  });
});

describe('kubeUserspaceProxy.workers', () => {
  it('reads a number or "auto", and round-trips through --write-config-to', () => {
    expect(parseKubeProxyConfiguration(`${HEAD}kubeUserspaceProxy:\n  workers: 4\n`, 'p.yaml').options.workers).toBe('4');
    expect(parseKubeProxyConfiguration(`${HEAD}kubeUserspaceProxy:\n  workers: auto\n`, 'p.yaml').options.workers).toBe('auto');
    for (const workers of [2, 'auto'] as const) {
      const config = { ...flags('--portal', 'iptables'), workers };
      expect(buildConfig(parseKubeProxyConfiguration(renderKubeProxyConfiguration(config), 'w.yaml').options).workers).toBe(workers);
    }
  });

  it.each([['0', /kubeUserspaceProxy\.workers: "0" is neither auto/], ['many', /kubeUserspaceProxy\.workers: "many" is neither auto/], ['[2]', /kubeUserspaceProxy\.workers: expected a whole number or "auto", got a list/]])('refuses %s naming the file and the field', (v, re) => {
    expect(() => parseKubeProxyConfiguration(`${HEAD}kubeUserspaceProxy:\n  workers: ${v}\n`, 'p.yaml')).toThrow(re);
    expect(() => parseKubeProxyConfiguration(`${HEAD}kubeUserspaceProxy:\n  workers: ${v}\n`, 'p.yaml')).toThrow(/^p\.yaml: /);
  });
});

describe("a worker's settings", () => {
  it('gives each worker its share of --max-udp-sessions (rounded up) and its own index', () => {
    const config = flags('--max-udp-sessions', '4097', '--proxy-port-range', '30000-30100', '--udp-timeout', '1s');
    const init = workerInit(config, 2, 42, 1);
    expect(init).toMatchObject({ index: 1, workers: 2, seed: 42, maxUdpSessions: 2049, proxyPortRange: { base: 30000, size: 101 }, udpIdleTimeoutMs: 1000, sweepIntervalMs: 250 });
  });
});
