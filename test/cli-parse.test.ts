import { describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { buildConfig } from '../src/config.js';
import { stateArgument } from '../src/state-argument.js';

describe('flag names as kube-proxy has them', () => {
  it('accepts --sync-period and --min-sync-period for the iptables-prefixed flags', () => {
    const outcome = parseCommandLine(['--sync-period', '1m30s', '--min-sync-period', '250ms']);
    expect(outcome.kind).toBe('run');
    if (outcome.kind !== 'run') return;
    const config = buildConfig(outcome.options);
    expect(config.syncPeriodMs).toBe(90_000);
    expect(config.minSyncPeriodMs).toBe(250);
  });

  it('passes on only the flags given, so a --config file can supply the rest', () => {
    const outcome = parseCommandLine(['--udp-timeout', '1s']);
    expect(outcome).toEqual({ kind: 'run', options: { udpTimeout: '1s' } });
  });

  it('takes port ranges as a-b, a+n and p', () => {
    for (const [flag, base, size] of [['30000-30009', 30000, 10], ['30000+9', 30000, 10], ['30000', 30000, 1]] as const) {
      const outcome = parseCommandLine(['--proxy-port-range', flag]);
      if (outcome.kind !== 'run') throw new Error('parse failed');
      expect(buildConfig(outcome.options).proxyPortRange).toEqual({ base, size });
    }
  });
});

describe('the --state argument found before commander is loaded (main.ts reads the file early)', () => {
  it('is the path commander reads, for each way of writing it', () => {
    const lines: string[][] = [
      ['--state', 'a.json'],
      ['--state=a.json'],
      ['--portal', 'loopback', '--state', '/tmp/x y.json', '--udp-timeout', '1s'],
      ['--state', 'a.json', '--state=b.json'],
      ['--state=', '--portal', 'loopback'],
      ['--state', '-odd.json'],
      ['--portal', 'loopback'],
    ];
    for (const argv of lines) {
      const outcome = parseCommandLine(argv);
      const parsed = outcome.kind === 'run' ? outcome.options.state : undefined;
      expect({ argv, path: stateArgument(argv) }).toEqual({ argv, path: parsed === '' ? undefined : parsed });
    }
  });

  it('finds none where the command exits without a source', () => {
    for (const flag of [['--help'], ['-h'], ['--version'], ['--cleanup'], ['--write-config-to', 'c.yaml'], ['--write-config-to=c.yaml']]) {
      expect(stateArgument(['--state', 'a.json', ...flag])).toBeUndefined();
    }
  });

  it('finds none after -- or without a value, where commander refuses the line', () => {
    expect(stateArgument(['--', '--state', 'a.json'])).toBeUndefined();
    expect(stateArgument(['--state'])).toBeUndefined();
    expect(parseCommandLine(['--state']).kind).toBe('exit');
  });
});

describe('TCP connection flags', () => {
  const config = (argv: string[]): ReturnType<typeof buildConfig> => {
    const outcome = parseCommandLine(argv);
    if (outcome.kind !== 'run') throw new Error(outcome.output);
    return buildConfig(outcome.options);
  };

  it('keepalive defaults to Go\'s 15 s and the idle limit to never', () => {
    expect(config([])).toMatchObject({ tcpKeepAliveMs: 15_000, tcpIdleTimeoutMs: 0 });
  });

  it('--tcp-keepalive counts whole seconds (rounded up) and 0 turns it off; --tcp-idle-timeout is a duration', () => {
    expect(config(['--tcp-keepalive', '1500ms', '--tcp-idle-timeout', '1h'])).toMatchObject({ tcpKeepAliveMs: 2000, tcpIdleTimeoutMs: 3_600_000 });
    expect(config(['--tcp-keepalive', '0'])).toMatchObject({ tcpKeepAliveMs: 0 });
    expect(() => config(['--tcp-idle-timeout', '10'])).toThrow(/^--tcp-idle-timeout: /);
    // Past Linux's TCP_KEEPIDLE the kernel refuses the setting and Node says nothing.
    expect(config(['--tcp-keepalive', '9h6m7s'])).toMatchObject({ tcpKeepAliveMs: 32_767_000 });
    expect(() => config(['--tcp-keepalive', '10h'])).toThrow(/^--tcp-keepalive: 10h is longer than Linux's TCP_KEEPIDLE allows \(at most 9h6m7s\)$/);
  });
});

describe('durations longer than a timer holds', () => {
  const config = (argv: string[]): ReturnType<typeof buildConfig> => {
    const outcome = parseCommandLine(argv);
    if (outcome.kind !== 'run') throw new Error(outcome.output);
    return buildConfig(outcome.options);
  };

  // Node fires a timer of more than 2^31-1 ms at once: a 1000h grace period cut every connection
  // at SIGTERM, and a 720h config sync period resynced every second.
  it.each(['--shutdown-grace-period', '--config-sync-period', '--iptables-sync-period', '--udp-timeout', '--tcp-idle-timeout'])('%s past 24 days is refused in one line', (name) => {
    expect(() => config([name, '1000h'])).toThrow(new RegExp(`^${name}: 1000h is longer than the proxy can time \\(at most 576h0m0s, 24 days: Node.js's timers\\)$`));
    expect(() => config([name, '576h'])).not.toThrow();
  });
});
