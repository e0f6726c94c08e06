/**
 * SPDY/3 header blocks: the name/value pairs of SYN_STREAM, SYN_REPLY and HEADERS, compressed with
 * zlib against the SPDY dictionary, in one zlib stream per direction of a connection (each block
 * continues the stream the block before it left off).
 *
 * Written blocks are zlib *stored* blocks, each block ended by an empty one as Z_SYNC_FLUSH ends
 * its output: a valid continuation of the stream that any inflater (Go's compress/zlib in the
 * kubelet, Node's zlib) reads, built synchronously without a deflate context. Port-forward's blocks are three short pairs per stream, so compressing them would save a
 * few dozen bytes per connection at the price of an asynchronous zlib round per stream.
 */

/** The dictionary of SPDY/3 (spec section 2.6.10.1): header names, each length-prefixed, then a tail. */
const DICTIONARY_NAMES = [
  'options', 'head', 'post', 'put', 'delete', 'trace', 'accept', 'accept-charset', 'accept-encoding',
  'accept-language', 'accept-ranges', 'age', 'allow', 'authorization', 'cache-control', 'connection',
  'content-base', 'content-encoding', 'content-language', 'content-length', 'content-location',
  'content-md5', 'content-range', 'content-type', 'date', 'etag', 'expect', 'expires', 'from', 'host',
  'if-match', 'if-modified-since', 'if-none-match', 'if-range', 'if-unmodified-since', 'last-modified',
  'location', 'max-forwards', 'pragma', 'proxy-authenticate', 'proxy-authorization', 'range', 'referer',
  'retry-after', 'server', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'user-agent', 'vary', 'via',
  'warning', 'www-authenticate', 'method', 'get', 'status', '200 OK', 'version', 'HTTP/1.1', 'url',
  'public', 'set-cookie', 'keep-alive', 'origin',
];
const DICTIONARY_TAIL =
  '100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505' +
  '203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized' +
  '403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable' +
  'Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT' +
  'chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,' +
  'text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.';

export const SPDY_DICTIONARY: Buffer = Buffer.concat([
  ...DICTIONARY_NAMES.map((name) => lengthPrefixed(Buffer.from(name, 'latin1'))),
  Buffer.from(DICTIONARY_TAIL, 'latin1'),
]);

export type HeaderPairs = ReadonlyArray<readonly [string, string]>;

/** The uncompressed block: a count, then each name and value length-prefixed (32-bit). Names lower-case. */
export function encodeHeaderPairs(headers: HeaderPairs): Buffer {
  const parts: Buffer[] = [u32(headers.length)];
  for (const [name, value] of headers) {
    parts.push(lengthPrefixed(Buffer.from(name.toLowerCase(), 'utf8')), lengthPrefixed(Buffer.from(value, 'utf8')));
  }
  return Buffer.concat(parts);
}

/** Parses an uncompressed block; throws on one that is cut short. Repeated values (NUL-separated) stay joined. */
export function decodeHeaderPairs(raw: Buffer): Array<[string, string]> {
  const count = readU32(raw, 0);
  const pairs: Array<[string, string]> = [];
  let offset = 4;
  for (let i = 0; i < count; i++) {
    const nameLength = readU32(raw, offset);
    const name = slice(raw, offset + 4, nameLength).toString('utf8');
    offset += 4 + nameLength;
    const valueLength = readU32(raw, offset);
    const value = slice(raw, offset + 4, valueLength).toString('utf8');
    offset += 4 + valueLength;
    pairs.push([name, value]);
  }
  return pairs;
}

/**
 * One direction's header compressor: the first block opens the zlib stream (a header naming the
 * dictionary by its Adler-32), every block is stored blocks of the raw pairs, none final.
 */
export class HeaderBlockWriter {
  private started = false;

  encode(headers: HeaderPairs): Buffer {
    const raw = encodeHeaderPairs(headers);
    const parts: Buffer[] = [];
    if (!this.started) {
      this.started = true;
      parts.push(zlibHeaderWithDictionary());
    }
    // The raw block is never empty (it starts with the pair count).
    for (let offset = 0; offset < raw.length; offset += 0xffff) {
      const piece = raw.subarray(offset, offset + 0xffff);
      const head = Buffer.alloc(5);
      // BFINAL 0, BTYPE 00 (stored), padded to the byte; then LEN and its one's complement, little-endian.
      head.writeUInt16LE(piece.length, 1);
      head.writeUInt16LE(~piece.length & 0xffff, 3);
      parts.push(head, piece);
    }
    // Then an empty stored block, as Z_SYNC_FLUSH ends its output: Go's inflater hands a block's
    // bytes out only when it meets the next block, and without this one it would read past the
    // frame for it and fail the connection ("compressed payload size was incorrect").
    parts.push(SYNC_FLUSH);
    return Buffer.concat(parts);
  }
}

const SYNC_FLUSH = Buffer.from([0x00, 0x00, 0x00, 0xff, 0xff]);

/** CMF 0x78 (deflate, 32 KiB window), FLG with FDICT set and its check bits, then the dictionary's Adler-32. */
function zlibHeaderWithDictionary(): Buffer {
  const cmf = 0x78;
  const flgNoCheck = 0x80 | 0x20; // FLEVEL 2 (default), FDICT
  const flg = flgNoCheck + (31 - ((cmf * 256 + flgNoCheck) % 31)) % 31;
  const header = Buffer.alloc(6);
  header[0] = cmf;
  header[1] = flg;
  header.writeUInt32BE(adler32(SPDY_DICTIONARY), 2);
  return header;
}

export function adler32(data: Uint8Array): number {
  let a = 1;
  let b = 0;
  for (const byte of data) {
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  }
  return (b * 65536 + a) >>> 0;
}

function lengthPrefixed(bytes: Buffer): Buffer {
  return Buffer.concat([u32(bytes.length), bytes]);
}

function u32(n: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32BE(n, 0);
  return b;
}

function readU32(raw: Buffer, offset: number): number {
  if (offset + 4 > raw.length) throw new RangeError('header block cut short');
  return raw.readUInt32BE(offset);
}

function slice(raw: Buffer, offset: number, length: number): Buffer {
  if (offset + length > raw.length) throw new RangeError('header block cut short');
  return raw.subarray(offset, offset + length);
}
