#!/usr/bin/env bash
# usage: startab.sh OUTDIR ROUNDS: e1a8504 (/tmp/s12base) vs now (/tmp/s12new), scale-start 10k unpinned, in turns, one harness (/tmp/s12new)
out=$1; rounds=$2
export PATH=/tmp/node24/node_modules/.bin:$PATH
mkdir -p $out; cd /work/main; touch /work/notes/QUIET
for round in $(seq 1 $rounds); do
  for spec in base=/tmp/s12base/dist/bundle/main.js new=/tmp/s12new/dist/bundle/main.js; do
    label=${spec%%=*}; main=${spec#*=}
    echo "$label-$round load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/loads.txt
    node /tmp/s12new/dist/bench/run.js --only scale-start --scale 10000 --runs 3 --no-pin --proxy-main $main --label "$label-$round" --out $out/$label-$round > $out/$label-$round.log 2>&1
  done
done
rm -f /work/notes/QUIET
echo done > $out/done
