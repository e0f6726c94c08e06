import type { V1EndpointSlice, V1Service } from '@kubernetes/client-node';
import type { ObjectProblem } from './model.js';
import { ipFamily, isIP, parseCidr } from './address.js';

/**
 * Checks what the proxy relies on, no more: objects come from an API server (already validated
 * there, but perhaps by a newer or older version) or from a hand-written file (validated by
 * nobody). Values are read as `unknown` because a YAML file can put a string where the type
 * says number. Unknown extra fields are fine: real objects carry many.
 */

export const SERVICE_NAME_LABEL = 'kubernetes.io/service-name';

const PROTOCOLS = ['TCP', 'UDP', 'SCTP'];
const SERVICE_TYPES = ['ClusterIP', 'NodePort', 'LoadBalancer', 'ExternalName'];
const AFFINITIES = ['None', 'ClientIP'];
const TRAFFIC_POLICIES = ['Cluster', 'Local'];
const ADDRESS_TYPES = ['IPv4', 'IPv6', 'FQDN'];
const CONDITIONS = ['ready', 'serving', 'terminating'];
const TARGET_REF_FIELDS = ['kind', 'namespace', 'name'];
const MAX_AFFINITY_TIMEOUT_SECONDS = 86400;
/**
 * Deepest nesting of objects and arrays accepted in an object. Real Services and EndpointSlices
 * nest about ten levels (managedFields); the bound keeps every later walk of a stored object
 * (comparison, serialization) far from the stack limit, which a 100,000-level annotation hit.
 */
export const MAX_DEPTH = 100;
/** At most this many problems are listed per object; the rest are counted in the last one. */
const MAX_PROBLEMS = 10;
/** Longest quote of a value (or of a name in an object label) a problem makes. */
const MAX_QUOTE = 200;

// DNS-1123 subdomain: what object names must be; it also keeps `/` and `:` out of our keys.
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

/**
 * Collects problems for one object; `at` names the field, `fail` records one. Past MAX_PROBLEMS
 * they are only counted: an object with 100,000 bad entries makes a few log lines, not 100,000.
 */
class Report {
  private readonly listed: ObjectProblem[] = [];
  private firstUnlisted: ObjectProblem | undefined;
  private unlisted = 0;
  private label: string | undefined;
  // The label is made at the first problem: every object of every read passes here, nearly all
  // without one (20,000 labels, a few milliseconds of a 10,000-Service start).
  constructor(
    private readonly kind: string,
    private readonly obj: unknown,
  ) {}
  fail(field: string, message: string): void {
    const p = { object: (this.label ??= objectLabel(this.kind, this.obj)), field, message };
    if (this.listed.length < MAX_PROBLEMS) this.listed.push(p);
    else if (this.unlisted++ === 0) this.firstUnlisted = p;
  }
  get problems(): ObjectProblem[] {
    const p = this.firstUnlisted;
    if (p === undefined) return this.listed;
    const more = this.unlisted > 1 ? ` (and ${this.unlisted - 1} more problems in this object)` : '';
    return [...this.listed, { ...p, message: `${p.message}${more}` }];
  }
}

/** `Service ns/name`, as problems and logs name an object; tolerant of any shape, and bounded in length. */
export function objectLabel(kind: string, obj: unknown): string {
  const meta = isRecord(obj) && isRecord(obj.metadata) ? obj.metadata : {};
  const ns = typeof meta.namespace === 'string' && meta.namespace !== '' ? meta.namespace : 'default';
  const name = typeof meta.name === 'string' && meta.name !== '' ? meta.name : '<unnamed>';
  return `${clip(kind)} ${clip(ns)}/${clip(name)}`;
}

export function validateService(svc: V1Service): ObjectProblem[] {
  const r = new Report('Service', svc);
  if (!isRecord(svc)) {
    r.fail('', 'not an object');
    return r.problems;
  }
  if (!checkDepth(r, svc)) return r.problems;
  checkMetadata(r, svc.metadata);
  const spec: unknown = svc.spec;
  if (spec !== undefined && !isRecord(spec)) r.fail('spec', 'must be an object');
  if (isRecord(spec)) checkServiceSpec(r, spec);
  const status: unknown = svc.status;
  const lb = isRecord(status) ? status.loadBalancer : undefined;
  checkLoadBalancerStatus(r, isRecord(lb) ? lb.ingress : undefined);
  return r.problems;
}

