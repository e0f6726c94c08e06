import { describe, expect, it } from 'vitest';
import { addressChanges, missingAddresses, wantedAddresses } from '../src/core/rules/bind-addresses.js';
import { FamilyBook, familyHints } from '../src/core/rules/families.js';
import type { ProxyUnit } from '../src/core/units.js';

function unit(id: string, portals: ProxyUnit['portals']): ProxyUnit {
  return { id, servicePort: id.replace(' (external)', ''), service: 'default/web', protocol: 'TCP', scope: 'all', portals, endpoints: [], affinity: { type: 'None', timeoutSeconds: 10800 } };
}

describe('the bind portal\'s addresses', () => {
  const a = unit('default/web:http', [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }, { kind: 'clusterIP', ip: 'fd00::a', port: 80 }, { kind: 'nodePort', ip: '', port: 30080 }]);
  const b = unit('default/api:http', [{ kind: 'externalIP', ip: '192.0.2.7', port: 80 }, { kind: 'loadBalancer', ip: '198.51.100.7', port: 80 }]);

  it('wants every ClusterIP, externalIP and load-balancer IP, never a node port, one entry per address however it is spelt', () => {
    expect([...wantedAddresses([a, b]).values()].sort()).toEqual(['10.96.0.10', '192.0.2.7', '198.51.100.7', 'fd00::a']);
    // fd00:0:0::A, as the interface may list it, is fd00::a: present, so not missing.
    const present = wantedAddresses([unit('default/other:x', [{ kind: 'clusterIP', ip: 'fd00:0:0::A', port: 1 }])]);
    expect(missingAddresses([a], present)).toEqual(['10.96.0.10']);
  });

  it('adds what is wanted and missing, removes what is present and not wanted', () => {
    const present = wantedAddresses([b, unit('default/old:http', [{ kind: 'clusterIP', ip: '10.96.0.99', port: 80 }])]);
    expect(addressChanges(wantedAddresses([a, b]), present)).toEqual({ add: ['10.96.0.10', 'fd00::a'], remove: ['10.96.0.99'] });
    expect(addressChanges(present, present)).toEqual({ add: [], remove: [] });
  });
});

describe('FamilyBook', () => {
  it('gives a node-port-only half its sibling\'s families, learnt before the sync and replaced at it', () => {
    const book = new FamilyBook();
    const external = unit('default/web:http (external)', [{ kind: 'nodePort', ip: '', port: 30080 }]);
    expect(book.familiesOf(external)).toEqual([4]); // nothing known: IPv4
    book.learn([unit('default/web:http', [{ kind: 'clusterIP', ip: 'fd00::a', port: 80 }])]);
    expect(book.familiesOf(external)).toEqual([6]);
    book.replace([unit('default/web:http', [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }, { kind: 'clusterIP', ip: 'fd00::a', port: 80 }])]);
    expect(book.familiesOf(external)).toEqual([4, 6]);
    book.replace([]);
    expect(book.familiesOf(external)).toEqual([4]);
  });

  it('after any sequence of replaces (units added, gone, made anew, changed in place of their id) and learns, knows what familyHints of the running units says', () => {
    const web = unit('default/web:http', [{ kind: 'clusterIP', ip: '10.96.0.10', port: 80 }]);
    const webV6 = unit('default/web:http', [{ kind: 'clusterIP', ip: 'fd00::a', port: 80 }]);
    const webExternal = unit('default/web:http (external)', [{ kind: 'nodePort', ip: '', port: 30080 }]);
    const webExternalLb = unit('default/web:http (external)', [{ kind: 'loadBalancer', ip: 'fd00:1::7', port: 80 }]);
    const api = unit('default/api:http', [{ kind: 'externalIP', ip: '192.0.2.7', port: 80 }]);
    const dns = unit('kube-system/dns:dns', [{ kind: 'clusterIP', ip: '10.96.0.53', port: 53 }, { kind: 'clusterIP', ip: 'fd00::35', port: 53 }]);
    const steps: ProxyUnit[][] = [
      [web, webExternal, api],
      [web, webExternal, api],
      [{ ...web }, webExternal, api, dns],
      [webV6, webExternal, dns],
      [webV6, webExternalLb, dns],
      [webExternalLb, dns],
      [webExternal],
      [dns, web],
      [],
      [api, dns],
    ];
    const book = new FamilyBook();
    steps.forEach((units, i) => {
      book.replace(units);
      expect(new Map([...book.known].sort()), `step ${i}`).toEqual(new Map([...familyHints(units)].sort()));
      // Something opened before the next sync is known until that sync says what runs.
      book.learn([webV6]);
      expect(book.known.get('default/web:http')).toEqual([6]);
    });
  });
});
