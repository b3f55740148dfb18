#!/usr/bin/env bash
# One GPU-machine run for the CLI helper: (1) the standalone check and timing of the CUDA standard
# attention (dev/cli/standard_check.cu, needs only standard.cu and the CPU reference), then, when
# the whole library builds, (2) the GPU tests of cuda-standard, (3) `flashattn run --device cuda`
# on the classic problem and a few variants, (4) a short `flashattn bench`, (5) the CLI's CPU tests.
# Logs go to $OUT. STEPS=check,build,tests,run,bench,cli (default: all).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cli-out}
mkdir -p "$OUT"
STEPS=${STEPS:-check,build,tests,run,bench,cli}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
log() { echo "== $* ($(date -u +%T))" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if has check; then
  log "standard_check build"
  nvcc -O2 -std=c++20 -arch=sm_90 -I include -I src -Xcompiler -fopenmp --expt-relaxed-constexpr -diag-suppress 20012 \
    dev/cli/standard_check.cu src/cuda/standard.cu src/cpu/reference.cpp -lcublas -o "$OUT/standard_check" >"$OUT/check_build.log" 2>&1
  log "standard_check run (rc of build $?)"
  timeout 60 "$OUT/standard_check" 2>&1 | tee "$OUT/check.log"
  if command -v compute-sanitizer >/dev/null; then
    log "standard_check --small under compute-sanitizer memcheck"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$OUT/standard_check" --small >"$OUT/memcheck.log" 2>&1
    log "memcheck rc=$?"
    tail -n 3 "$OUT/memcheck.log"
  fi
  rm -f "$OUT/standard_check"
fi

built=0
if has build; then
  log "library + CLI + CUDA tests build"
  gen=""; command -v ninja >/dev/null && gen="-G Ninja"
  cfg=(-S . -B build $gen -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS="${HEAD_DIMS:-64}" -DFLASHATTN_BENCH=OFF)
  # CMake 3.25 knows no C++20 dialect for nvcc: then name its flag (and say so).
  cmake "${cfg[@]}" >"$OUT/configure.log" 2>&1 ||
    { log "configure failed; retrying with an explicit C++20 flag for nvcc"; rm -rf build; cmake "${cfg[@]}" -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 >"$OUT/configure.log" 2>&1; } &&
    timeout "${BUILD_TIMEOUT:-170}" cmake --build build -j 16 --target flashattn_cli flashattn_cuda_tests >"$OUT/build.log" 2>&1 &&
    built=1
  log "build ok=$built"
  [ $built = 1 ] || { grep -E "error|Error" "$OUT/configure.log" "$OUT/build.log" | head -30; }
fi

if [ $built = 1 ]; then
  if has tests; then
    log "GPU tests of cuda-standard"
    timeout 60 build/tests/flashattn_cuda_tests --gtest_filter='*CudaStandard*' --gtest_brief=1 >"$OUT/tests.log" 2>&1
    log "tests rc=$?"
    tail -n 25 "$OUT/tests.log"
  fi
  if has run; then
    log "flashattn run --device cuda (classic problem)"
    timeout 60 build/tools/flashattn run --device cuda 2>&1 | tee "$OUT/run_classic.log"
    log "rc=${PIPESTATUS[0]}"
    timeout 60 build/tools/flashattn run --device cuda --dtype bf16 --batch 4 --seqlen 2048 --heads 16 --heads-kv 4 \
      --head-dim 128 --no-causal --window-left 256 --window-right 0 --softcap 30 --layout bhsd 2>&1 | tee "$OUT/run_variant.log"
    log "rc=${PIPESTATUS[0]}"
    timeout 60 build/tools/flashattn run --device cuda --batch 1 --seqlen 8192 --heads 4 --head-dim 64 --impl standard,fa2 \
      2>&1 | tee "$OUT/run_8k.log"
    log "rc=${PIPESTATUS[0]}"
  fi
  if has bench; then
    log "flashattn bench --device cuda"
    timeout 60 build/tools/flashattn bench --device cuda --seqlens 512,2048 --head-dims 64 --causal both --pass fwd,bwd \
      --impl standard,sm80 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
    log "rc=${PIPESTATUS[0]}"
  fi
fi
if has cli && [ -x build/tools/flashattn ]; then
  log "CLI end-to-end tests (CPU)"
  timeout 120 bash tools/tests/cli_test.sh build/tools/flashattn /tmp/cli_test 2>&1 | tail -n 5
fi
log "done"
