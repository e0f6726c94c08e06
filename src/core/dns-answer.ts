import dnsPacket from 'dns-packet';
import type { Answer, OptAnswer, Packet, Question, SoaAnswer } from 'dns-packet';
import { ipFamily } from './address.js';
import { parseClusterName, serviceNames, type ClusterName } from './cluster-names.js';
import type { DirectoryEntry } from './service-directory.js';

/**
 * The DNS responder's decisions: one query message in, one response message out (or none), for
 * the Services of the directory. Pure: the sockets (io/dns/dns-server.ts) only carry bytes.
 * Wire format by dns-packet; the question is echoed as the query's own bytes, so a name or type
 * the library would spell differently comes back exactly as asked.
 *
 * What it answers:
 * - A/AAAA (and ANY: both) for a Service's names: the addresses a client here connects to.
 * - SRV for `_port._proto.<service name>` (named ports), and for the Service's name: every named
 *   port, the target the Service's fully qualified name, with its addresses as additionals.
 * - NOERROR without answers for names that exist with nothing of the type asked (a namespace, the
 *   apex, a Service asked for MX): NXDOMAIN there would tell a resolver that minimises query names
 *   (RFC 9156) that nothing lies below.
 * - NXDOMAIN, with the zone's SOA in authority (RFC 2308, so it is cached no longer than the
 *   TTL), for other names in the cluster domain and in `svc`; REFUSED outside them: this is no
 *   recursive resolver.
 * - FORMERR for a query it cannot read but whose header it can, NOTIMP for opcodes other than
 *   QUERY, SERVFAIL until the first sync (the directory is not known yet), BADVERS for EDNS
 *   versions other than 0. Nothing for responses, or for fewer than 12 bytes.
 */

export interface NameDirectory {
  readonly domain: string;
  /** Changes when the content does: the SOA serial. */
  readonly version: number;
  get(namespace: string, name: string): DirectoryEntry | undefined;
  hasNamespace(namespace: string): boolean;
}

export interface AnswerOptions {
  directory: NameDirectory;
  /** The TTL of every record, and the SOA's negative-caching time. */
  ttlSeconds: number;
  transport: 'udp' | 'tcp';
  /** False until the first sync: every query then gets SERVFAIL. */
  ready: boolean;
}

const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, NOTIMP: 4, REFUSED: 5 } as const;
const HEADER_BYTES = 12;
const QR = 0x8000;
const AA = 0x0400;
const TC = 0x0200;
const RD = 0x0100;
/** DNS flag day 2020's payload size: fits every path without fragments. */
const EDNS_UDP_SIZE = 1232;
/** RFC 1035's limit for UDP without EDNS. */
const PLAIN_UDP_SIZE = 512;
const TCP_SIZE = 65535;

interface Response {
  rcode: number;
  authoritative: boolean;
  answers?: Answer[];
  authorities?: Answer[];
  additionals?: Answer[];
}

/** The response to one query message, or undefined when none is due. Never throws on input. */
export function answerDnsQuery(query: Buffer, opts: AnswerOptions): Buffer | undefined {
  if (query.length < HEADER_BYTES) return undefined;
  const id = query.readUInt16BE(0);
  const flags = query.readUInt16BE(2);
  // A response sent to us (or reflected back) is never answered: two responders must not loop.
  if ((flags & QR) !== 0) return undefined;
  const opcode = (flags >> 11) & 0xf;
  const recursionDesired = flags & RD;
  let decoded: ReturnType<typeof dnsPacket.decode>;
  let questionBytes: Buffer | undefined;
  try {
    decoded = dnsPacket.decode(query);
    if (decoded.questions?.length === 1) questionBytes = query.subarray(HEADER_BYTES, HEADER_BYTES + questionLength(query));
  } catch {
    return encodeBare(id, opcode, recursionDesired, RCODE.FORMERR);
  }
  const opt = decoded.additionals?.find((a): a is OptAnswer => a.type === 'OPT');
  const limit = opts.transport === 'tcp' ? TCP_SIZE : opt !== undefined ? Math.max(PLAIN_UDP_SIZE, Math.min(opt.udpPayloadSize, EDNS_UDP_SIZE)) : PLAIN_UDP_SIZE;
  const edns = opt !== undefined ? { version: opt.ednsVersion } : undefined;
  const head = { id, opcode, recursionDesired, questionBytes, edns, limit };
  if (opcode !== 0) return encodeResponse(head, { rcode: RCODE.NOTIMP, authoritative: false });
  if (questionBytes === undefined) return encodeResponse(head, { rcode: RCODE.FORMERR, authoritative: false });
  // RFC 6891 6.1.3: an EDNS version we do not speak is BADVERS (extended rcode 16), version 0 ours.
  if (edns !== undefined && edns.version !== 0) return encodeResponse(head, { rcode: RCODE.NOERROR, authoritative: false }, 1);
  const question = decoded.questions![0]!;
  return encodeResponse(head, decide(question, opts));
}

