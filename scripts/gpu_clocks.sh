#!/usr/bin/env bash
# The GPU's SM clock, power and throttle reasons while a benchmark runs (the lent H100s run long
# kernels at their power limit, which sets what a run can reach: docs/sm90.md, step 13).
#   scripts/gpu_clocks.sh start LOG     samples every 500 ms into LOG in the background; prints the pid
#   scripts/gpu_clocks.sh summary LOG   one line: clock quartiles of the busy samples (>= 1000 MHz),
#                                       the power limit and how often each throttle reason was set
set -u
case $1 in
  start)
    nvidia-smi --query-gpu=clocks.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active \
      --format=csv,noheader,nounits -lms 500 >"$2" 2>&1 &
    echo $! ;;
  summary)
    awk -F', ' '$1 >= 1000 {print $1, $3, $5}' "$2" | sort -n | awk '
      {c[NR] = $1; lim = $2; r[$3]++}
      END {if (NR) {printf "SM clock under load q1/median/q3 %d/%d/%d MHz (%d samples); power limit %s W; throttle:",
                    c[int(NR/4)+1], c[int(NR/2)+1], c[int(3*NR/4)+1], NR, lim;
                    for (k in r) printf " %s x%d", k, r[k]; print ""}}' ;;
esac
