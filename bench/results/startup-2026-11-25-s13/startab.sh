#!/bin/bash
# startab.sh OUTDIR ROUNDS RUNS 'label|HARNESSDIR|MAINJS[|nodearg nodearg]' ...
# Start-up at 10,000 Services × 10 endpoints, the specs in turns, each round RUNS runs per formatting;
# medians by med.py. HARNESSDIR holds the build whose dist/bench/run.js times the start (the
# `harness/` set compared three), MAINJS the proxy (or start-floor.js), the node args go to the
# proxy through --node-arg (the `gc1/`, `gc2/` sets).
export PATH=/tmp/node24/node_modules/.bin:$PATH
OUT=$1; ROUNDS=$2; RUNS=$3; shift 3
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    IFS='|' read -r label hdir main nargs <<< "$spec"
    na=(); for a in $nargs; do na+=("--node-arg=$a"); done
    (cd "$hdir" && node dist/bench/run.js --only scale-start --scale 10000 --runs "$RUNS" --no-pin --proxy-main "$main" "${na[@]}" --label "$label" --out "$OUT/$label-$r" >/dev/null 2>&1)
  done
done
python3 "$(dirname "$0")/med.py" "$OUT"
