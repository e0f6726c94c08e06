#!/bin/bash
# startab3.sh OUTDIR ROUNDS RUNS 'label|HARNESSDIR|MAINJS' ... : start-up at 10k x 10 in turns, harness per spec
export PATH=/tmp/node24/node_modules/.bin:$PATH
OUT=$1; ROUNDS=$2; RUNS=$3; shift 3
mkdir -p $OUT
for r in $(seq 1 $ROUNDS); do
  for spec in "$@"; do
    IFS='|' read -r label hdir main <<< "$spec"
    (cd $hdir && node dist/bench/run.js --only scale-start --scale 10000 --runs $RUNS --no-pin --proxy-main $main --label $label --out $OUT/$label-$r >/dev/null 2>&1)
  done
done
python3 /work/notes/s13/med.py $OUT
