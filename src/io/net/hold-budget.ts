/**
 * The bound on TCP connections held for want of endpoints (hold-when-empty): each holds a
 * descriptor and a client, so a Service scaled to zero under a flood of connections must not take
 * every descriptor of the node. Past either bound, a connection is reset at once, as without a
 * hold. One per process, shared by every service port's socket.
 */
export class HoldBudget {
  /** Connections held now, over every service port. */
  held = 0;

  constructor(
    readonly maxPerServicePort: number = DEFAULT_HOLD_MAX_PER_SERVICE_PORT,
    readonly maxPerNode: number = DEFAULT_HOLD_MAX_PER_NODE,
  ) {}
}

export const DEFAULT_HOLD_MAX_PER_SERVICE_PORT = 100;
export const DEFAULT_HOLD_MAX_PER_NODE = 1000;
