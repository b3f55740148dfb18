#!/bin/bash
# One command on the GPU machine: build the standalone backward harness (every backward head dim,
# sm_90 or ARCH), record the ptxas report, check correctness, time the sweep, time torch's flash
# backward on the same shapes. Logs go to $OUT (default /tmp/sm80bwd-out).
#   MODE=all|check|bench   (default all)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/sm80bwd-out}
MODE=${MODE:-all}
ARCH=${ARCH:-90}
B=build-sm80bwd-dev
mkdir -p "$OUT" "$B"
DIMS="32 64 96 128 192 256"
FLAGS="-std=c++20 -O3 -arch=sm_$ARCH --expt-relaxed-constexpr -lineinfo -Iinclude -Isrc"
for d in $DIMS; do FLAGS="$FLAGS -DFLASHATTN_HDIM_$d=1"; done

t0=$(date +%s)
objs=()
for f in dev/sm80bwd/bwd_dev.cu src/cuda/sm80/bwd_launch.cu src/cuda/sm80/bwd_hdim*.cu src/cpu/reference.cpp; do
  o="$B/$(basename "$f").o"
  objs+=("$o")
  nvcc $FLAGS -Xptxas -v -Xcompiler -fopenmp -c "$f" -o "$o" >"$B/$(basename "$f").log" 2>&1 &
  while [ "$(jobs -r | wc -l)" -ge 16 ]; do sleep 0.2; done
done
wait
nvcc -arch=sm_$ARCH "${objs[@]}" -Xcompiler -fopenmp -o "$B/bwd_dev" 2>&1 | tee "$OUT/link.txt"
echo "build: $(( $(date +%s) - t0 )) s" | tee "$OUT/build.txt"
grep -h -E "error" "$B"/*.log | head -20 | tee -a "$OUT/build.txt"
# ptxas: registers and spills of every main kernel
for f in "$B"/bwd_hdim*.log; do
  echo "$(basename "$f" .cu.log): $(grep -A2 'bwd_main_kernel' "$f" | grep -E 'spill|registers' | tr -s ' ' | tr '\n' ' ')"
done | tee "$OUT/ptxas.txt"
[ -x "$B/bwd_dev" ] || exit 1

if [ "$MODE" = all ] || [ "$MODE" = check ]; then
  "$B/bwd_dev" check 2>&1 | tee "$OUT/check.txt"
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  "$B/bwd_dev" bench 2>&1 | tee "$OUT/bench.txt"
  "$B/bwd_dev" bench-det 2>&1 | tee "$OUT/bench_det.txt"
  timeout 120 python3 dev/sm80bwd/torch_bwd.py 2>&1 | tee "$OUT/torch.txt"
fi
