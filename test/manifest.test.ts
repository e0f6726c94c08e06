import { readFileSync } from 'node:fs';
import { describe, it, expect } from 'vitest';
import { dump } from 'js-yaml';
import { stdSerializers } from 'pino';
import { holdsOf, parseDocuments, parseManifest, manifestOf } from '../src/io/kube/manifest.js';
import { ProxyError } from '../src/core/errors.js';
import { list } from './helpers/objects.js';

const text = (name: string): string => readFileSync(new URL(`./fixtures/kube/${name}`, import.meta.url), 'utf8');
const json = <T>(name: string): T => JSON.parse(text(name)) as T;

/** What kubectl prints for `get svc,endpointslices -A -o yaml`: a v1 List whose items carry kind and apiVersion. */
function kubectlListYaml(): string {
  const services = json<{ items: object[] }>('services-list.json').items.map((s) => ({ apiVersion: 'v1', kind: 'Service', ...s }));
  const slices = json<{ items: object[] }>('endpointslices-v1-list.json').items.map((s) => ({ apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', ...s }));
  return dump({ apiVersion: 'v1', kind: 'List', items: [...services, ...slices], metadata: { resourceVersion: '' } });
}

const MULTI_DOC = `# two Services and a slice, as one would write them by hand
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
    targetPort: 8080
---
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
  annotations:
    endpoints.kubernetes.io/last-change-trigger-time: 2026-11-22T10:00:00Z
addressType: IPv4
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true}
ports:
- name: http
  port: 8080
  protocol: TCP
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: prod}
spec: {clusterIP: 10.96.0.11, ports: [{port: 443}]}
`;

describe('parseManifest', () => {
  it('reads a ServiceList and an EndpointSliceList as the API serves them (items without kind)', () => {
    const svcs = parseManifest(text('services-list.json'), 'svcs.json');
    expect(svcs.services.map((s) => s.metadata?.name)).toEqual(['ext', 'headless', 'kubernetes', 'web']);
    expect(svcs.problems).toEqual([]);
    const slices = parseManifest(text('endpointslices-v1-list.json'), 'slices.json');
    expect(slices.endpointSlices.map((s) => s.metadata?.name)).toEqual(['web-abcde']);
    expect(slices.endpointSlices[0]).toEqual(json<{ items: unknown[] }>('endpointslices-v1-list.json').items[0]);
  });

  it('reads JSON behind # comment lines (as the captured API samples start) through the YAML parser', () => {
    const raw = `# GET /api/v1/services\n# HTTP 200 {"content-type":"application/json"}\n${text('services-list.json')}`;
    expect(parseManifest(raw, 'sample.json').services).toHaveLength(4);
  });

  it('reads a single object carrying kind and apiVersion', () => {
    const m = parseManifest(text('service-late.json'), 'late.json');
    expect(m.services.map((s) => s.metadata?.name)).toEqual(['late']);
  });

  it('reads multi-document YAML, skipping empty documents, keeping timestamps as strings', () => {
    const m = parseManifest(MULTI_DOC, 'state.yaml');
    expect(m.problems).toEqual([]);
    expect(m.services.map((s) => `${s.metadata?.namespace ?? '-'}/${s.metadata?.name}`)).toEqual(['-/web', 'prod/api']);
    expect(m.endpointSlices).toHaveLength(1);
    const slice = m.endpointSlices[0];
    expect(slice?.endpoints[0]?.addresses).toEqual(['10.244.1.5']);
    expect(slice?.ports?.[0]?.port).toBe(8080);
    expect(slice?.metadata?.annotations?.['endpoints.kubernetes.io/last-change-trigger-time']).toBe('2026-11-22T10:00:00Z');
  });

  it('reads a v1 List in YAML, as kubectl get -o yaml prints it', () => {
    const m = parseManifest(kubectlListYaml(), 'dump.yaml');
    expect(m.problems).toEqual([]);
    expect(m.services).toHaveLength(4);
    expect(m.endpointSlices).toHaveLength(1);
    // Same objects as JSON gives, apart from the kind/apiVersion kubectl adds.
    const { kind: _k, apiVersion: _a, ...web } = m.services[3] as unknown as Record<string, unknown>;
    expect(web).toEqual(json<{ items: unknown[] }>('services-list.json').items[3]);
  });

  it('reads a v1 List in JSON', () => {
    const late = json<object>('service-late.json');
    const m = parseManifest(list([late]), 'dump.json');
    expect(m.services.map((s) => s.metadata?.name)).toEqual(['late']);
  });

  it('reads JSON indented with tabs, and an empty file as no objects', () => {
    const m = parseManifest('{\n\t"apiVersion": "v1",\n\t"kind": "Service",\n\t"metadata": {"name": "x"}\n}\n', 'tabs.json');
    expect(m.services).toHaveLength(1);
    expect(parseManifest('', 'empty.yaml')).toEqual({ services: [], endpointSlices: [], problems: [] });
    expect(parseManifest('# only a comment\n', 'c.yaml').services).toEqual([]);
    expect(parseManifest(`\uFEFF${text('service-late.json')}`, 'bom.json').services).toHaveLength(1);
  });

  it('reports other kinds and API versions by object and field, and takes the rest', () => {
    const yaml = `apiVersion: v1
kind: ConfigMap
metadata: {name: cfg, namespace: kube-system}
---
apiVersion: v1
kind: Service
metadata: {name: ok}
spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
---
apiVersion: v2
kind: Service
metadata: {name: future}
---
metadata: {name: nokind}
---
just a string
`;
    const m = parseManifest(yaml, 'mixed.yaml');
    expect(m.services.map((s) => s.metadata?.name)).toEqual(['ok']);
    expect(m.problems).toEqual([
      { object: 'ConfigMap kube-system/cfg', field: 'kind', message: '"ConfigMap" ignored: only Service and EndpointSlice are read', file: 'mixed.yaml' },
      { object: 'Service default/future', field: 'apiVersion', message: '"v2": Services are read as v1 only', file: 'mixed.yaml' },
      { object: 'object default/nokind', field: 'kind', message: 'missing', file: 'mixed.yaml' },
      { object: 'document 5', field: 'kind', message: 'not a Kubernetes object', file: 'mixed.yaml' },
    ]);
  });

  it('refuses v1beta1 EndpointSlices (what a v1.20 server serves), naming the apiVersion', () => {
    const m = parseManifest(text('endpointslices-v1beta1-list.json'), 'old.json');
    expect(m.endpointSlices).toEqual([]);
    expect(m.problems).toEqual([
      {
        object: 'EndpointSlice default/web-abcde',
        field: 'apiVersion',
        message: '"discovery.k8s.io/v1beta1": EndpointSlices are read as discovery.k8s.io/v1 only',
        file: 'old.json',
      },
    ]);
  });

  it('reports list items that are not objects', () => {
    const m = parseManifest(JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [1] }), 'l.json');
    expect(m.problems.map((p) => p.field)).toEqual(['items[0]']);
  });

  it('throws PARSE naming the file and the line of a YAML syntax error', () => {
    const bad = 'apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n   namespace: x\n';
    const err = catchError(() => parseManifest(bad, '/etc/proxy/state.yaml'));
    expect(err).toBeInstanceOf(ProxyError);
    expect(err.code).toBe('PARSE');
    expect(err.message).toMatch(/^\/etc\/proxy\/state\.yaml:5:\d+: invalid YAML: /);
    expect(err.message).not.toContain('\n');
  });

  it('reads YAML merge keys, as kubectl does, rather than a field named "<<"', () => {
    const yaml = [
      'apiVersion: v1', 'kind: List', 'items:',
      '- apiVersion: v1', '  kind: Service', '  metadata: {name: web}', '  spec: &spec', '    type: ClusterIP', '    clusterIP: 10.96.0.12', '    ports: [{name: http, port: 80}]',
      '- apiVersion: v1', '  kind: Service', '  metadata: {name: api}', '  spec:', '    <<: *spec', '    clusterIP: 10.96.0.13',
    ].join('\n');
    const [, api] = parseManifest(yaml, 'merge.yaml').services;
    expect(api?.spec).toEqual({ type: 'ClusterIP', ports: [{ name: 'http', port: 80 }], clusterIP: '10.96.0.13' });
  });

  it('reads JSON values one after another (-o json appended twice) as documents, as kubectl does', () => {
    const one = JSON.stringify({ apiVersion: 'v1', kind: 'Service', metadata: { name: 'a' }, spec: { clusterIP: '10.96.0.1', ports: [{ port: 80 }] } }, null, 2);
    const two = JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [{ apiVersion: 'v1', kind: 'Service', metadata: { name: 'b' }, spec: { clusterIP: '10.96.0.2', ports: [{ port: 80 }] } }] });
    expect(parseManifest(`${one}\n${two}\n${one.replace('"a"', '"c"')}`, 'appended.json').services.map((s) => s.metadata?.name)).toEqual(['a', 'b', 'c']);
    // A fault in a later value is still a JSON error, and flow-style YAML is not JSON (kubectl refuses it too).
    // The fault is named where it is, in the value that has it.
    expect(catchError(() => parseManifest('{"kind":"List","items":[]}\n{"kind": "List", "items": [,]}\n', 'bad.json')).message).toMatch(/^bad\.json:2:28: invalid JSON: Unexpected token ','; the line reads/);
    expect(catchError(() => parseManifest('{apiVersion: v1, kind: Service}', 'flow.yaml')).message).toMatch(/^flow\.yaml:1:2: invalid JSON: /);
  });

  it('throws PARSE naming the file and the line of a JSON syntax error', () => {
    const err = catchError(() => parseManifest('{\n  "kind": "List",\n  "items": [,]\n}\n', 'dump.json'));
    expect(err.code).toBe('PARSE');
    expect(err.message).toMatch(/^dump\.json:3:\d+: invalid JSON: /);
    const truncated = catchError(() => parseManifest('{\n  "kind": "List",\n  "items": [\n', 'cut.json'));
    // Cut short: the error is where the text ends.
    expect(truncated.message).toMatch(/^cut\.json:[34]:\d+: invalid JSON: Unexpected end of JSON input$/);
  });
});