export function validateEndpointSlice(slice: V1EndpointSlice): ObjectProblem[] {
  const r = new Report('EndpointSlice', slice);
  if (!isRecord(slice)) {
    r.fail('', 'not an object');
    return r.problems;
  }
  if (!checkDepth(r, slice)) return r.problems;
  checkMetadata(r, slice.metadata);
  const label: unknown = slice.metadata?.labels?.[SERVICE_NAME_LABEL];
  if (typeof label !== 'string' || label === '') {
    r.fail(`metadata.labels["${SERVICE_NAME_LABEL}"]`, 'missing: the proxy finds a slice\'s Service by this label');
  }
  const addressType: unknown = slice.addressType;
  if (!ADDRESS_TYPES.includes(addressType as string)) {
    r.fail('addressType', `must be one of ${ADDRESS_TYPES.join(', ')}, got ${show(addressType)}`);
  }
  checkSliceEndpoints(r, slice.endpoints, addressType);
  checkSlicePorts(r, slice.ports);
  return r.problems;
}

function checkMetadata(r: Report, meta: unknown): void {
  if (!isRecord(meta)) {
    r.fail('metadata', 'missing');
    return;
  }
  const { name, namespace } = meta;
  if (typeof name !== 'string' || name === '') r.fail('metadata.name', 'missing');
  else if (name.length > 253 || !DNS_SUBDOMAIN.test(name)) r.fail('metadata.name', `${show(name)} is not a valid object name`);
  if (namespace !== undefined && namespace !== '' && (typeof namespace !== 'string' || !DNS_LABEL.test(namespace))) {
    r.fail('metadata.namespace', `${show(namespace)} is not a valid namespace`);
  }
}

function checkServiceSpec(r: Report, spec: Record<string, unknown>): void {
  checkOneOf(r, 'spec.type', spec.type, SERVICE_TYPES);
  checkClusterIPs(r, spec);
  checkList(r, 'spec.externalIPs', spec.externalIPs, notAnIP);
  checkList(r, 'spec.loadBalancerSourceRanges', spec.loadBalancerSourceRanges, notACidr);
  checkServicePorts(r, spec.ports);
  checkOneOf(r, 'spec.sessionAffinity', spec.sessionAffinity, AFFINITIES);
  checkAffinityTimeout(r, spec.sessionAffinityConfig);
  checkOneOf(r, 'spec.internalTrafficPolicy', spec.internalTrafficPolicy, TRAFFIC_POLICIES);
  checkOneOf(r, 'spec.externalTrafficPolicy', spec.externalTrafficPolicy, TRAFFIC_POLICIES);
  if (spec.healthCheckNodePort !== undefined && spec.healthCheckNodePort !== 0) {
    checkPort(r, 'spec.healthCheckNodePort', spec.healthCheckNodePort);
  }
  if (spec.trafficDistribution !== undefined && typeof spec.trafficDistribution !== 'string') {
    r.fail('spec.trafficDistribution', 'must be a string');
  }
}

/** `clusterIP` and `clusterIPs` may each be absent, empty or `None`; otherwise IPs, one per family. */
function checkClusterIPs(r: Report, spec: Record<string, unknown>): void {
  const { clusterIP, clusterIPs } = spec;
  if (clusterIP !== undefined && clusterIP !== '' && clusterIP !== 'None' && !isIPText(clusterIP)) {
    r.fail('spec.clusterIP', `${show(clusterIP)} is not an IP address`);
  }
  if (clusterIPs === undefined || clusterIPs === null) return;
  if (!Array.isArray(clusterIPs)) {
    r.fail('spec.clusterIPs', 'must be a list');
    return;
  }
  if (clusterIPs.length > 2) r.fail('spec.clusterIPs', 'at most two addresses, one per IP family');
  const headless = clusterIPs[0] === 'None';
  if (headless && clusterIPs.length > 1) r.fail('spec.clusterIPs', '"None" must be the only entry');
  if (!headless) {
    checkEntries(r, 'spec.clusterIPs', clusterIPs, notAnIP);
    if (clusterIPs.length === 2 && ipFamilyOf(clusterIPs[0]) === ipFamilyOf(clusterIPs[1])) {
      r.fail('spec.clusterIPs[1]', 'dual-stack clusterIPs must be of different IP families');
    }
  }
  if (typeof clusterIP === 'string' && clusterIP !== '' && clusterIPs.length > 0 && clusterIPs[0] !== clusterIP) {
    r.fail('spec.clusterIPs[0]', `must equal spec.clusterIP (${show(clusterIP)}), got ${show(clusterIPs[0])}`);
  }
}

