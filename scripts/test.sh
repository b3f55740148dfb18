#!/usr/bin/env bash
# Builds the project and runs the whole test suite: the CTest suite (CUDA tests skip without a
# GPU), the CPU suite again under AddressSanitizer + UndefinedBehaviorSanitizer, and the Python
# binding's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)

echo "== build (Release) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
echo "== tests =="
ctest --test-dir build -j "$jobs" --output-on-failure

echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHATTN_CUDA=OFF -DFLASHATTN_BENCH=OFF \
  -DFLASHATTN_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan -j "$jobs" --output-on-failure

if [ -f bindings/torch/tests/run.sh ]; then
  echo "== python binding =="
  bash bindings/torch/tests/run.sh
fi
