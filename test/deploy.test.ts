import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { CORE_SCHEMA, loadAll } from 'js-yaml';
import { describe, expect, it } from 'vitest';
import { parseCommandLine } from '../src/cli.js';
import { buildConfig } from '../src/config.js';
import { API_RESOURCES } from '../src/io/kube/api-resources.js';
import { parseKubeProxyConfiguration } from '../src/kube-proxy-config.js';

/**
 * The packaging agrees with the code: every manifest parses, the RBAC grants exactly what the
 * code reads, the ConfigMap is a configuration the proxy accepts, the DaemonSet runs it the way
 * the Dockerfile built it, and the Dockerfile builds and starts what package.json describes.
 */

const ROOT = join(import.meta.dirname, '..');
const DEPLOY = join(ROOT, 'deploy');
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string; bin: Record<string, string>; scripts: Record<string, string>; engines: { node: string } };

type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; [k: string]: unknown };

const files = readdirSync(DEPLOY).filter((f) => /\.ya?ml$/.test(f)).sort();
const docs: Array<{ file: string; obj: Obj }> = files.flatMap((file) =>
  loadAll(readFileSync(join(DEPLOY, file), 'utf8'), null, { schema: CORE_SCHEMA, filename: file })
    .filter((d) => d !== null && d !== undefined)
    .map((obj) => ({ file, obj: obj as Obj })),
);

function one(kind: string): Obj {
  const found = docs.filter((d) => d.obj.kind === kind);
  expect(found, `one ${kind} in deploy/`).toHaveLength(1);
  return (found[0] as { obj: Obj }).obj;
}

// The shapes read below, as far as these tests read them.
interface Rule { apiGroups: string[]; resources: string[]; verbs: string[] }
interface Probe { httpGet: { path: string; port: number } }
interface Container {
  name: string; image: string; args: string[]; env?: Array<{ name: string; value?: string }>;
  livenessProbe: Probe; readinessProbe: Probe;
  securityContext: { runAsNonRoot: boolean; runAsUser: number; capabilities: { drop: string[]; add: string[] } };
  volumeMounts: Array<{ name: string; mountPath: string }>;
}
interface PodSpec {
  serviceAccountName: string; hostNetwork: boolean; dnsPolicy?: string; priorityClassName: string; terminationGracePeriodSeconds: number;
  nodeSelector: Record<string, string>; tolerations: Array<{ key?: string; operator: string; effect?: string }>;
  containers: Container[]; volumes: Array<{ name: string; configMap?: { name: string }; hostPath?: { path: string; type?: string }; emptyDir?: object }>;
  initContainers?: Array<{ name: string; command: string[]; securityContext?: { privileged?: boolean }; volumeMounts?: Array<{ name: string; mountPath: string }> }>;
}
interface RollingDaemonSet {
  minReadySeconds?: number;
  updateStrategy: { type: string; rollingUpdate: { maxSurge?: number | string; maxUnavailable?: number | string } };
}

const daemonSet = (): { spec: { selector: { matchLabels: Record<string, string> }; template: { metadata: { labels: Record<string, string> }; spec: PodSpec } } } =>
  one('DaemonSet') as unknown as ReturnType<typeof daemonSet>;
const container = (): Container => daemonSet().spec.template.spec.containers[0] as Container;
const configText = (): string => (one('ConfigMap') as unknown as { data: Record<string, string> }).data['config.yaml'] as string;

describe('the manifests', () => {
  it('every file parses into Kubernetes objects with a kind, an apiVersion and a name', () => {
    expect(files).toEqual(['cluster-role-binding.yaml', 'cluster-role.yaml', 'config-map.yaml', 'daemon-set.yaml', 'kustomization.yaml', 'service-account.yaml']);
    for (const { file, obj } of docs) {
      expect(typeof obj.apiVersion, file).toBe('string');
      expect(typeof obj.kind, file).toBe('string');
      if (obj.kind !== 'Kustomization') expect(obj.metadata.name, file).toBe('kube-userspace-proxy');
    }
  });

  it('the kustomization lists every other manifest', () => {
    const k = one('Kustomization') as unknown as { resources: string[] };
    expect([...k.resources].sort()).toEqual(files.filter((f) => f !== 'kustomization.yaml'));
  });
});

