#!/usr/bin/env bash
# One run on the GPU machine's CPU (a Xeon with torch): builds the CPU library (no CUDA) with its
# tests and cpu_bench, checks the AVX-512 code path against the reference (FA2 tests), then times
# our FA2 (cpu_bench) and torch's CPU scaled_dot_product_attention with 2 and 16 threads.
# Logs and JSON go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cpu-compare}
mkdir -p "$OUT"
log() { echo "== $* ($(date -u +%T))" | tee -a "$OUT/summary.txt"; }
{ lscpu; nproc; python3 -c "import torch; print('torch', torch.__version__)"; } >"$OUT/machine.txt" 2>&1
grep -m1 "Model name" "$OUT/machine.txt" | tee -a "$OUT/summary.txt"

log "build (CPU only)"
cfg=(-S . -B build-cpu-xeon -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=OFF -DFLASHATTN_BENCH=ON)
cmake "${cfg[@]}" -DFLASHATTN_TESTS=ON >"$OUT/configure.log" 2>&1 ||
  { log "configure with tests failed (GTest?), without them"; cmake "${cfg[@]}" -DFLASHATTN_TESTS=OFF >>"$OUT/configure.log" 2>&1; }
timeout 150 cmake --build build-cpu-xeon -j16 --target cpu_bench >"$OUT/build.log" 2>&1 || log "cpu_bench build failed"
timeout 120 cmake --build build-cpu-xeon -j16 --target flashattn_tests >"$OUT/build_tests.log" 2>&1 || log "tests build failed"

if [ -x build-cpu-xeon/tests/flashattn_tests ]; then
  log "FA2 / block tests (AVX-512 path)"
  timeout 90 build-cpu-xeon/tests/flashattn_tests --gtest_filter='CpuBlocks*:Softmax*:*Fa2Forward*:*Fa2Backward*' \
    >"$OUT/tests.log" 2>&1
  log "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
fi

for t in 2 16; do
  log "cpu_bench threads $t"
  OMP_NUM_THREADS=$t timeout 60 build-cpu-xeon/bench/cpu_bench --threads "$t" --no-reference --no-memory --reps 7 \
    --json "$OUT/cpu_bench_t$t.json" 2>&1 | tee "$OUT/cpu_bench_t$t.log"
done
# Sensitivity to the cache budget M (FA2 gives the rule's tiles M / 2): 1 MiB and 4 MiB beside the L2 default.
for t in 2 16; do
  for m in 1048576 4194304; do
    log "cpu_bench threads $t cache-bytes $m"
    OMP_NUM_THREADS=$t timeout 60 build-cpu-xeon/bench/cpu_bench --threads "$t" --cache-bytes "$m" --no-reference \
      --no-memory --reps 7 --json "$OUT/cpu_bench_t${t}_m$m.json" >"$OUT/cpu_bench_t${t}_m$m.log" 2>&1
    grep -E "^fa2" "$OUT/cpu_bench_t${t}_m$m.log"
  done
done
log "torch sdpa"
timeout 60 python3 bench/torch_cpu.py --threads 2 16 --json "$OUT/torch_cpu.json" 2>&1 | tee "$OUT/torch_cpu.log"
log "done"