function checkServicePorts(r: Report, ports: unknown): void {
  if (ports === undefined || ports === null) return;
  if (!Array.isArray(ports)) {
    r.fail('spec.ports', 'must be a list');
    return;
  }
  // Port names key everything (`ns/name:port`): with several ports, each needs its own. Two ports
  // on one port number and protocol (or node port and protocol) would need one socket twice: the
  // API server refuses both, so does the proxy, naming the second.
  const seen = new Set<string>();
  // Most Services have one port: no tables of numbers for them (validation runs on every object).
  const portsSeen = ports.length > 1 ? new Set<string>() : undefined;
  const nodePortsSeen = ports.length > 1 ? new Set<string>() : undefined;
  ports.forEach((p: unknown, i) => {
    const at = `spec.ports[${i}]`;
    if (!isRecord(p)) {
      r.fail(at, 'must be an object');
      return;
    }
    const name = p.name ?? '';
    if (typeof name !== 'string') r.fail(`${at}.name`, 'must be a string');
    else if (name === '' && ports.length > 1) r.fail(`${at}.name`, 'required when the Service has more than one port');
    else if (seen.has(name)) r.fail(`${at}.name`, `duplicate port name ${show(name)}`);
    else seen.add(name);
    checkPort(r, `${at}.port`, p.port);
    if (p.nodePort !== undefined && p.nodePort !== 0) checkPort(r, `${at}.nodePort`, p.nodePort);
    checkTargetPort(r, `${at}.targetPort`, p.targetPort);
    checkOneOf(r, `${at}.protocol`, p.protocol, PROTOCOLS);
    if (portsSeen === undefined || nodePortsSeen === undefined) return;
    const protocol = typeof p.protocol === 'string' && p.protocol !== '' ? p.protocol : 'TCP';
    checkUnique(r, portsSeen, `${at}.port`, p.port, protocol);
    if (p.nodePort !== 0) checkUnique(r, nodePortsSeen, `${at}.nodePort`, p.nodePort, protocol);
  });
}

/** A port number (a valid one: checkPort speaks of the rest) seen before with this protocol. */
function checkUnique(r: Report, seen: Set<string>, at: string, port: unknown, protocol: string): void {
  if (!Number.isInteger(port) || (port as number) < 1 || (port as number) > 65535) return;
  const key = `${String(port)}/${protocol}`;
  if (seen.has(key)) r.fail(at, `duplicate: ${key} is already an earlier port's`);
  else seen.add(key);
}

/** A number is a port; a string names a container port and must not be empty. */
function checkTargetPort(r: Report, at: string, v: unknown): void {
  if (v === undefined || v === null) return;
  if (typeof v === 'string') {
    if (v === '') r.fail(at, 'must not be empty');
    return;
  }
  checkPort(r, at, v);
}

function checkAffinityTimeout(r: Report, config: unknown): void {
  if (config === undefined || config === null) return;
  const at = 'spec.sessionAffinityConfig.clientIP.timeoutSeconds';
  const t = isRecord(config) && isRecord(config.clientIP) ? config.clientIP.timeoutSeconds : undefined;
  if (t === undefined || t === null) return;
  if (!Number.isInteger(t) || (t as number) < 1 || (t as number) > MAX_AFFINITY_TIMEOUT_SECONDS) {
    r.fail(at, `must be an integer from 1 to ${MAX_AFFINITY_TIMEOUT_SECONDS}, got ${show(t)}`);
  }
}

