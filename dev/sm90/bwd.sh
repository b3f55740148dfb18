#!/bin/bash
# Hopper backward on the GPU machine in one call: build (head dims 64 and 128), the sm90 backward
# GPU tests, then the backward sweep of flashattn-sm90 beside flashattn-sm80, torch flash and cuDNN.
#   FILTER: gtest filter (default the sm90 backward suites)   IMPLS, SEQ (QUICK=1: 2k and 16k)
set -u
OUT=${OUT:-/tmp/sm90bwd-out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/device.log"
t0=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS='64;128' \
  >"$OUT/build.log" 2>&1 && cmake --build build -j 16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep -h "spill" "$OUT/build.log" | sort -u | sed 's/^/  /'
echo "build: $(( $(date +%s) - t0 )) s"
timeout 300 build/tests/flashattn_cuda_tests --gtest_brief=1 --gtest_filter="${FILTER:-*Sm90Backward*}" \
  >"$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "FAILED|PASSED|Failure|error" "$OUT/tests.log" | head -40
quick=${QUICK:+--quick}
timeout 400 python3 bench/gpu_bench.py --lib build/libflashattn.so --out "$OUT/bwd.json" $quick --head-dims 64,128 \
  --passes bwd --impls "${IMPLS:-flashattn-sm90,flashattn-sm80,torch-flash,torch-cudnn}" 2>&1 | tee "$OUT/bench.log" | grep -v "^  classic"
echo "total: $(( $(date +%s) - t0 )) s"
