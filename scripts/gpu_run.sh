#!/usr/bin/env bash
# The one command for the GPU machine: build with CUDA, run the GPU tests, compute-sanitizer on a
# subset, the Python binding's tests on CUDA tensors, and the side-by-side benchmark. Logs and
# JSON go to $OUT (the device tool brings that folder back); a short summary is printed last.
#
#   STAGES=build,test,sanitize,python,bench  (default: all; gpu-test: the GPU cases only)   QUICK=1: the benchmark's short sweep
#   HEAD_DIMS="64;128"                         prune the CUDA instantiations for a faster build
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
STAGES=${STAGES:-build,test,sanitize,python,bench}
HEAD_DIMS=${HEAD_DIMS:-32;64;96;128;192;256}
summary="$OUT/summary.txt"
: >"$summary"
has() { [[ ",$STAGES," == *",$1,"* ]]; }
note() { echo "$*" | tee -a "$summary"; }
run_stage() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "$name: rc=$rc ($((SECONDS - t0)) s)"
  tail -n 15 "$OUT/$name.log" | sed "s/^/  [$name] /"
  return $rc
}

# The GPU cases in CUDA_SHARDS processes at once (default 4, the cores split among them): their fp64
# references on the CPU take most of the time (one process: ~420 s on an H100 machine's 16 cores, 979
# cases; 4 shards: 234 s, 997 cases).
cuda_tests() {
  local n=${CUDA_SHARDS:-4} rc=0 pids=()
  for ((i = 0; i < n; ++i)); do
    OMP_NUM_THREADS=$(($(nproc) / n > 0 ? $(nproc) / n : 1)) GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i \
      build/tests/flashattn_cuda_tests --gtest_brief=1 \
      >"$OUT/cuda-tests-$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for ((i = 0; i < n; ++i)); do echo "== shard $i of $n"; cat "$OUT/cuda-tests-$i.log"; done
  rm -f "$OUT"/cuda-tests-[0-9]*.log
  return $rc
}

note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $(date -u +%FT%TZ)"

if has build; then
  run_stage build bash -c "cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
      -DFLASHATTN_CUDA_HEAD_DIMS='$HEAD_DIMS' && cmake --build build -j 16" || { cat "$summary"; exit 1; }
fi
if has test; then
  run_stage cpu-tests ctest --test-dir build -j 16 -E cuda_tests --output-on-failure || true
fi
if has test || has gpu-test; then
  run_stage cuda-tests cuda_tests || true
fi
# compute-sanitizer's three tools on two sets of GPU cases, every tool run even after one reports (each case's
# name is printed before its reports): a shard (an even spread over every suite), and the sm90 forward cases with
# more tiles than 2 x 132 SMs, where a CTA reuses a q buffer and its tile plan (the shard may hold none of them).
sanitize() {
  local rc=0 tool
  local reuse='Standard/Sm90Forward.*bf16_d128_h16_1_b2_sq1200_sk100:Standard/Sm90Forward.*bf16_d128_h16_4_b4_sq1000_sk500'
  reuse+=':Standard/Sm90Forward.*bf16_d128_h12_3_b3_sq900_sk600_scale8:Standard/Sm90Forward.*bf16_d256_h16_4_b4_sq640_sk1000*'
  reuse+=':Standard/Sm90Forward.*bf16_d64_h10_2_b8_sq512_sk512_causal'
  # racecheck credits an mbarrier arrival with the arriving thread's own reads only: it runs on a build whose
  # consumer threads each release the tile plans they read (FLASHATTN_SM90_PLAN_RELEASE_EVERY, params.cuh).
  echo "== racecheck's build"
  cmake -S . -B build-racecheck -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_BENCH=OFF \
    -DFLASHATTN_CUDA_HEAD_DIMS="$HEAD_DIMS" -DCMAKE_CUDA_FLAGS=-DFLASHATTN_SM90_PLAN_RELEASE_EVERY=1 >/dev/null &&
    cmake --build build-racecheck -j 16 --target flashattn_cuda_tests | tail -n 1 || rc=1
  for tool in memcheck racecheck synccheck; do
    local tests=build/tests/flashattn_cuda_tests
    [ $tool = racecheck ] && tests=build-racecheck/tests/flashattn_cuda_tests
    echo "== $tool, shard 3 of 25"
    GTEST_TOTAL_SHARDS=25 GTEST_SHARD_INDEX=3 compute-sanitizer --tool $tool --error-exitcode 9 $tests || rc=1
    echo "== $tool, q buffers reused"
    compute-sanitizer --tool $tool --error-exitcode 9 $tests --gtest_filter="$reuse" || rc=1
  done
  return $rc
}
if has sanitize; then
  run_stage sanitize sanitize || true
fi
if has python && [ -f bindings/torch/tests/run.sh ]; then
  run_stage python env FLASHATTN_LIBRARY="$PWD/build/libflashattn.so" bash bindings/torch/tests/run.sh || true
fi
if has bench; then
  quick=${QUICK:+--quick}
  smi=$(scripts/gpu_clocks.sh start "$OUT/clocks.log")  # the clock and power through the benchmark
  run_stage bench python3 bench/gpu_bench.py --lib build/libflashattn.so --out "$OUT/h100.json" $quick || true
  kill $smi 2>/dev/null
  echo "bench: $(scripts/gpu_clocks.sh summary "$OUT/clocks.log")" | tee -a "$summary"
  python3 bench/report.py "$OUT/h100.json" --md "$OUT/h100.md" >/dev/null 2>&1 && cat "$OUT/h100.md" | tee -a "$summary"
fi
echo "== summary"; grep -v '^|' "$summary"
# The device tool brings back a few files only: the logs in one archive, results and summary beside.
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz *.log && rm -f *.log)
