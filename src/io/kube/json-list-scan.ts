/**
 * Byte-level scanning of a JSON `List` document (`kubectl get -o json`): where its `items` array
 * lies and where each item starts and ends, and byte runs two versions share. This is what lets
 * the file source re-parse only the items an edit touched instead of the whole file, whose
 * JSON.parse alone outlasts the time an endpoint move may take at 10,000 Services (bench/README.md).
 *
 * The scanner only finds structure; JSON.parse still judges every byte it hands on. Working on
 * bytes is safe for UTF-8: the structural characters are ASCII, and no byte of a multi-byte
 * sequence is below 0x80. Offsets are byte offsets into the Buffer read from disk.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const LBRACE = 0x7b;
const RBRACE = 0x7d;
const LBRACKET = 0x5b;
const RBRACKET = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;
const ITEMS_KEY = Buffer.from('"items"');

export interface Span {
  start: number;
  /** Exclusive. */
  end: number;
}

export interface ListLayout {
  /** Offset of the `[` that opens `items`. */
  open: number;
  /** Offset of the `]` that closes it. */
  close: number;
  items: Span[];
}

function isSpace(b: number | undefined): boolean {
  return b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
}

/** Offset of the closing quote of the string whose opening quote is at `i`, or -1. */
function stringEnd(buf: Buffer, i: number): number {
  let j = i + 1;
  for (;;) {
    const q = buf.indexOf(QUOTE, j);
    if (q < 0) return -1;
    let backslashes = 0;
    for (let k = q - 1; k > i && buf[k] === BACKSLASH; k--) backslashes++;
    if (backslashes % 2 === 0) return q;
    j = q + 1;
  }
}

/**
 * End (exclusive) of the object or array opening at `i`, or -1 when it is not closed before
 * `limit`. Brackets are only counted, not matched: a `{ ]` is JSON.parse's to refuse. One plain
 * loop over the bytes: calling out per string (indexOf) costs three times as much on Kubernetes
 * objects, whose strings are short.
 */
function compositeEnd(buf: Buffer, i: number, limit: number): number {
  let depth = 0;
  let inString = false;
  for (let j = i; j < limit; j++) {
    const b = buf[j];
    if (inString) {
      if (b === BACKSLASH) j++;
      else if (b === QUOTE) inString = false;
    } else if (b === QUOTE) {
      inString = true;
    } else if (b === LBRACE || b === LBRACKET) {
      depth++;
    } else if (b === RBRACE || b === RBRACKET) {
      if (--depth === 0) return j + 1;
    }
  }
  return -1;
}

/** End (exclusive) of any JSON value starting at `i` (scalars end at `,`, `}`, `]` or space). */
function valueEnd(buf: Buffer, i: number, limit: number): number {
  const b = buf[i];
  if (b === LBRACE || b === LBRACKET) return compositeEnd(buf, i, limit);
  if (b === QUOTE) {
    const q = stringEnd(buf, i);
    return q < 0 ? -1 : q + 1;
  }
  let j = i;
  while (j < limit && buf[j] !== COMMA && buf[j] !== RBRACE && buf[j] !== RBRACKET && !isSpace(buf[j])) j++;
  return j > i ? j : -1;
}

export function skipSpace(buf: Buffer, i: number, limit: number): number {
  while (i < limit && isSpace(buf[i])) i++;
  return i;
}

/** End (exclusive) of the object opening at `i` (which must be a `{`), or -1. */
export function objectEnd(buf: Buffer, i: number, limit: number): number {
  return buf[i] === LBRACE ? compositeEnd(buf, i, limit) : -1;
}

/**
 * The layout of a document whose root is an object with one `items` array of objects. Undefined
 * for anything else (no `items`, two of them, a non-object item, text after the root), which
 * simply means the file is always parsed whole. A leading byte-order mark is skipped.
 */
export function scanList(buf: Buffer): ListLayout | undefined {
  const steps = scanListSteps(buf);
  for (;;) {
    const r = steps.next();
    if (r.done) return r.value;
  }
}

/**
 * scanList a step at a time, yielding the offset reached after each item: a 40 MB file takes a
 * few hundred milliseconds to scan, which the file source spreads over many turns of the event
 * loop rather than holding connections up for all of it.
 */
