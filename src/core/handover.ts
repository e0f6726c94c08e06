/**
 * The hand-over protocol (`--handover-socket`, docs/handover.md): JSON lines over a unix socket
 * between the running proxy ("old") and a starting one ("new"). Pure: the messages, their
 * decoding, the old side's decision (take the newcomer or refuse it, and why) and the new side's
 * (whether it may say ready).
 *
 *   new -> old  hello     who it is and the settings that must match
 *   old -> new  welcome   what the new one must reuse (the proxy port of every unit) and serve
 *                         (the units it serves), or
 *   old -> new  refused   one line saying why; the new one prints it and exits non-zero
 *   new -> old  ready     every socket is bound (SO_REUSEPORT) and the first sync serves; a new
 *                         one that cannot listen for a unit the old one serves closes the line
 *                         instead (unservedUnits)
 *   old -> new  released  the old one has stopped answering on the path: the new one binds it
 *
 * The old one closes its listeners only after `ready`; until then anything that goes wrong (the
 * new one dies, the line closes) leaves it serving, as if nothing had been tried.
 */

/** Bumped when a message changes meaning: a process refuses a peer speaking another. */
export const HANDOVER_PROTOCOL = 1;

/** The settings two processes must share for one to take over the other's ports and portal. */
export interface HandoverSettings {
  /** `--portal`: the rules, addresses or loopback listeners that steer traffic are not touched by the swap. */
  portal: string;
  /** `--bind-address`: where proxy ports listen (the iptables portal's rules point there). */
  bindAddress: string;
}

export interface HandoverHello extends HandoverSettings {
  t: 'hello';
  protocol: number;
  /** The package version, for the log line. */
  version: string;
  pid: number;
}

export interface HandoverProxyPort {
  /** The unit id (ServicePortName and protocol). */
  id: string;
  port: number;
}

export interface HandoverWelcome {
  t: 'welcome';
  pid: number;
  version: string;
  /** The proxy port every unit has now: the portal's rules point there, so the new one binds the same. */
  proxyPorts: HandoverProxyPort[];
  /**
   * The units it serves, every listener bound (ids): the new one says ready only if it listens for
   * each of them too. Absent from an older process: its proxyPorts' units stand for them.
   */
  units?: string[];
}

export interface HandoverRefused {
  t: 'refused';
  pid: number;
  reason: string;
}

export interface HandoverReady {
  t: 'ready';
}

export interface HandoverReleased {
  t: 'released';
}

export type HandoverMessage = HandoverHello | HandoverWelcome | HandoverRefused | HandoverReady | HandoverReleased;

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** One line of the protocol, or undefined when it is not one (the peer speaks something else). */
export function decodeHandoverLine(line: string): HandoverMessage | undefined {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch {
    return undefined;
  }
  if (!isObject(v)) return undefined;
  switch (v.t) {
    case 'hello':
      if (typeof v.protocol !== 'number' || typeof v.version !== 'string' || typeof v.pid !== 'number' || typeof v.portal !== 'string' || typeof v.bindAddress !== 'string') return undefined;
      return { t: 'hello', protocol: v.protocol, version: v.version, pid: v.pid, portal: v.portal, bindAddress: v.bindAddress };
    case 'welcome': {
      if (typeof v.pid !== 'number' || typeof v.version !== 'string' || !Array.isArray(v.proxyPorts)) return undefined;
      const proxyPorts: HandoverProxyPort[] = [];
      for (const p of v.proxyPorts as unknown[]) {
        if (!isObject(p) || typeof p.id !== 'string' || typeof p.port !== 'number') return undefined;
        proxyPorts.push({ id: p.id, port: p.port });
      }
      if (v.units === undefined) return { t: 'welcome', pid: v.pid, version: v.version, proxyPorts };
      if (!Array.isArray(v.units) || !(v.units as unknown[]).every((u) => typeof u === 'string')) return undefined;
      return { t: 'welcome', pid: v.pid, version: v.version, proxyPorts, units: v.units as string[] };
    }
    case 'refused':
      if (typeof v.pid !== 'number' || typeof v.reason !== 'string') return undefined;
      return { t: 'refused', pid: v.pid, reason: v.reason };
    case 'ready':
      return { t: 'ready' };
    case 'released':
      return { t: 'released' };
    default:
      return undefined;
  }
}

export function encodeHandoverMessage(m: HandoverMessage): string {
  return `${JSON.stringify(m)}\n`;
}

/**
 * The old process's answer to a hello: undefined to take the newcomer, else why not (one line).
 * `busy`: another newcomer is mid-hand-over; two cannot both take over.
 */
export function refuseReason(hello: HandoverHello, mine: HandoverSettings, busy: boolean): string | undefined {
  if (hello.protocol !== HANDOVER_PROTOCOL) return `hand-over protocol ${hello.protocol} (version ${hello.version}) is not this process's ${HANDOVER_PROTOCOL}: restart it instead`;
  if (busy) return 'another process is taking over right now; only one can';
  if (hello.portal !== mine.portal) return `--portal ${hello.portal} differs from the running process's --portal ${mine.portal}: the portal cannot change in a hand-over (stop the running proxy, then start)`;
  if (hello.bindAddress !== mine.bindAddress) return `--bind-address ${hello.bindAddress} differs from the running process's ${mine.bindAddress}: proxy ports would move`;
  return undefined;
}

/** A unit of the new process and its listen errors now (UnitStatus's name and errors). */
export interface UnitListening {
  name: string;
  errors: readonly string[];
}

/** What a unit the new process does not run is said to have, when it runs none of the old one's. */
export const NONE_OF_THEM = 'not run here: this process runs none of the running proxy\'s service ports (its source holds none of their Services: a state file not there yet, another cluster or namespace?)';

/**
 * The units the old process serves that the new one does not listen for (a listen error): said
 * ready, the old one would close its listeners and those ports would be closed. Units the new one
 * does not run at all are left out, their Service gone meanwhile — unless it runs none of them:
 * then its source is what is wrong (a state file that is not there yet, a kubeconfig for another
 * cluster), and taking over would close every Service of the node.
 */
export function unservedUnits(served: readonly string[], mine: readonly UnitListening[]): UnitListening[] {
  const wanted = new Set(served);
  const running = mine.filter((u) => wanted.has(u.name));
  if (running.length === 0) return served.map((name) => ({ name, errors: [NONE_OF_THEM] }));
  return running.filter((u) => u.errors.length > 0);
}

/** How many units the one line names. */
const NAMED_UNITS = 3;

/** The new process's one line when it gives up a hand-over for want of listeners. */
export function unservedMessage(oldPid: number, unserved: readonly UnitListening[]): string {
  const [first, ...rest] = unserved;
  if (first === undefined) return '';
  const others = rest.slice(0, NAMED_UNITS - 1).map((u) => u.name);
  const more = rest.length - others.length;
  const also = others.length === 0 ? '' : `; also ${others.join(', ')}${more > 0 ? ` and ${more} more` : ''}`;
  return `hand-over abandoned: ${unserved.length} service port${unserved.length === 1 ? '' : 's'} the running proxy (pid ${oldPid}) serves cannot listen here: ${first.name}: ${first.errors[0] ?? 'not listening'}${also}; it serves on`;
}
