#!/bin/bash
# The forward's last-round split on the GPU machine, one command: build the library and the CUDA tests
# with head_dim 128 (-j 16), run the sm90 forward tests of that head dim and the split's own, memcheck
# and synccheck on the split's test, then dev/sm90/fwd_ab.py: the sweep at head_dim 128 and the tile
# counts of dev/sm90/fwd_waves.py, this build against CTRL (a control build's libflashattn.so, e.g. the
# sources before the change built here and carried). Logs to $OUT.
set -u
OUT=${OUT:-/tmp/tail-split}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/device.log"
t0=$SECONDS
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS='128' \
  -DFLASHATTN_BENCH=OFF >"$OUT/cmake.log" 2>&1 && cmake --build build -j 16 >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
timeout 300 build/tests/flashattn_cuda_tests --gtest_brief=1 \
  --gtest_filter="${TESTS:-*Sm90Forward*d128*:*LastRoundSplit*:*Sm90Dispatch*}" >"$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -n 4 "$OUT/tests.log"
for tool in memcheck synccheck; do
  timeout 200 compute-sanitizer --tool $tool build/tests/flashattn_cuda_tests --gtest_filter='*LastRoundSplit*' \
    >"$OUT/$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/$tool.log" | tr '\n' ' ')"
done
[ -n "${CTRL:-}" ] || exit 0
smi=$(scripts/gpu_clocks.sh start "$OUT/clocks.log")
python3 dev/sm90/fwd_ab.py "ctrl=$CTRL,new=build/libflashattn.so" 2>&1 | grep -v -i warn | tee "$OUT/ab_sweep.txt"
python3 dev/sm90/fwd_ab.py "ctrl=$CTRL,new=build/libflashattn.so" \
  "128,0,16384,12;128,0,16384,14;128,0,16384,16;128,0,16384,20;128,0,16384,23;128,0,8192,16;128,0,4096,16,4;128,0,1024,3,2" \
  2>&1 | grep -v -i warn | tee "$OUT/ab_waves.txt"
kill $smi
echo "clocks: $(scripts/gpu_clocks.sh summary "$OUT/clocks.log")"