function checkLoadBalancerStatus(r: Report, ingress: unknown): void {
  if (ingress === undefined || ingress === null) return;
  if (!Array.isArray(ingress)) {
    r.fail('status.loadBalancer.ingress', 'must be a list');
    return;
  }
  checkEntries(r, 'status.loadBalancer.ingress', ingress, (ing) => {
    if (!isRecord(ing)) return { value: ing, is: 'is not an object', are: 'are not objects' };
    const ip = ing.ip;
    if (ip !== undefined && ip !== '' && !isIPText(ip)) return { sub: '.ip', value: ip, is: 'is not an IP address', are: 'have an ip that is not an IP address' };
    return undefined;
  });
}

function checkSliceEndpoints(r: Report, endpoints: unknown, addressType: unknown): void {
  // An empty slice is sent as `endpoints: null`.
  if (endpoints === undefined || endpoints === null) return;
  if (!Array.isArray(endpoints)) {
    r.fail('endpoints', 'must be a list');
    return;
  }
  const family = addressType === 'IPv4' ? 4 : addressType === 'IPv6' ? 6 : undefined;
  // Field paths are spelled out only for a problem: every endpoint of every slice passes here.
  endpoints.forEach((ep: unknown, i) => {
    if (!isRecord(ep)) {
      r.fail(`endpoints[${i}]`, 'must be an object');
      return;
    }
    checkEndpointAddresses(r, i, ep.addresses, family);
    checkConditions(r, i, ep.conditions);
    if (ep.nodeName !== undefined && typeof ep.nodeName !== 'string') r.fail(`endpoints[${i}].nodeName`, 'must be a string');
    if (ep.zone !== undefined && typeof ep.zone !== 'string') r.fail(`endpoints[${i}].zone`, 'must be a string');
    checkHints(r, i, ep.hints);
    checkTargetRef(r, i, ep.targetRef);
  });
}

/** The port-forward dialer reaches an endpoint's pod by these names. */
function checkTargetRef(r: Report, i: number, ref: unknown): void {
  if (ref === undefined || ref === null) return;
  const at = `endpoints[${i}].targetRef`;
  if (!isRecord(ref)) {
    r.fail(at, 'must be an object');
    return;
  }
  for (const field of TARGET_REF_FIELDS) {
    const v = ref[field];
    if (v !== undefined && v !== null && typeof v !== 'string') r.fail(`${at}.${field}`, `must be a string, got ${show(v)}`);
  }
}

/** FQDN slices are ignored by the proxy, so their addresses are not checked as IPs. */
function checkEndpointAddresses(r: Report, i: number, addresses: unknown, family: 4 | 6 | undefined): void {
  if (!Array.isArray(addresses) || addresses.length === 0) {
    r.fail(`endpoints[${i}].addresses`, 'must list at least one address');
    return;
  }
  if (family === undefined) return;
  // The common case, one address of the slice's family, is answered without a closure or a path.
  if (addresses.length === 1 && typeof addresses[0] === 'string' && ipFamily(addresses[0]) === family) return;
  checkEntries(r, `endpoints[${i}].addresses`, addresses, (a) => {
    const got = typeof a === 'string' ? ipFamily(a) : undefined;
    if (got === undefined) return notAnIP(a);
    if (got !== family) return { value: a, is: `is not an IPv${family} address (addressType IPv${family})`, are: `are not IPv${family} addresses (addressType IPv${family})` };
    return undefined;
  });
}

function checkConditions(r: Report, i: number, conditions: unknown): void {
  if (conditions === undefined || conditions === null) return;
  if (!isRecord(conditions)) {
    r.fail(`endpoints[${i}].conditions`, 'must be an object');
    return;
  }
  for (const c of CONDITIONS) {
    const v = conditions[c];
    if (v !== undefined && v !== null && typeof v !== 'boolean') r.fail(`endpoints[${i}].conditions.${c}`, `must be true or false, got ${show(v)}`);
  }
}