describe('RBAC', () => {
  it('the ClusterRole grants exactly the resources and verbs the code reads, nothing more', () => {
    const rules = (one('ClusterRole') as unknown as { rules: Rule[] }).rules;
    const granted = new Set(rules.flatMap((r) => r.apiGroups.flatMap((g) => r.resources.flatMap((res) => r.verbs.map((v) => `${g}/${res}/${v}`)))));
    const used = new Set(Object.values(API_RESOURCES).flatMap((r) => r.verbs.map((v) => `${r.group}/${r.resource}/${v}`)));
    expect([...granted].sort()).toEqual([...used].sort());
    expect(rules.every((r) => !r.verbs.includes('*') && !r.resources.includes('*'))).toBe(true);
  });

  it('the binding ties that role to the DaemonSet\'s service account', () => {
    const sa = one('ServiceAccount');
    const binding = one('ClusterRoleBinding') as unknown as { roleRef: { kind: string; name: string }; subjects: Array<{ kind: string; name: string; namespace: string }> };
    expect(binding.roleRef).toMatchObject({ kind: 'ClusterRole', name: one('ClusterRole').metadata.name });
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: sa.metadata.name, namespace: sa.metadata.namespace }]);
    expect(daemonSet().spec.template.spec.serviceAccountName).toBe(sa.metadata.name);
    expect(one('DaemonSet').metadata.namespace).toBe(sa.metadata.namespace);
  });
});

describe('the ConfigMap', () => {
  it('holds a KubeProxyConfiguration the proxy accepts as it is, in userspace mode', () => {
    const { options, warnings } = parseKubeProxyConfiguration(configText(), 'config.yaml');
    expect(warnings).toEqual([]);
    const config = buildConfig(options);
    expect(configText()).toMatch(/^mode: userspace$/m);
    expect(config.healthzBindAddress).toEqual({ host: '0.0.0.0', port: 10256 });
    expect(config.metricsBindAddress).toEqual({ host: '127.0.0.1', port: 10249 });
  });
});

