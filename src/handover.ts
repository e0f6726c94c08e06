import { ProxyError } from './core/errors.js';
import { unservedMessage, unservedUnits, type HandoverProxyPort, type HandoverSettings } from './core/handover.js';
import type { ProxyConfig } from './config.js';
import { askToTakeOver, type HandoverSession } from './io/handover/handover-client.js';
import { HandoverServer, type HandoverPeer } from './io/handover/handover-server.js';
import { enableMigrateReq } from './io/net/migrate-req.js';
import type { Logger } from './log.js';
import type { RunningProxy } from './app.js';
import { VERSION } from './version.js';

/**
 * `--handover-socket` in the composition root (docs/handover.md): a starting proxy asks the
 * running one to hand over before it binds anything; once it serves it says ready, and then
 * answers on the path itself, for the next one.
 */

const settingsOf = (config: ProxyConfig): HandoverSettings => ({ portal: config.portal, bindAddress: config.bindAddress });

export interface TakeOver {
  /** The process handing over, and what it runs. */
  from: { pid: number; version: string; proxyPorts: HandoverProxyPort[]; units: string[] };
  session: HandoverSession;
}

/**
 * Before anything binds: turns on tcp_migrate_req (or says once why it cannot), then asks whoever
 * answers at the path to hand over. Undefined: nobody does (a normal start). A refusal throws
 * ProxyError HANDOVER with the old process's reason: that process serves on.
 */
export async function takeOverIfRunning(config: ProxyConfig, logger: Logger): Promise<TakeOver | undefined> {
  const path = config.handoverSocket;
  if (path === undefined) return undefined;
  const log = logger.child({ component: 'handover' });
  const migrate = await enableMigrateReq();
  if (migrate.state === 'off') log.warn(`net.ipv4.tcp_migrate_req is off: ${migrate.why}; a hand-over may reset the few connections in the old process's accept queue at the instant it closes its listeners`);
  else if (migrate.changed) log.info('set net.ipv4.tcp_migrate_req=1: connections queued on a closing listener move to its successor');
  const start = await askToTakeOver(path, { ...settingsOf(config), version: VERSION, pid: process.pid });
  switch (start.kind) {
    case 'alone':
      return undefined;
    case 'refused':
      throw new ProxyError('HANDOVER', `hand-over refused by the running proxy${start.pid ? ` (pid ${start.pid})` : ''}: ${start.reason}; it serves on`);
    case 'welcome': {
      const { welcome } = start;
      log.info({ from: welcome.pid, version: welcome.version, units: welcome.proxyPorts.length }, 'taking over from the running proxy: binding its addresses beside it');
      const units = welcome.units ?? welcome.proxyPorts.map((p) => p.id);
      return { from: { pid: welcome.pid, version: welcome.version, proxyPorts: welcome.proxyPorts, units }, session: start.session };
    }
  }
}

/**
 * This process serves: tells the old one, which stops accepting and lets go of the path. Proxy
 * ports that differ from the old process's are said (the portal's rules then moved with them).
 * Should a unit the old process serves not listen here, it is not ready: the hand-over is
 * abandoned (the old one serves on) and this throws ProxyError HANDOVER saying which.
 */
export async function completeTakeOver(takeOver: TakeOver, proxy: RunningProxy, logger: Logger): Promise<void> {
  const log = logger.child({ component: 'handover' });
  await proxy.units.refresh();
  const unserved = unservedUnits(takeOver.from.units, proxy.units.status());
  if (unserved.length > 0) {
    // This process's syncs stop first: one still running after the abandon could rewrite the
    // portal after the old process has restored its rules.
    await proxy.proxier.pause();
    takeOver.session.abandon();
    throw new ProxyError('HANDOVER', unservedMessage(takeOver.from.pid, unserved));
  }
  const outcome = await takeOver.session.ready();
  const mine = new Map(proxy.units.views().map((v) => [v.unit.id, v.proxyPort]));
  const moved = takeOver.from.proxyPorts.filter((p) => mine.has(p.id) && mine.get(p.id) !== p.port).map((p) => p.id);
  if (moved.length > 0) log.warn({ units: moved.slice(0, 20), count: moved.length }, 'some proxy ports differ from the previous process\'s: their portal rules were rewritten');
  if (outcome === 'released') log.info({ from: takeOver.from.pid }, 'took over from the previous process: serving');
  else log.warn({ from: takeOver.from.pid }, 'the previous process went away during the hand-over: serving as after a normal start');
}

/** Answers on the path for the next process. `handedOver` resolves when one has taken over. */
export async function serveHandover(config: ProxyConfig, proxy: RunningProxy, logger: Logger): Promise<{ server: HandoverServer; handedOver: Promise<HandoverPeer> } | undefined> {
  const path = config.handoverSocket;
  if (path === undefined) return undefined;
  let resolve: (peer: HandoverPeer) => void = () => undefined;
  const handedOver = new Promise<HandoverPeer>((r) => {
    resolve = r;
  });
  const server = await HandoverServer.listen({
    path,
    settings: settingsOf(config),
    version: VERSION,
    pid: process.pid,
    logger,
    proxyPorts: () => proxy.units.views().flatMap((v) => (v.proxyPort === undefined ? [] : [{ id: v.unit.id, port: v.proxyPort }])),
    servedUnits: async () => {
      await proxy.units.refresh();
      return proxy.units.status().filter((s) => s.errors.length === 0 && s.notServed === undefined).map((s) => s.name);
    },
    onHandedOver: (peer) => resolve(peer),
    // Not ready while a successor takes over: its pod's readiness probe may reach this process.
    onSuccessor: (peer) => {
      proxy.health.setHandingOver(peer?.pid);
      // Gone before it served: its first sync may have rewritten the portal's rules (a unit it
      // could not listen for, a proxy port it moved). This process's own rules go back at once.
      if (peer === undefined) void proxy.proxier.syncNow(true).catch(() => undefined);
    },
  });
  logger.child({ component: 'handover' }).info({ socket: path }, 'answering hand-overs');
  return { server, handedOver };
}
