/**
 * A typed publish/subscribe point (STYLE habit 16: the loop publishes one typed event, health,
 * metrics and the rest subscribe; no public mutable hooks). Subscribing or unsubscribing while an
 * event is being published takes effect from the next event. A listener that throws is reported
 * to `onError` and the others still run: one subscriber's bug must not stop the loop.
 */
export class Topic<T> {
  private listeners: ReadonlyArray<(value: T) => void> = [];

  constructor(private readonly onError: (err: unknown) => void) {}

  /** Returns the function that unsubscribes. */
  subscribe(listener: (value: T) => void): () => void {
    this.listeners = [...this.listeners, listener];
    return () => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    };
  }

  publish(value: T): void {
    for (const listener of this.listeners) {
      try {
        listener(value);
      } catch (err) {
        this.onError(err);
      }
    }
  }

  get size(): number {
    return this.listeners.length;
  }
}