describe('the DaemonSet', () => {
  it('runs on every node on the host network, tolerating every taint as kube-proxy does', () => {
    const ds = daemonSet();
    const spec = ds.spec.template.spec;
    expect(spec.hostNetwork).toBe(true);
    // Not ClusterFirstWithHostNet: the cluster DNS is a Service, reached only through this proxy.
    expect(spec.dnsPolicy ?? 'ClusterFirst').not.toBe('ClusterFirstWithHostNet');
    expect(spec.priorityClassName).toBe('system-node-critical');
    expect(spec.nodeSelector).toEqual({ 'kubernetes.io/os': 'linux' });
    expect(spec.tolerations).toContainEqual({ operator: 'Exists' });
    expect(spec.tolerations).toContainEqual({ key: 'CriticalAddonsOnly', operator: 'Exists' });
    expect(ds.spec.template.metadata.labels).toMatchObject(ds.spec.selector.matchLabels);
  });

  it('probes liveness on /livez and readiness on /readyz, on the configured health port', () => {
    const c = container();
    const port = buildConfig(parseKubeProxyConfiguration(configText(), 'config.yaml').options).healthzBindAddress.port;
    expect(c.livenessProbe.httpGet).toEqual({ path: '/livez', port });
    expect(c.readinessProbe.httpGet).toEqual({ path: '/readyz', port });
  });

  it('passes flags the CLI accepts, reading the ConfigMap where it is mounted', () => {
    const c = container();
    const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, 'x']));
    const args = c.args.map((a) => a.replace(/\$\((\w+)\)/g, (_, name: string) => {
      expect(env, `$(${name}) is defined`).toHaveProperty(name);
      return 'node-1';
    }));
    const parsed = parseCommandLine(args);
    if (parsed.kind !== 'run') throw new Error(`the DaemonSet's args do not parse: ${parsed.output}`);
    const configPath = parsed.options.config as string;
    const mount = c.volumeMounts.find((m) => configPath.startsWith(`${m.mountPath}/`));
    expect(mount, '--config is under a mount').toBeDefined();
    const volume = daemonSet().spec.template.spec.volumes.find((v) => v.name === mount?.name);
    expect(volume?.configMap?.name).toBe(one('ConfigMap').metadata.name);
    expect(configPath.slice((mount?.mountPath.length ?? 0) + 1)).toBe('config.yaml');
  });

  it('grants only NET_ADMIN (NET_BIND_SERVICE at most) to a non-root user, the Dockerfile\'s', () => {
    const sc = container().securityContext;
    expect(sc.capabilities.drop).toEqual(['ALL']);
    expect(sc.capabilities.add).toContain('NET_ADMIN');
    expect(sc.capabilities.add.every((cap) => cap === 'NET_ADMIN' || cap === 'NET_BIND_SERVICE')).toBe(true);
    expect(sc.runAsNonRoot).toBe(true);
    expect(String(sc.runAsUser)).toBe(dockerfile().runtime.user.split(':')[0]);
  });

  it('updates by hand-over: a surge pod beside the old one, never a node without a proxy', () => {
    const spec = (one('DaemonSet') as unknown as { spec: RollingDaemonSet }).spec;
    expect(spec.updateStrategy).toEqual({ type: 'RollingUpdate', rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } });
    expect(spec.minReadySeconds).toBeGreaterThan(0);
    // With hostNetwork a container port is a host port: the surge pod could not be scheduled.
    expect((container() as unknown as { ports?: unknown[] }).ports ?? []).toEqual([]);
    // Not ready while a hand-over is under way (ProxierHealth.readyz).
    expect(container().readinessProbe.httpGet.path).toBe('/readyz');
  });

  it('puts the hand-over socket on a hostPath both pods mount, prepared by a root init container', () => {
    const config = buildConfig(parseKubeProxyConfiguration(configText(), 'config.yaml').options);
    const socket = config.handoverSocket as string;
    expect(socket).toMatch(/^\//);
    const mount = container().volumeMounts.find((m) => socket.startsWith(`${m.mountPath}/`));
    expect(mount, '--handover-socket is under a mount').toBeDefined();
    const spec = daemonSet().spec.template.spec;
    const volume = spec.volumes.find((v) => v.name === mount?.name);
    expect(volume?.hostPath).toEqual({ path: mount?.mountPath, type: 'DirectoryOrCreate' });
    const init = spec.initContainers?.find((c) => c.volumeMounts?.some((m) => m.name === mount?.name));
    expect(init?.command.join(' ')).toContain('tcp_migrate_req');
    expect(init?.command.join(' ')).toContain(`chown 65532:65532 ${mount?.mountPath}`);
    // A drained old process must not exit before its pod is deleted: the kubelet would restart it,
    // and the restart would take over from the new pod's proxy.
    expect(config.afterHandover).toBe('wait');
  });

  it('keeps V8\'s compile cache on a writable volume of the pod (the root file system is read-only)', () => {
    const dir = container().env?.find((e) => e.name === 'NODE_COMPILE_CACHE')?.value;
    expect(dir).toMatch(/^\//);
    const mount = container().volumeMounts.find((m) => m.mountPath === dir);
    const volume = daemonSet().spec.template.spec.volumes.find((v) => v.name === mount?.name);
    expect(volume?.emptyDir, `${String(dir)} is an emptyDir`).toBeDefined();
  });

  it('runs the image version package.json names, and lets the shutdown grace period finish', () => {
    expect(container().image).toMatch(new RegExp(`:${pkg.version.replace(/\./g, '\\.')}$`));
    const grace = buildConfig(parseKubeProxyConfiguration(configText(), 'config.yaml').options).shutdownGracePeriodMs;
    expect(daemonSet().spec.template.spec.terminationGracePeriodSeconds * 1000).toBeGreaterThan(grace);
  });
});

interface Stage { name: string; from: string; instructions: Array<{ op: string; args: string }>; user: string }

