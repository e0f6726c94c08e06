#!/usr/bin/env node
import { createSocket } from 'node:dgram';
import { connect } from 'node:net';
import { fileURLToPath } from 'node:url';
import { startProxy } from './app.js';
import { buildConfig } from './config.js';
import { startDemoBackends } from './demo-backends.js';
import { createLogger } from './log.js';
import type { UnitStatus } from './seams/unit-set.js';

/**
 * `npm run demo`: the README's first command. Starts the demo backends on loopback and the proxy
 * on examples/demo.yaml with the no-root loopback portal, sends one request through every service
 * port to show it works, then says how to reach each Service and keeps serving until Ctrl-C.
 * The one flag it takes is the log level (`npm run demo -- --log-level debug`; default warn): the
 * demo's setup is fixed, and `node dist/bundle/main.js --state examples/demo.yaml ...` takes every flag.
 */
const stateFile = fileURLToPath(new URL('../../examples/demo.yaml', import.meta.url));

function splitHostPort(addr: string): [string, number] {
  const i = addr.lastIndexOf(':');
  return [addr.slice(0, i), Number(addr.slice(i + 1))];
}

async function probeTcp(addr: string, http: boolean): Promise<string> {
  if (http) return (await (await fetch(`http://${addr}/`, { signal: AbortSignal.timeout(3000) })).text()).trim();
  const [host, port] = splitHostPort(addr);
  return new Promise((resolve, reject) => {
    const s = connect({ host, port, allowHalfOpen: true }, () => s.end('hello over TCP'));
    let reply = '';
    s.setTimeout(3000, () => s.destroy(new Error('no reply within 3s')));
    s.on('data', (d: Buffer) => { reply += d.toString(); });
    s.on('end', () => { s.destroy(); resolve(reply); });
    s.on('error', reject);
  });
}

async function probeUdp(addr: string): Promise<string> {
  const [host, port] = splitHostPort(addr);
  const s = createSocket('udp4');
  try {
    return await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no reply within 3s')), 3000);
      s.once('message', (m) => { clearTimeout(timer); resolve(m.toString()); });
      s.send('hello over UDP', port, host);
    });
  } finally {
    s.close();
  }
}

async function describe(s: UnitStatus, addr: string): Promise<string> {
  const http = s.servicePort.startsWith('default/web');
  const how = s.protocol === 'UDP' ? `echo hello | nc -u -w1 ${addr.replace(':', ' ')}` : http ? `curl http://${addr}/` : `echo hello | nc -q1 ${addr.replace(':', ' ')}`;
  let check: string;
  try {
    check = `-> "${s.protocol === 'UDP' ? await probeUdp(addr) : await probeTcp(addr, http)}"`;
  } catch (err) {
    check = `-> FAILED: ${err instanceof Error ? err.message : String(err)}`;
  }
  return `  ${s.servicePort.padEnd(24)} ${s.protocol}  ${how.padEnd(44)} ${check}`;
}

async function demo(): Promise<void> {
  const extra = process.argv.slice(2);
  const logLevel = extra.includes('--log-level') ? extra[extra.indexOf('--log-level') + 1] : 'warn';
  const config = buildConfig({ state: stateFile, portal: 'loopback', logLevel, iptablesMinSyncPeriod: '100ms', healthzBindAddress: '127.0.0.1:10256' });
  const logger = createLogger(config.logLevel);
  const backends = await startDemoBackends();
  const proxy = await startProxy(config, logger);
  const lines = ['', 'kube-userspace-proxy is serving examples/demo.yaml (no cluster, no root). Each service port, checked just now:', ''];
  for (const s of proxy.proxier.status()) {
    for (const addr of s.reachable) lines.push(await describe(s, addr));
  }
  lines.push(
    '',
    `  what runs where:  curl http://${proxy.adminAddress}/services`,
    `  metrics, health:  curl http://${proxy.adminAddress}/metrics ; curl http://${proxy.healthzAddress}/healthz`,
    `  edit ${stateFile} and the change applies live to new connections.`,
    '  Ctrl-C stops.',
    '',
  );
  console.log(lines.join('\n'));
  const stop = async (): Promise<void> => {
    await proxy.stop(2000);
    await backends.close();
  };
  process.once('SIGINT', () => void stop());
  process.once('SIGTERM', () => void stop());
}

demo().catch((err: unknown) => {
  console.error(`demo: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
});
