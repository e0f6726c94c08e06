import { describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { buildConfig, type RawOptions } from '../src/config.js';
import { DEFAULT_OUTLIER_POLICY } from '../src/core/balancer/outlier.js';
import { parseKubeProxyConfiguration, renderKubeProxyConfiguration } from '../src/kube-proxy-config.js';

/** The flags and config-file fields of passive health, hold-when-empty and --emit-events. */

function options(argv: string[]): RawOptions {
  const outcome = parseCommandLine(argv);
  if (outcome.kind !== 'run') throw new Error(outcome.output);
  return outcome.options;
}

describe('passive health, hold and events: flags', () => {
  it('defaults to Envoy\'s times, holds bounded, no Events', () => {
    const config = buildConfig({});
    expect(config.outlier).toEqual(DEFAULT_OUTLIER_POLICY);
    expect(config).toMatchObject({ holdMaxPerServicePort: 100, holdMaxPerNode: 1000, emitEvents: false });
  });

  it('takes every flag', () => {
    const config = buildConfig(options([
      '--outlier-consecutive-failures', '3', '--outlier-base-ejection-time', '10s', '--outlier-max-ejection-time', '2m',
      '--outlier-max-ejection-percent', '50', '--hold-max-per-service-port', '5', '--hold-max-per-node', '50', '--emit-events',
    ]));
    expect(config.outlier).toEqual({ consecutiveFailures: 3, baseEjectionMs: 10_000, maxEjectionMs: 120_000, maxEjectionPercent: 50 });
    expect(config).toMatchObject({ holdMaxPerServicePort: 5, holdMaxPerNode: 50, emitEvents: true });
    expect(buildConfig(options(['--outlier-consecutive-failures', '0'])).outlier.consecutiveFailures).toBe(0);
  });

  it.each([
    [['--outlier-consecutive-failures', '-1'], /^--outlier-consecutive-failures: "-1" is not a whole number from 0 to up$/],
    [['--outlier-max-ejection-percent', '101'], /^--outlier-max-ejection-percent: "101" is not a whole number from 0 to 100$/],
    [['--outlier-base-ejection-time', 'soon'], /^--outlier-base-ejection-time: /],
    [['--outlier-max-ejection-time', '10s'], /^--outlier-max-ejection-time \(10s\) must not be shorter than --outlier-base-ejection-time \(default 30s\)$/],
    [['--hold-max-per-node', 'many'], /^--hold-max-per-node: "many" is not a whole number/],
  ])('refuses %j with one line naming the flag', (argv, message) => {
    expect(() => buildConfig(options(argv))).toThrow(message);
  });
});

describe('passive health, hold and events: the configuration file', () => {
  const HEAD = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n';

  it('reads them under kubeUserspaceProxy, and writes them back the same', () => {
    const { options: raw, warnings } = parseKubeProxyConfiguration(`${HEAD}kubeUserspaceProxy:
  outlierDetection:
    consecutiveFailures: 3
    baseEjectionTime: 10s
    maxEjectionTime: 2m0s
    maxEjectionPercent: 50
  holdMaxPerServicePort: 5
  holdMaxPerNode: 50
  emitEvents: true
`, 'proxy.yaml');
    expect(warnings).toEqual([]);
    const config = buildConfig(raw);
    expect(config.outlier).toEqual({ consecutiveFailures: 3, baseEjectionMs: 10_000, maxEjectionMs: 120_000, maxEjectionPercent: 50 });
    expect(config).toMatchObject({ holdMaxPerServicePort: 5, holdMaxPerNode: 50, emitEvents: true });
    const again = buildConfig(parseKubeProxyConfiguration(renderKubeProxyConfiguration(config), 'written.yaml').options);
    expect(again.outlier).toEqual(config.outlier);
    expect(again).toMatchObject({ holdMaxPerServicePort: 5, holdMaxPerNode: 50, emitEvents: true });
  });

  it('names the field of a bad value', () => {
    expect(() => parseKubeProxyConfiguration(`${HEAD}kubeUserspaceProxy:\n  holdMaxPerNode: -1\n`, 'proxy.yaml')).toThrow(/holdMaxPerNode: -1 is not a whole number of 0 or more/);
  });
});
