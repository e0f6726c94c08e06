import type { Socket } from 'node:net';
import { tcpBackend, type TcpBackend } from './proxy-fixtures.js';

/**
 * A PROXY protocol v2 header read back, independently of the encoder under test: the fields as
 * doc/proxy-protocol.txt section 2.2 lays them out, addresses as text (IPv4 dotted, IPv6 as eight
 * full groups).
 */
export interface ReadHeader {
  command: number;
  family: number;
  source: string;
  sourcePort: number;
  destination: string;
  destinationPort: number;
  /** The bytes after the header. */
  rest: Buffer;
}

const SIGNATURE = Buffer.from('0d0a0d0a000d0a515549540a', 'hex');

/** Undefined when `bytes` does not begin with a v2 signature. */
export function readHeader(bytes: Buffer): ReadHeader | undefined {
  if (bytes.length < 16 || !bytes.subarray(0, 12).equals(SIGNATURE)) return undefined;
  const len = bytes.readUInt16BE(14);
  const family = bytes[13] as number;
  const width = family >> 4 === 1 ? 4 : 16;
  const at = 16;
  const addr = (b: Buffer): string => (width === 4 ? [...b].join('.') : (b.toString('hex').match(/.{4}/g) ?? []).join(':'));
  return {
    command: bytes[12] as number,
    family,
    source: addr(bytes.subarray(at, at + width)),
    destination: addr(bytes.subarray(at + width, at + 2 * width)),
    sourcePort: bytes.readUInt16BE(at + 2 * width),
    destinationPort: bytes.readUInt16BE(at + 2 * width + 2),
    rest: bytes.subarray(16 + len),
  };
}

/** `::1` as readHeader spells IPv6 addresses. */
export const LOOPBACK6_FULL = '0000:0000:0000:0000:0000:0000:0000:0001';

export interface RecordingBackend extends TcpBackend {
  /** What each connection sent, whole, in the order they ended. */
  readonly received: Buffer[];
  /** Resolves with the next connection's bytes once its sender ended. */
  next(): Promise<Buffer>;
}

/**
 * A backend that keeps every byte a connection sends until its FIN (or, given `marker`, until the
 * bytes end with it, for a path that does not pass the FIN on, as port-forward's does not), then
 * answers `done` and ends: the byte-level view of what the proxy wrote to an endpoint.
 */
export async function recordingBackend(host = '127.0.0.1', marker?: string): Promise<RecordingBackend> {
  const received: Buffer[] = [];
  let waiters: ((b: Buffer) => void)[] = [];
  const onConn = (s: Socket): void => {
    const chunks: Buffer[] = [];
    let done = false;
    const finish = (): void => {
      if (done) return;
      done = true;
      const all = Buffer.concat(chunks);
      received.push(all);
      const w = waiters;
      waiters = [];
      for (const resolve of w) resolve(all);
      s.end('done');
    };
    let seen = '';
    s.on('data', (d: Buffer) => {
      chunks.push(d);
      if (marker === undefined) return;
      seen = (seen + d.toString('latin1')).slice(-marker.length);
      if (seen === marker) finish();
    });
    s.on('end', finish);
  };
  const backend = await tcpBackend(host, onConn);
  return Object.assign(backend, {
    received,
    next: () => new Promise<Buffer>((resolve) => waiters.push(resolve)),
  });
}