function checkHints(r: Report, i: number, hints: unknown): void {
  if (hints === undefined || hints === null) return;
  const at = `endpoints[${i}].hints`;
  if (!isRecord(hints)) {
    r.fail(at, 'must be an object');
    return;
  }
  for (const list of ['forZones', 'forNodes']) {
    const v = hints[list];
    if (v === undefined || v === null) continue;
    if (!Array.isArray(v) || !v.every((h: unknown) => isRecord(h) && typeof h.name === 'string')) {
      r.fail(`${at}.${list}`, 'must be a list of {name}');
    }
  }
}

function checkSlicePorts(r: Report, ports: unknown): void {
  if (ports === undefined || ports === null) return;
  if (!Array.isArray(ports)) {
    r.fail('ports', 'must be a list');
    return;
  }
  ports.forEach((p: unknown, i) => {
    const at = `ports[${i}]`;
    if (!isRecord(p)) {
      r.fail(at, 'must be an object');
      return;
    }
    if (p.name !== undefined && p.name !== null && typeof p.name !== 'string') r.fail(`${at}.name`, 'must be a string');
    // A port left unset means "all ports"; the proxy skips it, as kube-proxy does.
    if (p.port !== undefined && p.port !== null) checkPort(r, `${at}.port`, p.port);
    checkOneOf(r, `${at}.protocol`, p.protocol, PROTOCOLS);
  });
}

function checkPort(r: Report, at: string, v: unknown): void {
  if (v === undefined || v === null) r.fail(at, 'missing');
  else if (!Number.isInteger(v) || (v as number) < 1 || (v as number) > 65535) {
    r.fail(at, `must be an integer from 1 to 65535, got ${show(v)}`);
  }
}

/** Absent (or null) is fine: the API server's default applies. */
function checkOneOf(r: Report, at: string, v: unknown, allowed: readonly string[]): void {
  if (v === undefined || v === null) return;
  if (typeof v !== 'string' || !allowed.includes(v)) {
    r.fail(at, `must be one of ${allowed.join(', ')}, got ${show(v)}`);
  }
}

/** An optional list whose every entry `check` accepts. */
function checkList(r: Report, at: string, v: unknown, check: (v: unknown) => EntryFault | undefined): void {
  if (v === undefined || v === null) return;
  if (!Array.isArray(v)) {
    r.fail(at, 'must be a list');
    return;
  }
  checkEntries(r, at, v, check);
}

/** What is wrong with one entry of a list: `${value} ${is}` alone, `N entries ${are}` in a count. */
interface EntryFault {
  /** The path of the faulty field below the entry, e.g. `.ip`; default the entry itself. */
  sub?: string;
  value: unknown;
  is: string;
  are: string;
}

function notACidr(v: unknown): EntryFault | undefined {
  return typeof v === 'string' && parseCidr(v) !== undefined ? undefined : { value: v, is: 'is not a CIDR (e.g. 203.0.113.0/24)', are: 'are not CIDRs' };
}

function notAnIP(v: unknown): EntryFault | undefined {
  return isIPText(v) ? undefined : { value: v, is: 'is not an IP address', are: 'are not IP addresses' };
}

/**
 * Checks every entry of a list. A fault found once is reported at its entry, as any other
 * problem; a fault found in several entries is reported once for the list, with a count and the
 * first example (`spec.externalIPs: 100000 entries are not IP addresses, e.g. [0] "x"`).
 */
function checkEntries(r: Report, at: string, list: readonly unknown[], check: (v: unknown) => EntryFault | undefined): void {
  // Nearly every list is valid: no table until the first fault.
  let i = 0;
  let fault: EntryFault | undefined;
  while (i < list.length && (fault = check(list[i])) === undefined) i++;
  if (fault === undefined) return;
  const found = new Map<string, { first: EntryFault; index: number; count: number }>([[fault.are, { first: fault, index: i, count: 1 }]]);
  for (i++; i < list.length; i++) {
    const f = check(list[i]);
    if (f === undefined) continue;
    const seen = found.get(f.are);
    if (seen) seen.count++;
    else found.set(f.are, { first: f, index: i, count: 1 });
  }
  for (const { first, index, count } of found.values()) {
    const sub = first.sub ?? '';
    if (count === 1) r.fail(`${at}[${index}]${sub}`, `${show(first.value)} ${first.is}`);
    else r.fail(at, `${count} entries ${first.are}, e.g. [${index}]${sub} ${show(first.value)}`);
  }
}

