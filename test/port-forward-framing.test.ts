import { createHash } from 'node:crypto';
import { createServer, connect, type AddressInfo, type Socket } from 'node:net';
import { constants as zlibConstants, inflateSync } from 'node:zlib';
import { afterEach, describe, expect, it } from 'vitest';
import {
  FLAG_FIN,
  FrameReader,
  FrameType,
  dataFrameHeader,
  goAwayFrame,
  pingFrame,
  readGoAway,
  readPing,
  readRstStream,
  readSynStream,
  rstStreamFrame,
  synStreamFrame,
} from '../src/io/port-forward/spdy-frames.js';
import { HeaderBlockWriter, SPDY_DICTIONARY, adler32, decodeHeaderPairs } from '../src/io/port-forward/spdy-headers.js';
import { WebSocketPipe, websocketAccept } from '../src/io/port-forward/websocket-pipe.js';
import { withDeadline } from './helpers/proxy-fixtures.js';

/** The codecs under the port-forward dialer, byte by byte. kubectl checks them whole (port-forward-kubectl.test.ts). */

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

type Seen = Array<{ kind: 'data'; id: number; fin: boolean; data: string } | { kind: 'control'; type: number; flags: number; payload: Buffer }>;

function reader(): { r: FrameReader; seen: Seen } {
  const seen: Seen = [];
  // A DATA payload may come in pieces (as its bytes arrive): joined here into one entry per frame.
  let open: { kind: 'data'; id: number; fin: boolean; data: string } | undefined;
  const r = new FrameReader({
    data: (id, fin, data) => {
      if (open === undefined || open.id !== id) {
        open = { kind: 'data', id, fin, data: '' };
        seen.push(open);
      }
      open.data += data.toString();
      open.fin = fin;
      if (fin || data.length === 0) open = undefined;
    },
    control: (type, flags, payload) => seen.push({ kind: 'control', type, flags, payload: Buffer.from(payload) }),
  });
  return { r, seen };
}

describe('SPDY/3.1 frames', () => {
  const stream = Buffer.concat([
    synStreamFrame(1, Buffer.from('hdr')),
    dataFrameHeader(1, 5, false),
    Buffer.from('hello'),
    dataFrameHeader(3, 0, true),
    pingFrame(7),
    rstStreamFrame(5, 5),
    goAwayFrame(9, 2),
  ]);

  const expected = (seen: Seen): void => {
    expect(seen).toHaveLength(6);
    const [syn, data, fin, ping, rst, goaway] = seen as [Seen[0], Seen[0], Seen[0], Seen[0], Seen[0], Seen[0]];
    expect(syn).toMatchObject({ kind: 'control', type: FrameType.SYN_STREAM, flags: 0 });
    const parsed = readSynStream((syn as { payload: Buffer }).payload);
    expect({ ...parsed, headerBlock: parsed.headerBlock.toString() }).toEqual({ streamId: 1, associatedTo: 0, priority: 0, headerBlock: 'hdr' });
    expect(data).toEqual({ kind: 'data', id: 1, fin: false, data: 'hello' });
    expect(fin).toEqual({ kind: 'data', id: 3, fin: true, data: '' });
    expect(readPing((ping as { payload: Buffer }).payload)).toBe(7);
    expect(readRstStream((rst as { payload: Buffer }).payload)).toEqual({ streamId: 5, status: 5 });
    expect(readGoAway((goaway as { payload: Buffer }).payload)).toEqual({ lastGoodStreamId: 9, status: 2 });
  };

  it('reads frames written in one piece', () => {
    const { r, seen } = reader();
    r.push(stream);
    expected(seen);
  });

  it('reads frames split at every byte', () => {
    const { r, seen } = reader();
    for (let i = 0; i < stream.length; i++) r.push(stream.subarray(i, i + 1));
    expected(seen);
    expect(r.pending).toBe(0);
  });

  it("hands a large DATA frame's payload on as it arrives, as views of the reads, FIN on the last piece", () => {
    const pieces: Array<{ id: number; fin: boolean; data: Buffer }> = [];
    const r = new FrameReader({ data: (id, fin, data) => pieces.push({ id, fin, data }), control: () => {} });
    const payload = Buffer.alloc(3 * 1024 * 1024, 0x41);
    const frame = Buffer.concat([dataFrameHeader(11, payload.length, true), payload, pingFrame(3)]);
    const reads: Buffer[] = [];
    for (let i = 0; i < frame.length; i += 65536) reads.push(frame.subarray(i, i + 65536));
    for (const read of reads) r.push(read);
    expect(pieces.length).toBe(reads.length);
    expect(pieces.every((p) => p.id === 11)).toBe(true);
    expect(pieces.map((p) => p.fin)).toEqual([...pieces.slice(1).map(() => false), true]);
    expect(pieces.reduce((n, p) => n + p.data.length, 0)).toBe(payload.length);
    // Not copied: each piece shares the read's memory.
    expect(pieces[1]?.data.buffer).toBe(reads[1]?.buffer);
    expect(r.pending).toBe(0);
  });

  it('writes the control frame header as version 3 with the FIN flag where asked', () => {
    const frame = synStreamFrame(3, Buffer.alloc(0), FLAG_FIN);
    expect(frame.readUInt32BE(0)).toBe(0x80030001);
    expect(frame[4]).toBe(FLAG_FIN);
    expect(frame.readUIntBE(5, 3)).toBe(10);
  });

  it('refuses a frame of another SPDY version', () => {
    const { r } = reader();
    const frame = pingFrame(1);
    frame.writeUInt16BE(0x8002, 0);
    expect(() => r.push(frame)).toThrow(/SPDY version 2/);
  });
});

