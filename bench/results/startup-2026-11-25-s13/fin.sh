#!/bin/bash
export PATH=/tmp/node24/node_modules/.bin:$PATH
cd /tmp/s13fin
for r in 1 2 3 4; do
  for spec in head=/tmp/s13fin/dist/bundle/main.js floor=/tmp/s13fin/dist/bench/start-floor.js; do
    label=${spec%%=*}; main=${spec#*=}
    node dist/bench/run.js --only scale-start --scale 10000 --runs 3 --no-pin --proxy-main $main --label $label --out /work/notes/s13/fin10k/$label-$r >/dev/null 2>&1
  done
done
python3 /work/notes/s13/med.py /work/notes/s13/fin10k > /work/notes/s13/fin10k.txt
