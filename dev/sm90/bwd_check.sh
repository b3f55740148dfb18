#!/bin/bash
# Correctness of the backward on the GPU machine: build (all head dims), the whole CUDA test suite,
# compute-sanitizer (memcheck, racecheck, synccheck) on a subset of the Hopper backward cases.
set -u
OUT=${OUT:-/tmp/sm90bwd-check}
mkdir -p "$OUT"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON >"$OUT/build.log" 2>&1 &&
  cmake --build build -j 16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
timeout 400 build/tests/flashattn_cuda_tests --gtest_brief=1 >"$OUT/cuda-tests.log" 2>&1
echo "cuda tests rc=$?"; grep -E "FAILED|PASSED|tests ran" "$OUT/cuda-tests.log" | head -30
for tool in memcheck racecheck synccheck; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=3 timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 \
    build/tests/flashattn_cuda_tests --gtest_brief=1 --gtest_filter='*Sm90Backward*' >"$OUT/san-$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|PASSED' "$OUT/san-$tool.log" | tr '\n' ' ')"
done
echo "total: $(( $(date +%s) - t0 )) s"
