#!/bin/bash
# One command on the GPU machine: build the standalone backward harness (every backward head dim,
# sm_90 or ARCH), record the ptxas report, check correctness, time the sweep, then time tile
# variants of the config table (VARIANTS) at head_dim 64 / 128, and torch's flash backward (TORCH=0: not).
# Logs go to $OUT (default /tmp/sm80bwd-out).  MODE=all|check|bench  NCU=1: stall report.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/sm80bwd-out}
MODE=${MODE:-all}
ARCH=${ARCH:-90}
B=build-sm80bwd-dev
mkdir -p "$OUT" "$B"
DIMS="32 64 96 128 192 256"
BASE="-std=c++20 -O3 -arch=sm_$ARCH --expt-relaxed-constexpr -lineinfo"
FLAGS="$BASE -Iinclude -Isrc"
for d in $DIMS; do FLAGS="$FLAGS -DFLASHATTN_HDIM_$d=1"; done
# name:head_dim:{head_dim,block_m,block_n,warps,stages,split_d,chunk_m,ctas_per_sm,layout}[:flags], no spaces
# (layout 1: the 2D-warp-tile kernel of bwd_kernel_2d.cuh); flags: compiler defines joined by commas
# (a dev switch of the kernel under test, e.g. -DMY_SWITCH=1,-DOTHER=2). A variant with the table's
# line and no flags is the control: variants' processes read 2-3% under the table's (NOTES.md).
VARIANTS=${VARIANTS:-"L0_128:128:{128,64,128,8,2,1,64,1,0} L0_64:64:{64,128,128,8,2,1,32,1,0}"}

throttle() { while [ "$(jobs -r | wc -l)" -ge 16 ]; do sleep 0.2; done; }
t0=$(date +%s)
objs=()
for f in dev/sm80bwd/bwd_dev.cu src/cuda/sm80/bwd_launch.cu src/cuda/sm80/bwd_hdim*.cu src/cpu/reference.cpp; do
  o="$B/$(basename "$f").o"
  objs+=("$o")
  nvcc $FLAGS -Xptxas -v -Xcompiler -fopenmp -c "$f" -o "$o" >"$B/$(basename "$f").log" 2>&1 &
  throttle
done
for v in $VARIANTS; do
  name=${v%%:*}; rest=${v#*:}; d=${rest%%:*}; cfg=${rest#*:}; flags=""
  case "$cfg" in *"}:"*) flags=${cfg#*\}:}; flags=${flags//,/ }; cfg=${cfg%%\}:*}"}" ;; esac
  vd="$B/var_$name"
  mkdir -p "$vd/cuda/sm80"
  sed -E "s/^( *)\{$d, +[0-9, ]*\}/\1$cfg/" src/cuda/sm80/bwd_config.cuh >"$vd/cuda/sm80/bwd_config.cuh"
  for f in src/cuda/sm80/bwd_launch.cu src/cuda/sm80/bwd_hdim${d}_bf16.cu src/cuda/sm80/bwd_hdim${d}_fp16.cu; do
    nvcc $BASE $flags -I"$vd" -Iinclude -Isrc -DFLASHATTN_HDIM_$d=1 -Xptxas -v -c "$f" -o "$vd/$(basename "$f").o" \
      >"$vd/$(basename "$f").log" 2>&1 &
    throttle
  done
done
wait
nvcc -arch=sm_$ARCH "${objs[@]}" -Xcompiler -fopenmp -o "$B/bwd_dev" 2>&1 | tee "$OUT/link.txt"
for v in $VARIANTS; do
  name=${v%%:*}
  nvcc -arch=sm_$ARCH "$B/bwd_dev.cu.o" "$B/reference.cpp.o" "$B/var_$name"/*.o -Xcompiler -fopenmp \
    -o "$B/bwd_dev_$name" 2>&1 | tee -a "$OUT/link.txt"
done
echo "build: $(( $(date +%s) - t0 )) s" | tee "$OUT/build.txt"
grep -h -E "error" "$B"/*.log "$B"/var_*/*.log | head -20 | tee -a "$OUT/build.txt"
# ptxas: registers and spills of every main kernel
for f in "$B"/bwd_hdim*.log "$B"/var_*/bwd_hdim*.log; do
  echo "$f: $(grep -A2 'bwd_main' "$f" | grep -E 'spill|registers' | tr -s ' ' | tr '\n' ' ')"
done | tee "$OUT/ptxas.txt"
[ -x "$B/bwd_dev" ] || exit 1

# Order: variants first (check, then time), then the table's sweep, torch, the table's full check, the
# deterministic timing; every step under its own timeout so that a slow one leaves the rest.
if [ "$MODE" = all ] || [ "$MODE" = check ]; then
  for v in $VARIANTS; do  # a variant's own head_dim only
    name=${v%%:*}; rest=${v#*:}; d=${rest%%:*}
    [ -x "$B/bwd_dev_$name" ] && BWD_CHECK_HDIM=$d timeout 40 "$B/bwd_dev_$name" check >"$OUT/check_$name.txt" 2>&1
    grep -E "FAIL|check:" "$OUT/check_$name.txt" | sed "s/^/variant $name: /" | tee -a "$OUT/check_variants.txt"
  done
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  for v in $VARIANTS; do
    name=${v%%:*}; rest=${v#*:}; d=${rest%%:*}; cfg=${rest#*:}
    echo "variant $name: $cfg" | tee -a "$OUT/variants.txt"
    [ -x "$B/bwd_dev_$name" ] && BWD_BENCH_HDIM=$d timeout 30 "$B/bwd_dev_$name" bench 2>&1 | tail -n 8 |
      tee -a "$OUT/variants.txt"
  done
  timeout 40 "$B/bwd_dev" bench 2>&1 | tee "$OUT/bench.txt"
  if [ "${TORCH:-1}" = 1 ]; then timeout 60 python3 dev/sm80bwd/torch_bwd.py 2>&1 | tee "$OUT/torch.txt"; fi
fi
if [ "$MODE" = all ] || [ "$MODE" = check ]; then
  timeout "${CHECK_TIMEOUT:-60}" "$B/bwd_dev" check 2>&1 | tee "$OUT/check.txt" | grep -E "FAIL|check:"
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  timeout 30 "$B/bwd_dev" bench-det 2>&1 | tee "$OUT/bench_det.txt"
  # Stall reasons of one main-kernel launch (head_dim 128, seqlen 4k, non-causal).
  if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
    BWD_BENCH_HDIM=128 timeout 150 ncu --clock-control none -k regex:bwd_main -s 3 -c 1 --section WarpStateStats \
      --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section Occupancy --section LaunchStats "$B/bwd_dev" bench >"$OUT/ncu.txt" 2>&1
    stalls=""
    for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected \
      lg_throttle dispatch_stall no_instruction branch_resolving membar drain sleeping tex_throttle imc_miss; do
      stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
    done
    BWD_BENCH_HDIM=128 timeout 100 ncu --clock-control none -k regex:bwd_main -s 3 -c 1 --metrics "${stalls#,}" \
      "$B/bwd_dev" bench >"$OUT/ncu_stalls.txt" 2>&1
  fi
fi
