import { readFileSync } from 'node:fs';

/**
 * The version, from package.json (one place to bump). The package root is one folder above
 * src/version.ts and two above dist/src/version.js or the bundle's chunk in dist/bundle: the
 * first package.json of ours going up.
 */
function packageVersion(): string {
  for (const up of ['../package.json', '../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(up, import.meta.url), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'kube-userspace-proxy' && typeof pkg.version === 'string') return pkg.version;
    } catch {
      // not here: look one folder further up
    }
  }
  return 'unknown';
}

export const VERSION: string = packageVersion();