function decide(q: Question, opts: AnswerOptions): Response {
  if (q.class !== 'IN' && q.class !== 'ANY') return { rcode: RCODE.REFUSED, authoritative: false };
  const dir = opts.directory;
  const name = parseClusterName(q.name, dir.domain);
  if (name.kind === 'outside') return { rcode: RCODE.REFUSED, authoritative: false };
  if (!opts.ready) return { rcode: RCODE.SERVFAIL, authoritative: false };
  const zone = name.zone === 'none' ? undefined : name.zone === 'svc' ? 'svc' : dir.domain;
  const soa = (): SoaAnswer[] => (zone === undefined ? [] : [soaRecord(zone, dir, opts.ttlSeconds)]);
  const found = lookup(name, dir);
  if (found === undefined) {
    // The `svc.ns` forms name a Service only when one runs; otherwise they belong to the world.
    if (zone === undefined) return { rcode: RCODE.REFUSED, authoritative: false };
    return { rcode: RCODE.NXDOMAIN, authoritative: true, authorities: soa() };
  }
  const ttl = opts.ttlSeconds;
  const answers: Answer[] = [];
  const additionals: Answer[] = [];
  if (found.kind === 'service') {
    const e = found.entry;
    if (q.type === 'A' || q.type === 'AAAA' || (q.type as string) === 'ANY') answers.push(...addressRecords(q.name, e, q.type, ttl));
    if (q.type === 'SRV') {
      for (const p of e.ports) if (p.name !== '') answers.push(srvRecord(q.name, p.port, fqdn(e, dir.domain), ttl));
      if (answers.length > 0) additionals.push(...addressRecords(fqdn(e, dir.domain), e, 'ANY', ttl));
    }
  } else if (found.kind === 'port' && q.type === 'SRV') {
    const e = found.entry;
    for (const p of e.ports) if (p.name === found.port && p.protocol === found.protocol) answers.push(srvRecord(q.name, p.port, fqdn(e, dir.domain), ttl));
    if (answers.length > 0) additionals.push(...addressRecords(fqdn(e, dir.domain), e, 'ANY', ttl));
  } else if (found.kind === 'apex' && q.type === 'SOA' && zone !== undefined && q.name.toLowerCase().replace(/\.$/, '') === zone) {
    // The zone's own name only: svc.<domain> exists but is no zone apex, and an answer record
    // must be owned by the name asked (RFC 1034 4.3.2): NODATA with the SOA below, there.
    answers.push(soaRecord(zone, dir, ttl));
  }
  if (answers.length === 0) return { rcode: RCODE.NOERROR, authoritative: true, authorities: soa() };
  return { rcode: RCODE.NOERROR, authoritative: true, answers, additionals };
}

type Found = { kind: 'service'; entry: DirectoryEntry } | { kind: 'port'; entry: DirectoryEntry; port: string; protocol: string } | { kind: 'exists' } | { kind: 'apex' };

/** What a name stands for among the running Services, or undefined when it does not exist. */
function lookup(name: ClusterName, dir: NameDirectory): Found | undefined {
  switch (name.kind) {
    case 'service': {
      const entry = dir.get(name.namespace, name.name);
      return entry === undefined ? undefined : { kind: 'service', entry };
    }
    case 'port': {
      const entry = dir.get(name.namespace, name.name);
      if (entry === undefined) return undefined;
      // A port name or protocol the Service lacks: the SRV owner does not exist.
      return entry.ports.some((p) => p.name === name.port && p.protocol === name.protocol) ? { kind: 'port', entry, port: name.port, protocol: name.protocol } : undefined;
    }
    case 'protocol':
      return dir.get(name.namespace, name.name) === undefined ? undefined : { kind: 'exists' };
    case 'namespace':
      return dir.hasNamespace(name.namespace) ? { kind: 'exists' } : undefined;
    case 'node':
      return { kind: 'apex' };
    case 'unknown':
    case 'outside':
      return undefined;
  }
}

