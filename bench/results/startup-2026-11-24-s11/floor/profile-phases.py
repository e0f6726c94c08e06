# ms of samples per phase: the first matching frame (outermost-first list order) on each sample's stack
import json,sys,collections,os
d=json.load(open(sys.argv[1]))
nodes={n['id']:n for n in d['nodes']}; parent={}
for n in d['nodes']:
    for c in n.get('children',[]): parent[c]=n['id']
PH=[('shutdown','shutdown'),('parseDocuments','parse'),('validateEndpointSlice','validate slice'),('validateService','validate svc'),('storeEndpointSlice','store slice'),('storeService','store svc'),('replace','replace other'),('translateService','translate'),('planService','plan other'),('createServerHandle','net handle'),('node:net','net js'),('openUnit','open unit'),('listenSpecs','listen specs'),('apply','apply other'),('(garbage collector)','gc'),('(program)','program'),('(idle)','idle'),('main.js','modules/main'),('',"other")]
c=collections.Counter(); t=0
def names(x):
    out=[]
    while x is not None:
        cf=nodes[x]['callFrame']; out.append(f"{cf['functionName']} {cf['url']}"); x=parent.get(x)
    return out
for s,dt in zip(d['samples'],d['timeDeltas']):
    ns=names(s); t+=dt
    for pat,label in PH:
        if any(pat in n for n in ns): c[label]+=dt; break
for k,v in sorted(c.items(), key=lambda kv:-kv[1]): print(f"{v/1000:7.1f} {k}")
print(f"{t/1000:7.1f} total")
