#!/usr/bin/env bash
# usage: ab.sh OUTDIR ROUNDS ONLY SYSTEMS label=main.js ...
set -u
out=$1; rounds=$2; only=$3; systems=$4; shift 4
export PATH=/tmp/node24/node_modules/.bin:$PATH
mkdir -p $out
touch /work/notes/QUIET
until mkdir /work/notes/BENCHLOCK 2>/dev/null; do sleep 5; done
sleep 20  # helpers obey QUIET between commands
cd /work/main
for round in $(seq 1 $rounds); do
  for spec in "$@"; do
    label=${spec%%=*}; main=${spec#*=}
    node dist/bench/run.js --only $only --systems $systems --runs ${RUNS:-3} --duration ${DUR:-3} --warmup ${WARM:-1} --proxy-main $main --label "$label-$round" --out $out/$label-$round > $out/$label-$round.log 2>&1
  done
done
rmdir /work/notes/BENCHLOCK
rm -f /work/notes/QUIET
echo done > $out/done