describe('SPDY/3 header blocks', () => {
  it('uses the SPDY/3 dictionary, byte for byte', () => {
    expect(SPDY_DICTIONARY.length).toBe(1423);
    expect(createHash('sha256').update(SPDY_DICTIONARY).digest('hex')).toBe('51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02');
  });

  it('writes blocks that continue one zlib stream, each flushed, that zlib inflates with the dictionary', () => {
    const w = new HeaderBlockWriter();
    const a = w.encode([['streamType', 'error'], ['port', '8080'], ['requestID', '0']]);
    const b = w.encode([['streamtype', 'data'], ['port', '8080'], ['requestid', '0']]);
    // The stream opens with CMF/FLG naming the dictionary by its Adler-32.
    expect(a[0]).toBe(0x78);
    expect((a[1] as number) & 0x20).toBe(0x20);
    expect(((a[0] as number) * 256 + (a[1] as number)) % 31).toBe(0);
    expect(a.readUInt32BE(2)).toBe(adler32(SPDY_DICTIONARY));
    // Each block ends as Z_SYNC_FLUSH ends output, so an inflater hands out all of it in its frame.
    expect(a.subarray(-5)).toEqual(Buffer.from([0, 0, 0, 0xff, 0xff]));
    const first = inflateSync(a, { dictionary: SPDY_DICTIONARY, finishFlush: zlibConstants.Z_SYNC_FLUSH });
    expect(decodeHeaderPairs(first)).toEqual([['streamtype', 'error'], ['port', '8080'], ['requestid', '0']]);
    const both = inflateSync(Buffer.concat([a, b]), { dictionary: SPDY_DICTIONARY, finishFlush: zlibConstants.Z_SYNC_FLUSH });
    expect(decodeHeaderPairs(both.subarray(first.length))).toEqual([['streamtype', 'data'], ['port', '8080'], ['requestid', '0']]);
  });
});

describe('WebSocket framing', () => {
  async function socketPair(): Promise<{ client: Socket; server: Socket }> {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const accepted = new Promise<Socket>((resolve) => server.once('connection', resolve));
    const client = connect({ host: '127.0.0.1', port: (server.address() as AddressInfo).port });
    const serverSide = await accepted;
    cleanups.push(() => {
      client.destroy();
      serverSide.destroy();
      server.close();
    });
    return { client, server: serverSide };
  }

  it("computes RFC 6455's Sec-WebSocket-Accept", () => {
    expect(websocketAccept('dGhlIHNhbXBsZSBub25jZQ==')).toBe('s3pPLMBiTxaQ9kYGzzhZRbK+xOo=');
  });

  it("unmasks RFC 6455's masked example (as a binary message)", async () => {
    const { client, server } = await socketPair();
    const pipe = new WebSocketPipe({ socket: server, role: 'server' });
    const got = new Promise<Buffer>((resolve) => pipe.once('data', resolve));
    client.write(Buffer.from([0x82, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58]));
    expect((await withDeadline(got, 2000, 'the message')).toString()).toBe('Hello');
  });

  it('masks what a client sends with a fresh key, and a server reads it back whole', async () => {
    const { client, server } = await socketPair();
    const raw: Buffer[] = [];
    server.on('data', (d: Buffer) => raw.push(d));
    const sender = new WebSocketPipe({ socket: client, role: 'client' });
    const sizes = [1, 125, 126, 65535, 65536, 200_001];
    const payloads = sizes.map((n) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 7 + n) & 0xff)));
    const total = payloads.reduce((n, p) => n + p.length, 0);
    for (const p of payloads) sender.write(p);
    sender.end(); // a close frame, then the FIN
    await withDeadline(new Promise((resolve) => server.once('end', resolve)), 5000, 'the frames');
    const wire = Buffer.concat(raw);
    // Every frame is masked, and the masked bytes are not the payload.
    expect((wire[1] as number) & 0x80).toBe(0x80);
    expect(wire.includes(payloads[5]?.subarray(0, 64) as Buffer)).toBe(false);
    // Read back through a server-role pipe.
    const { client: c2, server: s2 } = await socketPair();
    const receiver = new WebSocketPipe({ socket: s2, role: 'server' });
    const chunks: Buffer[] = [];
    receiver.on('data', (d: Buffer) => chunks.push(d));
    c2.write(wire);
    await withDeadline((async () => {
      while (chunks.reduce((n, b) => n + b.length, 0) < total) await new Promise((r) => setTimeout(r, 5));
    })(), 5000, 'the payloads');
    expect(Buffer.concat(chunks).equals(Buffer.concat(payloads))).toBe(true);
  });

  it('answers a ping with a pong carrying its payload', async () => {
    const { client, server } = await socketPair();
    new WebSocketPipe({ socket: server, role: 'server' }).resume();
    const pong = new Promise<Buffer>((resolve) => client.once('data', resolve));
    client.write(Buffer.from([0x89, 0x84, 1, 2, 3, 4, 0x71 ^ 1, 0x72 ^ 2, 0x73 ^ 3, 0x74 ^ 4]));
    expect(await withDeadline(pong, 2000, 'the pong')).toEqual(Buffer.from([0x8a, 0x04, 0x71, 0x72, 0x73, 0x74]));
  });

  it('fails on a text message, as client-go does', async () => {
    const { client, server } = await socketPair();
    const pipe = new WebSocketPipe({ socket: server, role: 'server' });
    const failed = new Promise<Error>((resolve) => pipe.once('error', resolve));
    client.write(Buffer.from([0x81, 0x02, 0x68, 0x69]));
    expect((await withDeadline(failed, 2000, 'the error')).message).toMatch(/text message/);
  });
});