/** The Dockerfile as stages of instructions (continuation lines joined, comments dropped, ARGs before FROM expanded). */
function dockerfile(): { stages: Stage[]; runtime: Stage } {
  const text = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
  const lines = text.replace(/\\\n/g, ' ').split('\n').map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'));
  const globalArgs: Record<string, string> = {};
  const stages: Stage[] = [];
  for (const line of lines) {
    const [op = '', ...rest] = line.split(/\s+/);
    const args = rest.join(' ');
    if (op.toUpperCase() === 'ARG' && stages.length === 0) {
      const [k, v] = args.split('=');
      globalArgs[k as string] = v ?? '';
    } else if (op.toUpperCase() === 'FROM') {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args);
      const from = (m?.[1] ?? '').replace(/\$\{(\w+)\}/g, (_, k: string) => globalArgs[k] ?? '');
      stages.push({ name: m?.[2] ?? String(stages.length), from, instructions: [], user: 'root' });
    } else {
      const stage = stages[stages.length - 1] as Stage;
      stage.instructions.push({ op: op.toUpperCase(), args });
      if (op.toUpperCase() === 'USER') stage.user = args;
    }
  }
  return { stages, runtime: stages[stages.length - 1] as Stage };
}

describe('the Dockerfile', () => {
  const { stages, runtime } = dockerfile();
  const build = stages.find((s) => s.name === 'build');
  const runs = (s: Stage | undefined): string => (s?.instructions ?? []).filter((i) => i.op === 'RUN').map((i) => i.args).join(' ; ');

  it('builds in a stage with npm ci and the build script (tsc, then the bundle), from the lock file and the configs it reads', () => {
    expect(stages.map((s) => s.name)).toEqual(['build', 'runtime']);
    expect(runs(build)).toMatch(/\bnpm ci\b/);
    expect(runs(build)).toMatch(/\bnpm run build\b/);
    expect(pkg.scripts.build).toBe('tsc -p tsconfig.build.json && rolldown -c');
    expect(build?.instructions).toContainEqual({ op: 'COPY', args: 'package.json package-lock.json ./' });
    const copied = (build?.instructions ?? []).filter((i) => i.op === 'COPY').flatMap((i) => i.args.split(/\s+/).slice(0, -1));
    for (const file of ['tsconfig.json', 'tsconfig.build.json', 'rolldown.config.js', 'src']) expect(copied).toContain(file);
  });

  it('runs on a slim Node image of .node-version\'s major, one package.json\'s engines admit, with iptables and iproute2', () => {
    const major = readFileSync(join(ROOT, '.node-version'), 'utf8').trim();
    const minimum = /^>=(\d+)\.(\d+)$/.exec(pkg.engines.node);
    expect(minimum, pkg.engines.node).not.toBeNull();
    expect(Number(major)).toBeGreaterThanOrEqual(Number(minimum?.[1]));
    for (const s of stages) expect(s.from).toMatch(new RegExp(`^node:${major}-[a-z]+-slim$`));
    expect(runs(runtime)).toMatch(/apt-get install [^;]*\biptables\b/);
    expect(runs(runtime)).toMatch(/apt-get install [^;]*\biproute2\b/);
  });

  it('ships the compiled code and production dependencies only, and runs package.json\'s bin as a non-root user', () => {
    const copies = runtime.instructions.filter((i) => i.op === 'COPY').map((i) => i.args);
    expect(copies.every((c) => c.startsWith('--from=build '))).toBe(true);
    expect(runs(build)).toMatch(/npm prune --omit=dev/);
    const bin = Object.values(pkg.bin)[0] as string;
    expect(copies).toContain(`--from=build /src/${bin.split('/').slice(0, 2).join('/')} ./${bin.split('/').slice(0, 2).join('/')}`);
    const entry = runtime.instructions.find((i) => i.op === 'ENTRYPOINT');
    expect(JSON.parse(entry?.args ?? '[]')).toEqual(['node', bin]);
    expect(runtime.user).toMatch(/^[1-9]\d*:[1-9]\d*$/); // numeric, not root: runAsNonRoot can check it
  });

  it('.dockerignore keeps local builds and dependencies out of the context', () => {
    const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8').split('\n').map((l) => l.trim());
    expect(ignored).toEqual(expect.arrayContaining(['node_modules', 'dist', '.git']));
  });
});
