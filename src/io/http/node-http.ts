/**
 * node:http as its CommonJS exports object. An ES `import` of node:http makes Node build the
 * module's namespace, which reads every export, and three of them (`WebSocket`, `CloseEvent`,
 * `MessageEvent`) are getters that load undici, Node's fetch and WebSocket: some 40 ms of CPU at
 * a start from a state file, for code the proxy never runs (with an API server source,
 * @kubernetes/client-node imports node:http itself, and undici comes with it all the same).
 * process.getBuiltinModule returns the exports object, whose getters stay unread. Import
 * node:http's types as types only; its values from here.
 */
export const http = process.getBuiltinModule('node:http');
