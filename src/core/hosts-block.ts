import { UsageError } from './errors.js';

/**
 * The marked block this proxy keeps in a hosts-format file (`--hosts-file`): its lines between
 * two marker lines, put in, replaced or taken out while every byte outside it stays as it was.
 * Pure text in, text out; io/names/hosts-file.ts reads and writes the file.
 *
 * Appended to a file, the block follows its last line. When that line has no line break, the
 * block brings one before it and ends without one, so that taking it out gives back the file byte
 * for byte: the rule for removal is "the block and the line break after it, or, when it ends the
 * file without one, the line break before it". Line breaks follow the file's own (CRLF or LF).
 */

export const HOSTS_BEGIN = '# BEGIN kube-userspace-proxy';
export const HOSTS_END = '# END kube-userspace-proxy';

interface Span {
  /** Offset of the BEGIN line's first character. */
  start: number;
  /** Offset just past the END marker (before its line break, if any). */
  end: number;
}

/**
 * Puts `lines` into `text` as the block (replacing one there), or takes the block out when `lines`
 * is undefined. `file` only names the file in errors: a BEGIN without its END, an END alone, or
 * two blocks are the user's to mend, and nothing is written then.
 */
export function spliceHostsBlock(text: string, lines: readonly string[] | undefined, file: string): string {
  const eol = text.includes('\r\n') ? '\r\n' : '\n';
  const span = findBlock(text, file);
  if (lines === undefined) {
    if (span === undefined) return text;
    const after = lineBreakAt(text, span.end);
    if (after > 0) return text.slice(0, span.start) + text.slice(span.end + after);
    // The block ends the file without a line break: the one before it was the block's.
    const before = text.slice(0, span.start);
    return before.slice(0, before.length - lineBreakBefore(before));
  }
  const block = [HOSTS_BEGIN, ...lines, HOSTS_END].join(eol);
  if (span !== undefined) return text.slice(0, span.start) + block + text.slice(span.end);
  if (text === '' || text.endsWith('\n')) return text + block + eol;
  return text + eol + block;
}

/** The block's lines between the markers, or undefined when the file has no block. */
export function hostsBlockLines(text: string, file: string): string[] | undefined {
  const span = findBlock(text, file);
  if (span === undefined) return undefined;
  const inner = text.slice(span.start, span.end).split(/\r?\n/);
  return inner.slice(1, -1);
}

/** The length of the line break starting at `at` (CRLF 2, LF 1), 0 when none. */
function lineBreakAt(text: string, at: number): number {
  if (text.startsWith('\r\n', at)) return 2;
  return text[at] === '\n' ? 1 : 0;
}

function lineBreakBefore(text: string): number {
  if (text.endsWith('\r\n')) return 2;
  return text.endsWith('\n') ? 1 : 0;
}

function findBlock(text: string, file: string): Span | undefined {
  let begin: number | undefined;
  let end: number | undefined;
  let offset = 0;
  let lineNo = 0;
  for (const raw of text.split('\n')) {
    lineNo++;
    const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
    const marker = line.trimEnd();
    if (marker === HOSTS_BEGIN) {
      if (begin !== undefined) throw new UsageError(`${file}:${lineNo}: a second "${HOSTS_BEGIN}" line; mend the file by hand (keep one block, or none)`);
      begin = offset;
    } else if (marker === HOSTS_END) {
      if (begin === undefined || end !== undefined) throw new UsageError(`${file}:${lineNo}: "${HOSTS_END}" without its "${HOSTS_BEGIN}" line; mend the file by hand`);
      end = offset + line.length;
    }
    offset += raw.length + 1;
  }
  if (begin !== undefined && end === undefined) throw new UsageError(`${file}: "${HOSTS_BEGIN}" without its "${HOSTS_END}" line; mend the file by hand`);
  return begin === undefined ? undefined : { start: begin, end: end! };
}