describe('parseManifest and hostile files', () => {
  /** A billion laughs: `levels` anchors of ten aliases each, 10^levels strings once expanded, in under 1 KB. */
  const aliasBomb = (levels: number): string => {
    const lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]'];
    for (let i = 1; i <= levels; i++) lines.push(`a${i}: &a${i} [${Array.from({ length: 10 }, () => `*a${i - 1}`).join(',')}]`);
    return `apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n${lines.map((l) => `    ${l}`).join('\n')}\n`;
  };

  it('refuses YAML whose aliases expand far beyond the file, naming the file', () => {
    const bomb = aliasBomb(8);
    expect(bomb.length).toBeLessThan(1024);
    const err = catchError(() => parseManifest(bomb, 'bomb.yaml'));
    expect(err.code).toBe('PARSE');
    expect(err.message).toMatch(/^bomb\.yaml: invalid YAML: aliases expand the file to more than \d+ values and characters/);
    // The same nesting a few levels short is ordinary aliasing, and is read.
    expect(parseManifest(aliasBomb(3), 'small.yaml').services).toHaveLength(1);
  });

  it('reads anchors shared by many objects, as hand-written YAML uses them', () => {
    const items = ['- {apiVersion: v1, kind: Service, metadata: {name: s0}, spec: &spec {clusterIP: 10.96.0.1, ports: [{port: 80, name: http}]}}'];
    for (let i = 1; i < 500; i++) items.push(`- {apiVersion: v1, kind: Service, metadata: {name: s${i}}, spec: *spec}`);
    expect(parseManifest(`apiVersion: v1\nkind: List\nitems:\n${items.join('\n')}\n`, 'shared.yaml').services).toHaveLength(500);
  });

  it('refuses an alias inside its own anchor (a cycle)', () => {
    const err = catchError(() => parseManifest('apiVersion: v1\nkind: Service\nmetadata: &m {name: web, self: *m}\n', 'cycle.yaml'));
    expect(err.code).toBe('PARSE');
    expect(err.message).toBe('cycle.yaml: invalid YAML: an alias refers to a node that contains it');
  });

  it('quotes at most the faulty line of a file, and nothing of it through the error\'s cause', () => {
    const yaml = 'apiVersion: v1\nkind: Service\ntoken: s3cr3t-before\nmetadata:\n  name: web\n   namespace: x\nafter: s3cr3t-after\n';
    const err = catchError(() => parseManifest(yaml, 'secret.yaml'));
    expect(err.message).toBe('secret.yaml:6:13: invalid YAML: bad indentation of a mapping entry; the line reads "   namespace: x"');
    expect(JSON.stringify(stdSerializers.err(err))).not.toContain('s3cr3t');
    const json = `{"token": "s3cr3t-before",\n"kind": x,\n"after": "s3cr3t-after"}`;
    const jerr = catchError(() => parseManifest(json, 'secret.json'));
    expect(jerr.message).toMatch(/^secret\.json:2:9: invalid JSON: Unexpected token 'x'.*; the line reads "\\"kind\\": x,"$/);
    expect(JSON.stringify(stdSerializers.err(jerr))).not.toContain('s3cr3t');
  });

  it('cuts a long faulty line to 200 characters around the fault', () => {
    const items = Array.from({ length: 2000 }, (_, i) => `{"kind":"Service","metadata":{"name":"s${i}"}}`);
    items[1000] = '{"kind":"Service",,}';
    const err = catchError(() => parseManifest(`{"kind":"List","items":[${items.join(',')}]}`, 'one-line.json'));
    const quoted = /the line reads "(.*)"$/.exec(err.message)?.[1];
    expect(quoted).toContain('{"kind":"Service",,}'.replace(/"/g, '\\"'));
    expect(quoted?.length).toBeLessThan(250);
    expect(err.message.length).toBeLessThan(400);
  });

  it('reads lists of lists, but not nested past the stack', () => {
    const depth = 100_000;
    const text = `${'{"kind":"List","items":['.repeat(depth)}${']}'.repeat(depth)}`;
    const m = parseManifest(text, 'nested.json');
    expect(m.services).toEqual([]);
    expect(m.problems).toEqual([{ object: 'List default/<unnamed>', field: 'items', message: 'lists nested more than 100 levels deep', file: 'nested.json' }]);
  });

  it('reports a list of 100,000 non-objects in two problems, not 100,000', () => {
    const m = parseManifest(JSON.stringify({ apiVersion: 'v1', kind: 'List', items: Array.from({ length: 100_000 }, () => 1) }), 'l.json');
    expect(m.problems.map((p) => `${p.field}: ${p.message}`)).toEqual(['items[0]: not a Kubernetes object', 'items: 99999 more items are not Kubernetes objects']);
    const docs = manifestOf(Array.from({ length: 1000 }, () => 'x'), 'docs.yaml');
    expect(docs.problems).toHaveLength(2);
  });

  it('tells a file holding objects from one holding an empty List and one holding nothing', () => {
    const holds = (text: string): string => {
      const docs = parseDocuments(text, 'f');
      return holdsOf(docs, manifestOf(docs, 'f'));
    };
    expect(holds(text('services-list.json'))).toBe('objects');
    expect(holds('{"apiVersion":"v1","kind":"List","items":[]}')).toBe('empty-list');
    expect(holds('apiVersion: v1\nkind: ServiceList\nitems: []\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSliceList\nitems: []\n')).toBe('empty-list');
    for (const nothing of ['{}', '[]', '"x"', '42', 'null', '---', '# all commented out\n', '{"kind":"Servic"}', '{"kind":"List"}', 'kind: ConfigMap\napiVersion: v1\n']) {
      expect(holds(nothing), nothing).toBe('nothing');
    }
  });
});

function catchError(fn: () => unknown): ProxyError {
  try {
    fn();
  } catch (err) {
    return err as ProxyError;
  }
  throw new Error('expected an error');
}
