#!/bin/bash
# A/B of Hopper backward kernel variants on the GPU machine: each dev/sm90/ab/<name>.cuh (copies of
# the kernel with one change each, not kept in the repository) replaces
# src/cuda/sm90/bwd_kernel.cuh in turn (incremental build, head dims 64 and 128), then the sm90
# backward tests and the backward sweep (sm90 only; torch flash once). The working copy is restored.
set -u
OUT=${OUT:-/tmp/sm90ab-out}
mkdir -p "$OUT"
cp src/cuda/sm90/bwd_kernel.cuh "$OUT/orig.cuh"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS='64;128' >/dev/null 2>&1
for v in ${VARIANTS:-$(ls dev/sm90/ab/*.cuh | xargs -n1 basename | sed 's/.cuh//')}; do
  cp dev/sm90/ab/$v.cuh src/cuda/sm90/bwd_kernel.cuh
  t0=$(date +%s)
  cmake --build build -j 16 >"$OUT/build-$v.log" 2>&1 || { echo "$v: build failed"; tail -5 "$OUT/build-$v.log"; continue; }
  echo "== $v build $(( $(date +%s) - t0 )) s $(grep -ho 'C75[0-9]*' "$OUT/build-$v.log" | sort -u | tr '\n' ' ')"
  timeout 200 build/tests/flashattn_cuda_tests --gtest_brief=1 --gtest_filter="${FILTER:-*Sm90Backward*}" >"$OUT/tests-$v.log" 2>&1
  echo "tests rc=$? $(grep -E 'PASSED|FAILED  \] [0-9]' "$OUT/tests-$v.log" | tr '\n' ' ')"
  timeout 200 python3 bench/gpu_bench.py --lib build/libflashattn.so --out "$OUT/bwd-$v.json" ${QUICK:+--quick} --head-dims 64,128 \
    --passes bwd --impls flashattn-sm90 2>&1 | grep -v classic | sed "s/^/$v /"
done
cp "$OUT/orig.cuh" src/cuda/sm90/bwd_kernel.cuh
