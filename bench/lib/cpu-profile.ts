/**
 * V8 .cpuprofile files (node --cpu-prof) -> a flame graph (SVG) and a text summary of where the
 * time goes: by category, and the top functions by self and by inclusive time. Pure.
 */

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}

interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  hitCount?: number;
  children?: number[];
}

export interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples?: number[];
}

type Category = 'idle' | 'gc' | 'program' | 'proxy' | 'node' | 'deps' | 'native';

function category(f: CallFrame): Category {
  if (f.functionName === '(idle)') return 'idle';
  if (f.functionName === '(garbage collector)') return 'gc';
  if (f.functionName === '(program)' || f.functionName === '(root)') return 'program';
  // The bundle (dist/bundle) holds the proxy and the dependencies it bundles (rolldown.config.js).
  if (f.url.includes('/dist/src/') || f.url.includes('/dist/bundle/')) return 'proxy';
  if (f.url.includes('/node_modules/')) return 'deps';
  if (f.url.startsWith('node:') || (f.url === '' && f.functionName !== '')) return f.url === '' ? 'native' : 'node';
  return 'native';
}

const CATEGORY_LABEL: Readonly<Record<Category, string>> = {
  idle: 'idle (waiting in epoll)',
  gc: 'garbage collector',
  program: '(program): V8/libuv native work outside JS frames',
  proxy: "the proxy's own JS (dist/src; from dist/bundle, with the dependencies bundled in it)",
  node: "Node's JS internals (streams, net, dgram, timers)",
  deps: 'dependencies (node_modules)',
  native: 'native functions called from JS (syscalls: write, send, connect...)',
};

const COLOURS: Readonly<Record<Category, string>> = {
  idle: '#dddddd',
  gc: '#b0b0b0',
  program: '#c9b8a6',
  proxy: '#f2994a',
  node: '#6fa8dc',
  deps: '#b48ecf',
  native: '#e06666',
};

function frameKey(f: CallFrame): string {
  const file = f.url.replace(/^.*\//, '');
  return `${f.functionName || '(anonymous)'}${file ? ` ${file}:${f.lineNumber + 1}` : ''}`;
}

interface Tree {
  byId: Map<number, ProfileNode>;
  total: Map<number, number>;
  root: ProfileNode;
  samples: number;
}

function buildTree(p: CpuProfile): Tree {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const total = new Map<number, number>();
  const sum = (n: ProfileNode): number => {
    let t = n.hitCount ?? 0;
    for (const c of n.children ?? []) {
      const child = byId.get(c);
      if (child) t += sum(child);
    }
    total.set(n.id, t);
    return t;
  };
  const root = p.nodes[0];
  if (!root) throw new Error('empty profile');
  const samples = sum(root);
  return { byId, total, root, samples };
}

export function summarizeProfile(p: CpuProfile, top = 25): string {
  const t = buildTree(p);
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  const byCategory = new Map<Category, number>();
  const walk = (n: ProfileNode, onStack: Set<string>): void => {
    const key = frameKey(n.callFrame);
    const hits = n.hitCount ?? 0;
    self.set(key, (self.get(key) ?? 0) + hits);
    byCategory.set(category(n.callFrame), (byCategory.get(category(n.callFrame)) ?? 0) + hits);
    // Inclusive time counts a function once per sample even when it recurses.
    if (!onStack.has(key)) inclusive.set(key, (inclusive.get(key) ?? 0) + (t.total.get(n.id) ?? 0));
    const next = new Set(onStack).add(key);
    for (const c of n.children ?? []) {
      const child = t.byId.get(c);
      if (child) walk(child, next);
    }
  };
  walk(t.root, new Set());
  const pct = (v: number): string => `${((100 * v) / Math.max(1, t.samples)).toFixed(1).padStart(5)}%`;
  const busy = t.samples - (byCategory.get('idle') ?? 0);
  const lines = [`samples: ${t.samples} over ${((p.endTime - p.startTime) / 1e6).toFixed(1)} s; busy ${pct(busy)}`, '', 'by category:'];
  for (const [c, v] of [...byCategory].sort((a, b) => b[1] - a[1])) lines.push(`  ${pct(v)}  ${CATEGORY_LABEL[c]}`);
  lines.push('', 'top self time:');
  for (const [k, v] of [...self].sort((a, b) => b[1] - a[1]).slice(0, top)) lines.push(`  ${pct(v)}  ${k}`);
  lines.push('', 'top inclusive time:');
  for (const [k, v] of [...inclusive].filter(([k]) => k !== '(root)').sort((a, b) => b[1] - a[1]).slice(0, top)) lines.push(`  ${pct(v)}  ${k}`);
  return `${lines.join('\n')}\n`;
}

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/** A flame graph: the root at the bottom, callees above, width = inclusive samples. */
export function flameGraph(p: CpuProfile, title: string): string {
  const t = buildTree(p);
  const width = 1200;
  const rowH = 16;
  const rects: string[] = [];
  let maxDepth = 0;
  const place = (n: ProfileNode, x0: number, depth: number): void => {
    const w = ((t.total.get(n.id) ?? 0) / Math.max(1, t.samples)) * width;
    if (w < 0.3) return;
    maxDepth = Math.max(maxDepth, depth);
    rects.push(`${depth}|${x0}|${w}|${n.id}`);
    let x = x0;
    for (const c of n.children ?? []) {
      const child = t.byId.get(c);
      if (!child) continue;
      place(child, x, depth + 1);
      x += ((t.total.get(child.id) ?? 0) / Math.max(1, t.samples)) * width;
    }
  };
  place(t.root, 0, 0);
  const height = (maxDepth + 1) * rowH + 40;
  const body = rects.map((r) => {
    const [d, x0, w, id] = r.split('|').map(Number) as [number, number, number, number];
    const n = t.byId.get(id) as ProfileNode;
    const y = height - 10 - (d + 1) * rowH;
    const key = frameKey(n.callFrame);
    const share = (((t.total.get(id) ?? 0) / Math.max(1, t.samples)) * 100).toFixed(1);
    const label = w > 40 ? `<text x="${(x0 + 3).toFixed(1)}" y="${y + 12}">${esc(key.slice(0, Math.floor(w / 7)))}</text>` : '';
    return `<g><title>${esc(key)} (${share}%)</title><rect x="${x0.toFixed(1)}" y="${y}" width="${w.toFixed(1)}" height="${rowH - 1}" fill="${COLOURS[category(n.callFrame)]}"/>${label}</g>`;
  });
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="monospace" font-size="11">
<rect width="100%" height="100%" fill="#fff"/>
<text x="4" y="18" font-size="14" font-family="sans-serif">${esc(title)} (hover for names; orange: the proxy's code, blue: Node internals, red: native/syscalls, grey: GC/idle)</text>
${body.join('\n')}
</svg>
`;
}
