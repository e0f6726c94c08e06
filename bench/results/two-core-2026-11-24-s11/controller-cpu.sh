#!/usr/bin/env bash
# samples, every 2 s, the CPU ticks of each kube-userspace-proxy process with --workers (controller = the one whose parent is not such a process)
while [ ! -e $1 ]; do
  for p in $(pgrep -f "main.js --state"); do echo "$(date +%s) $p $(cat /proc/$p/stat 2>/dev/null | awk '{print $4, $14+$15}')"; done
  sleep 2
done