function fqdn(e: DirectoryEntry, domain: string): string {
  return serviceNames(e.namespace, e.name, domain)[0];
}

function addressRecords(owner: string, e: DirectoryEntry, type: string, ttl: number): Answer[] {
  const out: Answer[] = [];
  for (const a of e.addresses) {
    const family = ipFamily(a);
    if (family === 4 && (type === 'A' || type === 'ANY')) out.push({ type: 'A', name: owner, ttl, data: a });
    if (family === 6 && (type === 'AAAA' || type === 'ANY')) out.push({ type: 'AAAA', name: owner, ttl, data: a });
  }
  return out;
}

function srvRecord(owner: string, port: number, target: string, ttl: number): Answer {
  // Priority 0, weight 100: one target per port, as cluster DNS (CoreDNS) answers.
  return { type: 'SRV', name: owner, ttl, data: { priority: 0, weight: 100, port, target } };
}

function soaRecord(zone: string, dir: NameDirectory, ttl: number): SoaAnswer {
  // minimum is the negative-caching TTL (RFC 2308): a Service that appears is found within it.
  return { type: 'SOA', name: zone, ttl, data: { mname: `ns.dns.${zone}`, rname: `hostmaster.${zone}`, serial: dir.version >>> 0, refresh: 7200, retry: 1800, expire: 86400, minimum: ttl } };
}

interface Head {
  id: number;
  opcode: number;
  recursionDesired: number;
  questionBytes: Buffer | undefined;
  edns: { version: number } | undefined;
  limit: number;
}

/**
 * Encodes without questions, then puts the query's question bytes back after the header. Past the
 * size limit, the answer goes out empty with TC set: the client asks again over TCP.
 */
function encodeResponse(head: Head, r: Response, extendedRcode = 0): Buffer {
  const flags = (head.opcode << 11) | head.recursionDesired | (r.authoritative ? AA : 0) | r.rcode;
  const additionals = [...(r.additionals ?? [])];
  if (head.edns !== undefined) additionals.push({ type: 'OPT', name: '.', udpPayloadSize: EDNS_UDP_SIZE, extendedRcode, ednsVersion: 0, flags: 0, flag_do: false, options: [] });
  const packet: Packet = { type: 'response', id: head.id, flags, questions: [], answers: r.answers ?? [], authorities: r.authorities ?? [], additionals };
  let out = withQuestion(dnsPacket.encode(packet), head.questionBytes);
  if (out.length > head.limit) {
    const bare: Packet = { type: 'response', id: head.id, flags: flags | TC, questions: [], answers: [], authorities: [], additionals: additionals.filter((a) => a.type === 'OPT') };
    out = withQuestion(dnsPacket.encode(bare), head.questionBytes);
  }
  return out;
}

function encodeBare(id: number, opcode: number, recursionDesired: number, rcode: number): Buffer {
  const out = Buffer.alloc(HEADER_BYTES);
  out.writeUInt16BE(id, 0);
  out.writeUInt16BE(QR | (opcode << 11) | recursionDesired | rcode, 2);
  return out;
}

function withQuestion(encoded: Buffer, question: Buffer | undefined): Buffer {
  if (question === undefined) return encoded;
  const out = Buffer.concat([encoded.subarray(0, HEADER_BYTES), question, encoded.subarray(HEADER_BYTES)]);
  out.writeUInt16BE(1, 4);
  return out;
}

/**
 * The length of the one question at offset 12: its name's labels up to the root or a compression
 * pointer, then type and class. Only called once the decoder has read the message whole.
 */
function questionLength(query: Buffer): number {
  let o = HEADER_BYTES;
  for (;;) {
    const len = query[o] ?? 0;
    if (len === 0) {
      o += 1;
      break;
    }
    if ((len & 0xc0) === 0xc0) {
      o += 2;
      break;
    }
    o += 1 + len;
  }
  return o + 4 - HEADER_BYTES;
}
