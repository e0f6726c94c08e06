/**
 * node:http as its CommonJS exports object. An ES `import` of node:http makes Node build the
 * module's namespace, which reads every export, and three of them (`WebSocket`, `CloseEvent`,
 * `MessageEvent`) are getters that load undici, Node's fetch and WebSocket: some 40 ms of CPU at
 * every start, for code the proxy never runs. process.getBuiltinModule returns the exports
 * object, whose getters stay unread. Import node:http's types as types only; its values from here.
 */
export const http = process.getBuiltinModule('node:http');