export function* scanListSteps(buf: Buffer): Generator<number, ListLayout | undefined, void> {
  const n = buf.length;
  let i = skipSpace(buf, afterByteOrderMark(buf), n);
  if (buf[i] !== LBRACE) return undefined;
  let layout: ListLayout | undefined;
  i = skipSpace(buf, i + 1, n);
  if (buf[i] === RBRACE) return undefined;
  for (;;) {
    if (buf[i] !== QUOTE) return undefined;
    const keyEnd = stringEnd(buf, i);
    if (keyEnd < 0) return undefined;
    // An escaped key may spell `items` (`"\u0069tems"`), and JSON.parse keeps the last of two:
    // the bytes would then name the wrong array.
    if (buf.subarray(i + 1, keyEnd).includes(BACKSLASH)) return undefined;
    const isItems = keyEnd + 1 - i === ITEMS_KEY.length && buf.compare(ITEMS_KEY, 0, ITEMS_KEY.length, i, keyEnd + 1) === 0;
    i = skipSpace(buf, keyEnd + 1, n);
    if (buf[i] !== COLON) return undefined;
    i = skipSpace(buf, i + 1, n);
    let end: number;
    if (isItems) {
      if (layout !== undefined || buf[i] !== LBRACKET) return undefined;
      // The items one by one up to the closing bracket, which is the first non-space byte that
      // does not start an item or follow one with a comma.
      const items: Span[] = [];
      const open = i;
      let j = skipSpace(buf, i + 1, n);
      while (buf[j] !== RBRACKET) {
        const itemEnd = objectEnd(buf, j, n);
        if (itemEnd < 0) return undefined;
        items.push({ start: j, end: itemEnd });
        yield itemEnd;
        j = skipSpace(buf, itemEnd, n);
        if (buf[j] === COMMA) {
          j = skipSpace(buf, j + 1, n);
          if (buf[j] !== LBRACE) return undefined; // a trailing comma, or not an object
        } else if (buf[j] !== RBRACKET) {
          return undefined;
        }
      }
      layout = { open, close: j, items };
      end = j + 1;
    } else {
      end = valueEnd(buf, i, n);
      if (end < 0) return undefined;
    }
    i = skipSpace(buf, end, n);
    if (buf[i] === RBRACE) break;
    if (buf[i] !== COMMA) return undefined;
    i = skipSpace(buf, i + 1, n);
  }
  return skipSpace(buf, i + 1, n) === n ? layout : undefined;
}

function afterByteOrderMark(buf: Buffer): number {
  return buf[0] === 0xef && buf[1] === 0xbb && buf[2] === 0xbf ? 3 : 0;
}

/** The first byte after space (and a byte-order mark) opens a JSON object or array. */
export function startsLikeJson(buf: Buffer): boolean {
  const first = buf[skipSpace(buf, afterByteOrderMark(buf), buf.length)];
  return first === LBRACE || first === LBRACKET;
}

/**
 * The last byte other than space closes an object or array: a JSON document still being
 * written almost never does, so a read that catches one half-written can wait for the rest
 * without paying for a parse that must fail.
 */
export function endsLikeJson(buf: Buffer): boolean {
  const last = byteBefore(buf, buf.length);
  return last === RBRACE || last === RBRACKET;
}

/** Nothing but white space (and a byte-order mark). */
export function isBlank(buf: Buffer): boolean {
  return skipSpace(buf, afterByteOrderMark(buf), buf.length) === buf.length;
}

/** The last non-space byte before `i`, or undefined. */
export function byteBefore(buf: Buffer, i: number): number | undefined {
  let j = i - 1;
  while (j >= 0 && isSpace(buf[j])) j--;
  return j >= 0 ? buf[j] : undefined;
}

/** The first non-space byte at or after `i`, or undefined. */
export function byteFrom(buf: Buffer, i: number): number | undefined {
  const j = skipSpace(buf, i, buf.length);
  return j < buf.length ? buf[j] : undefined;
}

export const BYTE = { LBRACKET, RBRACKET, COMMA } as const;

const CHUNK = 64 * 1024;

/** Length of the longest common prefix of a and b: memcmp a chunk at a time, bytes only in the chunk that differs. */
export function commonPrefix(a: Buffer, b: Buffer): number {
  return sameRun(a, 0, b, 0, Math.min(a.length, b.length));
}

/**
 * How many bytes from a[aFrom] on equal those from b[bFrom] on, at most `max` (which must fit in
 * both). A memcmp a chunk at a time, starting small: most runs asked about end within an item.
 */
export function sameRun(a: Buffer, aFrom: number, b: Buffer, bFrom: number, max: number): number {
  let n = 0;
  let chunk = 1024;
  while (n < max) {
    const len = Math.min(chunk, max - n);
    if (b.compare(a, aFrom + n, aFrom + n + len, bFrom + n, bFrom + n + len) !== 0) break;
    n += len;
    chunk = Math.min(chunk * 4, CHUNK);
  }
  while (n < max && a[aFrom + n] === b[bFrom + n]) n++;
  return n;
}

/** Length of the longest common suffix of a and b, at most `max` bytes. */
export function commonSuffix(a: Buffer, b: Buffer, max: number): number {
  const n = Math.min(a.length, b.length, max);
  let s = 0;
  while (s < n) {
    const len = Math.min(CHUNK, n - s);
    if (a.compare(b, b.length - s - len, b.length - s, a.length - s - len, a.length - s) !== 0) break;
    s += len;
  }
  while (s < n && a[a.length - 1 - s] === b[b.length - 1 - s]) s++;
  return s;
}
