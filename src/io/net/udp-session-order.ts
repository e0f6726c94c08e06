import type { UdpSession } from './udp-session.js';

/**
 * A proxy's UDP sessions from least to most recently active: an intrusive doubly linked list
 * through the sessions' own `older` and `newer` fields.
 *
 * Reclaiming at --max-udp-sessions takes the head and the idle sweep stops at the first session
 * that is not idle, so neither visits the sessions that stay. The price is touch() on every
 * datagram, either way: nothing when the session is already the most recent (one busy client),
 * otherwise a few pointer writes, with no hashing and no allocation. A Map refreshed by
 * delete + set costs a hash of the key twice per datagram and leaves deleted entries for V8 to
 * compact; refreshing lazily (moving a session only when it reaches the head) is cheaper still
 * but only approximately ordered, so it can reclaim a session that was active after another.
 */
export class SessionOrder {
  private head: UdpSession | undefined;
  private tail: UdpSession | undefined;

  /** The least recently active session. */
  oldest(): UdpSession | undefined {
    return this.head;
  }

  /** Adds a session as the most recently active. Precondition: it is in no list. */
  append(s: UdpSession): void {
    s.older = this.tail;
    s.newer = undefined;
    if (this.tail === undefined) this.head = s;
    else this.tail.newer = s;
    this.tail = s;
  }

  /** Marks a session as the most recently active. Precondition: it is in this list. */
  touch(s: UdpSession): void {
    if (s === this.tail) return;
    this.remove(s);
    this.append(s);
  }

  /** Precondition: the session is in this list (each session is removed once, when it ends). */
  remove(s: UdpSession): void {
    if (s.older === undefined) this.head = s.newer;
    else s.older.newer = s.newer;
    if (s.newer === undefined) this.tail = s.older;
    else s.newer.older = s.older;
    s.older = s.newer = undefined;
  }
}
