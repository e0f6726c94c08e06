#!/bin/bash
export PATH=/tmp/node24/node_modules/.bin:$PATH
cd /tmp/s13h
for spec in proxy1=/tmp/s13new2/dist/bundle/main.js floor=/tmp/s13h/dist/bench/floor-relay.js proxy2=/tmp/s13new2/dist/bundle/main.js; do
  label=${spec%%=*}; main=${spec#*=}
  node dist/bench/run.js --workers 2 --only http-keepalive,http-close,tcp-bulk,dns --systems proxy,nginx,haproxy --runs 3 --duration 3 --warmup 1 --proxy-main $main --label $label --out /work/notes/s13/two/$label > /work/notes/s13/two/$label.log 2>&1
done
