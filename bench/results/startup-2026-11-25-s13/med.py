import json,glob,sys,statistics as st,os
out=sys.argv[1]; res={}
for f in sorted(glob.glob(out+'/*/bench-*.json')):
    label=os.path.basename(os.path.dirname(f)).rsplit('-',1)[0]
    d=json.load(open(f))
    for r in d['runs']:
        if 'listenMs' not in r['metrics']: continue
        fm=r['workload'].split('/')[-1]
        res.setdefault((label,fm),[]).append((r['metrics']['listenMs'],r['metrics']['cpuMs'],r['metrics'].get('rssMB',0)))
for (label,fm),v in sorted(res.items()):
    l=[x[0] for x in v]; c=[x[1] for x in v]; m=[x[2] for x in v]
    print(f"{label:12s} {fm:8s} n={len(v):3d} listen med {st.median(l):7.0f} min {min(l):6.0f} max {max(l):6.0f}  cpu {st.median(c):6.0f}  rss {st.median(m):5.0f}")
for label in sorted({k[0] for k in res}):
    l=[x[0] for (lb,fm),v in res.items() if lb==label for x in v]
    print(f"{label:12s} all      n={len(l):3d} listen med {st.median(l):7.0f}")
