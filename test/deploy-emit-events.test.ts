import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { CORE_SCHEMA, load, loadAll } from 'js-yaml';
import { describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { EVENT_RESOURCE } from '../src/io/kube/api-resources.js';

/**
 * deploy/emit-events/: the opt-in kustomize component for --emit-events. It alone grants `create`
 * on events (the base grants nothing it does not read, test/deploy.test.ts), and the flag it adds
 * is one the CLI accepts.
 */

const ROOT = join(import.meta.dirname, '..');
const DIR = join(ROOT, 'deploy', 'emit-events');
const yaml = (file: string): Record<string, unknown> => load(readFileSync(join(DIR, file), 'utf8'), { schema: CORE_SCHEMA }) as Record<string, unknown>;

interface Rule { apiGroups: string[]; resources: string[]; verbs: string[] }

describe('the emit-events component', () => {
  it('grants exactly what the Event recorder writes, bound to the proxy\'s service account', () => {
    const role = yaml('events-cluster-role.yaml') as { metadata: { name: string }; rules: Rule[] };
    expect(role.rules).toEqual([{ apiGroups: [EVENT_RESOURCE.group], resources: [EVENT_RESOURCE.resource], verbs: [...EVENT_RESOURCE.verbs] }]);
    const binding = yaml('events-cluster-role-binding.yaml') as { roleRef: { name: string }; subjects: Array<{ name: string; namespace: string }> };
    expect(binding.roleRef.name).toBe(role.metadata.name);
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: 'kube-userspace-proxy', namespace: 'kube-system' }]);
  });

  it('adds --emit-events, a flag the CLI accepts', () => {
    const k = yaml('kustomization.yaml') as { kind: string; resources: string[]; patches: Array<{ patch: string }> };
    expect(k.kind).toBe('Component');
    expect([...k.resources].sort()).toEqual(['events-cluster-role-binding.yaml', 'events-cluster-role.yaml']);
    const ops = load(k.patches[0]?.patch ?? '') as Array<{ op: string; path: string; value: string }>;
    expect(ops).toEqual([{ op: 'add', path: '/spec/template/spec/containers/0/args/-', value: '--emit-events' }]);
    const outcome = parseCommandLine(['--emit-events']);
    expect(outcome).toEqual({ kind: 'run', options: { emitEvents: true } });
  });

  it.skipIf(!hasKubectl())('builds with kubectl kustomize on top of the base', () => {
    const dir = mkdtempSync(join(tmpdir(), 'kup-kustomize-'));
    try {
      writeFileSync(join(dir, 'kustomization.yaml'), `resources:\n- ${relative(dir, join(ROOT, 'deploy'))}\ncomponents:\n- ${relative(dir, DIR)}\n`);
      const out = execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8', timeout: 60_000 });
      const objs = loadAll(out, null, { schema: CORE_SCHEMA }) as Array<{ kind: string; metadata: { name: string }; spec?: { template: { spec: { containers: Array<{ args: string[] }> } } } }>;
      expect(objs.filter((o) => o.kind === 'ClusterRole').map((o) => o.metadata.name).sort()).toEqual(['kube-userspace-proxy', 'kube-userspace-proxy-events']);
      expect(objs.find((o) => o.kind === 'DaemonSet')?.spec?.template.spec.containers[0]?.args).toContain('--emit-events');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

function hasKubectl(): boolean {
  try {
    execFileSync('kubectl', ['version', '--client'], { stdio: 'ignore', timeout: 30_000 });
    return true;
  } catch {
    return false;
  }
}
