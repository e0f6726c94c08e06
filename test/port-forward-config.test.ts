import { describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { buildConfig } from '../src/config.js';
import { parseKubeProxyConfiguration, renderKubeProxyConfiguration } from '../src/kube-proxy-config.js';

/** `--dialer` and `--namespace`: flags, the config file's fields, and what they refuse. */

function options(argv: string[]): Record<string, unknown> {
  const outcome = parseCommandLine(argv);
  if (outcome.kind !== 'run') throw new Error(outcome.output);
  return outcome.options as Record<string, unknown>;
}

describe('--dialer and --namespace', () => {
  it('default to the direct dialer and every namespace', () => {
    const config = buildConfig({});
    expect(config.dialer).toBe('direct');
    expect(config.namespaces).toEqual([]);
  });

  it('take port-forward and repeated namespaces, once each', () => {
    const raw = options(['--dialer', 'port-forward', '--namespace', 'team-a', '--namespace', 'team-b', '--namespace', 'team-a']);
    expect(raw).toMatchObject({ dialer: 'port-forward', namespaces: ['team-a', 'team-b', 'team-a'] });
    const config = buildConfig(raw);
    expect(config.dialer).toBe('port-forward');
    expect(config.namespaces).toEqual(['team-a', 'team-b']);
  });

  it('refuse what they cannot do, in one line naming the flag', () => {
    expect(() => buildConfig({ dialer: 'tunnel' })).toThrow('--dialer: "tunnel" is not one of direct, port-forward');
    expect(() => buildConfig({ namespaces: ['Team_A'] })).toThrow(`--namespace: "Team_A" is not a namespace name (lower-case letters, digits and '-', at most 63 characters)`);
    expect(() => buildConfig({ state: 'x.yaml', dialer: 'port-forward' })).toThrow('--dialer port-forward reaches pods through the API server: it needs a cluster (--kubeconfig), not --state');
    expect(() => buildConfig({ state: 'x.yaml', namespaces: ['a'] })).toThrow(/--namespace chooses what is watched in a cluster/);
  });

  it('are fields of the config file, written back by --write-config-to', () => {
    const file = [
      'apiVersion: kubeproxy.config.k8s.io/v1alpha1',
      'kind: KubeProxyConfiguration',
      'kubeUserspaceProxy:',
      '  dialer: port-forward',
      '  namespaces: [team-a, team-b]',
    ].join('\n');
    const { options: raw } = parseKubeProxyConfiguration(file, 'dev.yaml');
    const config = buildConfig(raw);
    expect([config.dialer, config.namespaces]).toEqual(['port-forward', ['team-a', 'team-b']]);
    expect(renderKubeProxyConfiguration(config)).toMatch(/ {2}dialer: port-forward\n {2}namespaces:\n {4}- team-a\n {4}- team-b\n/);
    expect(() => parseKubeProxyConfiguration(file.replace('port-forward', 'carrier-pigeon'), 'dev.yaml')).toThrow('dev.yaml: kubeUserspaceProxy.dialer: "carrier-pigeon" is not one of direct, port-forward');
  });
});
