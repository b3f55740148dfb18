# Sourced by the one-run device scripts (dev/sm90/dropout_check.sh, dev/sm80bwd/hdim256_check.sh), from the
# repository root with OUT set: prints the device and the control's commit, then builds side by side the working
# tree with its GPU tests (build/) and the control's library (the sources in CTRL_SRC, default .ctrl: `git
# archive` of the commit compared with, unpacked, its commit in .ctrl/REV; build-ctrl/, head dims
# CTRL_HEAD_DIMS; none without CTRL_SRC). Returns 1 when the tests did not build.
CTRL_SRC=${CTRL_SRC:-.ctrl}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/device.txt"
echo "ctrl: $CTRL_SRC at $(cat "$CTRL_SRC/REV" 2>/dev/null || echo 'an unrecorded commit')" | tee -a "$OUT/device.txt"
build_new_and_ctrl() {
  local t0=$SECONDS
  (cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_TESTS=ON -DFLASHATTN_BENCH=OFF \
     >"$OUT/cmake-new.log" 2>&1 && cmake --build build -j 12 --target flashattn flashattn_cuda_tests >"$OUT/build-new.log" 2>&1
   echo "new build rc=$?") &
  [ -d "$CTRL_SRC" ] && (cmake -S "$CTRL_SRC" -B build-ctrl -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
     -DFLASHATTN_CUDA_HEAD_DIMS="$CTRL_HEAD_DIMS" -DFLASHATTN_TESTS=OFF -DFLASHATTN_BENCH=OFF >"$OUT/cmake-ctrl.log" 2>&1 &&
     cmake --build build-ctrl -j 4 --target flashattn >"$OUT/build-ctrl.log" 2>&1
   echo "ctrl build rc=$?") &
  wait
  echo "builds: $((SECONDS - t0)) s"
  [ -f build/tests/flashattn_cuda_tests ] || { tail -n 40 "$OUT/build-new.log"; return 1; }
}
# The GPU tests of a gtest filter under a timeout (s), in SHARDS gtest shards side by side (default 8: the fp64
# references on the host's cores set the pace; 8 ran the 471 Hopper forward cases in 103 s, one process about
# 200 in 300 s), logged to $OUT/tests.log, with a summary.
run_gpu_tests() {  # filter timeout
  local shards=${SHARDS:-8} i
  for ((i = 0; i < shards; ++i)); do
    # The cores split among the shards (as scripts/gpu_run.sh does): OpenMP threads spinning past them slow the rest.
    OMP_NUM_THREADS=$(($(nproc) / shards > 0 ? $(nproc) / shards : 1)) GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
      timeout "$2" build/tests/flashattn_cuda_tests \
      --gtest_filter="$1" >"$OUT/tests-$i.log" 2>&1 &
  done
  wait
  echo "tests: $(cat "$OUT"/tests-*.log | grep -c '^\[       OK \]') passed, $(cat "$OUT"/tests-*.log |
    grep -c '^\[  FAILED  \].*(') failed, of $(cat "$OUT"/tests-*.log | grep -o 'Running [0-9]* tests' |
    awk '{n += $2} END {print n}')"
  grep -h -E -A12 "Failure" "$OUT"/tests-*.log | head -40
  cat "$OUT"/tests-*.log >"$OUT/tests.log" && rm "$OUT"/tests-*.log  # one file back ($OUT: 8 at most)
}
# The GPU tests of a gtest filter (none: nothing runs) under compute-sanitizer memcheck and synccheck, each under
# a timeout (s), logged to $OUT/sanitize-<tool>.log.
run_sanitize() {  # filter timeout
  local tool
  for tool in ${1:+memcheck synccheck}; do
    timeout "$2" compute-sanitizer --tool $tool --error-exitcode 9 build/tests/flashattn_cuda_tests \
      --gtest_brief=1 --gtest_filter="$1" >"$OUT/sanitize-$tool.log" 2>&1
    echo "$tool rc=$? ($((SECONDS - t0)) s)"; tail -n 3 "$OUT/sanitize-$tool.log"
  done
}
