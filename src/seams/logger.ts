/** The logger every part takes through its constructor: pino's, bound to `{component, service}` by children. */
export type { Logger } from 'pino';
