#!/usr/bin/env bash
# How trace-gc-by-hand.txt was made (eleventh session). Usage:
#   trace-gc.sh DIST COMPACT_STATE PRETTY_STATE ROUNDS
# DIST: a build's dist/ (npm run build); the state files: 10,000 Services × 10 endpoints as the
# harness writes them (node dist/bench/run.js --only scale-start --keep-temp leaves them in its
# temporary directory, start-10000x10-{compact,pretty}-N/state.json).
# Each start runs with --trace-gc until the "synced proxy rules" line; the collections before that
# line are counted and their pauses summed. Rows: floor = dist/bench/start-floor.js with Node's
# default heap settings; floor16 = the same with --max-semi-space-size=16 (the proxy's own setting);
# proxy = dist/bundle/main.js (which re-executes itself with that setting and glibc's).
dist=$1; compact=$2; pretty=$3; rounds=$4
for r in $(seq 1 "$rounds"); do for state in "$compact" "$pretty"; do for v in floor floor16 proxy; do
  case $v in
    floor) cmd=(node --trace-gc "$dist/bench/start-floor.js");;
    floor16) cmd=(node --trace-gc --max-semi-space-size=16 "$dist/bench/start-floor.js");;
    proxy) cmd=(node --trace-gc "$dist/bundle/main.js" --portal loopback --metrics-bind-address 127.0.0.1:0 --healthz-bind-address 127.0.0.1:0);;
  esac
  log=$(mktemp); prlimit --nofile=20000:20000 -- "${cmd[@]}" --state "$state" > "$log" 2>&1 & pid=$!
  for i in $(seq 1 500); do grep -q '"synced proxy rules"' "$log" && break; sleep 0.01; done
  kill "$pid"; wait "$pid" 2>/dev/null
  python3 - "$log" "$v" "$(basename "$state")" <<'PY'
import re, sys
n = 0; ms = 0.0; last = ''
for line in open(sys.argv[1]):
    if '"synced proxy rules"' in line: break
    m = re.search(r'(Scavenge|Mark-Compact|Minor Mark-Sweep)\S* ([\d.]+) \(([\d.]+)\) -> ([\d.]+) \(([\d.]+)\) MB, pooled: \d+ MB, ([\d.]+) / ([\d.]+) ms', line)
    if m: n += 1; ms += float(m.group(6)); last = f"{m.group(4)} MB after the last"
print(sys.argv[2], sys.argv[3], n, 'GCs', round(ms, 1), 'ms;', last)
PY
  rm -f "$log"
done; done; done
