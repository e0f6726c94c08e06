#!/bin/bash
# dpab.sh OUTDIR ROUNDS WORKLOADS label=MAINJS ... : data path in turns, harness /tmp/s13h
export PATH=/tmp/node24/node_modules/.bin:$PATH
OUT=$1; ROUNDS=$2; WL=$3; shift 3
mkdir -p $OUT
for r in $(seq 1 $ROUNDS); do
  for spec in "$@"; do
    label=${spec%%=*}; main=${spec#*=}
    (cd /tmp/s13h && node dist/bench/run.js --only $WL --systems proxy,nginx --runs 3 --duration 3 --warmup 1 --proxy-main $main --label $label --out $OUT/$label-$r >$OUT/$label-$r.log 2>&1)
  done
done
