import type { StateSink } from './state-sink.js';

/**
 * Where Services and EndpointSlices come from: a state file (FileSource) or a cluster
 * (ApiSource). Both write into the same sink, so one translation path serves both.
 */
export interface Source {
  /**
   * Resolves once the first complete state has reached the sink (for the API: the first full
   * lists of both Services and EndpointSlices). Nothing should be programmed before.
   */
  readonly synced: Promise<void>;
  /** Starts feeding `sink`. Whether it waits for the first state is the source's business: await `synced` for that. */
  start(sink: StateSink): Promise<void>;
  stop(): Promise<void>;
}
