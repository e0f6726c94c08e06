import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CORE_SCHEMA, loadAll } from 'js-yaml';
import { describe, expect, it } from 'vitest';
import { API_RESOURCES, PORT_FORWARD_RESOURCE } from '../src/io/kube/api-resources.js';

/** The developer's Role for --dialer port-forward --namespace grants exactly what the code uses there. */

interface Rule { apiGroups: string[]; resources: string[]; verbs: string[] }
type Obj = { kind: string; metadata: { name: string }; rules?: Rule[]; roleRef?: { kind: string; name: string }; subjects?: Array<{ kind: string }> };

const docs = loadAll(readFileSync(join(import.meta.dirname, '..', 'deploy', 'developer', 'port-forward-role.yaml'), 'utf8'), null, { schema: CORE_SCHEMA }) as Obj[];

describe('deploy/developer/port-forward-role.yaml', () => {
  it('a Role granting list and watch on Services and EndpointSlices, get and create on pods/portforward, nothing more', () => {
    const role = docs.find((d) => d.kind === 'Role');
    const granted = new Set((role?.rules ?? []).flatMap((r) => r.apiGroups.flatMap((g) => r.resources.flatMap((res) => r.verbs.map((v) => `${g}/${res}/${v}`)))));
    const used = [API_RESOURCES.services, API_RESOURCES.endpointSlices, PORT_FORWARD_RESOURCE].flatMap((r) => r.verbs.map((v) => `${r.group}/${r.resource}/${v}`));
    expect([...granted].sort()).toEqual(used.sort());
  });

  it('a RoleBinding of that Role to a user, and no cluster-wide object', () => {
    const binding = docs.find((d) => d.kind === 'RoleBinding');
    expect(binding?.roleRef).toMatchObject({ kind: 'Role', name: 'kube-userspace-proxy-developer' });
    expect(binding?.subjects?.map((s) => s.kind)).toEqual(['User']);
    expect(docs.map((d) => d.kind).sort()).toEqual(['Role', 'RoleBinding']);
  });
});