/** False, with a problem naming the path, when objects or arrays nest deeper than MAX_DEPTH. */
function checkDepth(r: Report, obj: object): boolean {
  const path = tooDeep(obj, 0);
  if (path === undefined) return true;
  path.reverse();
  // The first steps name the field; the rest would only repeat the nesting.
  const shown = path.slice(0, 6).join('').replace(/^\./, '');
  r.fail(path.length > 6 ? `${shown}…` : shown, `nested more than ${MAX_DEPTH} levels deep`);
  return false;
}

/**
 * The path (innermost step first) to a value nested deeper than MAX_DEPTH, or undefined.
 * Recursion that stops descending at the bound, so it cannot meet the stack's end however deep
 * the object; plain loops that allocate nothing while all is well, since every object of every
 * read passes through here.
 */
function tooDeep(v: object, depth: number): string[] | undefined {
  if (depth > MAX_DEPTH) return [];
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const child: unknown = v[i];
      if (typeof child !== 'object' || child === null) continue;
      const path = tooDeep(child, depth + 1);
      if (path === undefined) continue;
      path.push(`[${i}]`);
      return path;
    }
    return undefined;
  }
  for (const k in v) {
    const child: unknown = (v as Record<string, unknown>)[k];
    if (typeof child !== 'object' || child === null || !Object.hasOwn(v, k)) continue;
    const path = tooDeep(child, depth + 1);
    if (path === undefined) continue;
    path.push(fieldKey(k));
    return path;
  }
  return undefined;
}

/** `.name`, or `["a/b"]` for a key that is not a plain word (as field paths name labels). */
function fieldKey(k: string): string {
  return /^[A-Za-z_$][\w$-]*$/.test(k) && k.length <= 64 ? `.${k}` : `[${show(k)}]`;
}

function isIPText(v: unknown): boolean {
  return typeof v === 'string' && isIP(v);
}

function ipFamilyOf(v: unknown): 4 | 6 | undefined {
  return typeof v === 'string' ? ipFamily(v) : undefined;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * A value as JSON, cut after MAX_QUOTE characters. Written here rather than by JSON.stringify,
 * which would first build the whole text: 69 MB for a 486-byte YAML alias bomb, and a stack
 * overflow for deep nesting. The recursion is bounded by the budget (each level costs a character).
 */
export function show(v: unknown, max = MAX_QUOTE): string {
  if (v === undefined) return 'nothing';
  let out = '';
  const write = (x: unknown): void => {
    if (out.length > max) return;
    if (typeof x === 'string') out += JSON.stringify(x.length > max ? x.slice(0, max + 1) : x);
    else if (typeof x === 'number' || typeof x === 'boolean' || x === null) out += JSON.stringify(x);
    else if (Array.isArray(x)) {
      out += '[';
      for (let i = 0; i < x.length && out.length <= max; i++) {
        if (i > 0) out += ',';
        write(x[i] === undefined ? null : x[i]);
      }
      out += ']';
    } else if (typeof x === 'object') {
      out += '{';
      let first = true;
      for (const k in x) {
        if (out.length > max) break;
        if (!Object.hasOwn(x, k)) continue;
        const e = (x as Record<string, unknown>)[k];
        if (e === undefined || typeof e === 'function') continue;
        out += `${first ? '' : ','}${JSON.stringify(k.length > max ? k.slice(0, max + 1) : k)}:`;
        first = false;
        write(e);
      }
      out += '}';
    } else out += typeof x; // undefined, a function, a symbol, a bigint: say what it is
  };
  write(v);
  return out.length > max ? `${out.slice(0, max)}…` : out;
}

/** A name cut to MAX_QUOTE characters. */
function clip(s: string): string {
  return s.length > MAX_QUOTE ? `${s.slice(0, MAX_QUOTE)}…` : s;
}
