#!/bin/bash
# startab2.sh OUTDIR ROUNDS RUNS 'label|MAINJS|nodearg nodearg' ... : start-up at 10k x 10 in turns, harness from /tmp/s13h
export PATH=/tmp/node24/node_modules/.bin:$PATH
OUT=$1; ROUNDS=$2; RUNS=$3; shift 3
mkdir -p $OUT
for r in $(seq 1 $ROUNDS); do
  for spec in "$@"; do
    IFS='|' read -r label main nargs <<< "$spec"
    na=(); for a in $nargs; do na+=("--node-arg=$a"); done
    (cd /tmp/s13h && node dist/bench/run.js --only scale-start --scale 10000 --runs $RUNS --no-pin --proxy-main $main "${na[@]}" --label $label --out $OUT/$label-$r >/dev/null 2>&1)
  done
done
python3 /work/notes/s13/med.py $OUT
