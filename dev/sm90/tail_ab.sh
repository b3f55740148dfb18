#!/bin/bash
# The Hopper forward's last-round split, one device run (docs/sm90.md, step 29): the working tree
# (build/, head dims 64, 128, 256, with the tests) against a control (build-ctrl/: the sources in
# CTRL_SRC, e.g. `git archive HEAD src include tools CMakeLists.txt` unpacked into the untracked .ctrl/,
# carried), built in parallel. Then: the sm90 forward GPU tests and the split's CPU tests, compute-sanitizer
# (memcheck, racecheck, synccheck) on the split's determinism test, both libraries side by side
# (dev/sm90/fwd_ab.py, SHAPES; ctrl2: the control again, for the spread), and the spill loads / stores of each head_dim 128 forward kernel in the
# SASS. Logs to $OUT. Usage (repository root): CTRL_SRC=.ctrl bash dev/sm90/tail_ab.sh; TESTS: the GPU tests'
# gtest filter; N, ROUNDS: fwd_ab.py's.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/tail-ab}
mkdir -p "$OUT"
CTRL_SRC=${CTRL_SRC:-.ctrl}
SHAPES=${SHAPES:-"128,0,2048;128,0,4096;128,0,8192;128,0,16384;128,0,16384,14;128,0,16384,20;128,0,8192,12;128,1,16384;128,0,1024"}
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/device.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS='64;128;256' \
  -DFLASHATTN_BENCH=OFF >"$OUT/cmake.log" 2>&1 && cmake --build build -j 12 >"$OUT/build.log" 2>&1 &
cmake -S "$CTRL_SRC" -B build-ctrl -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS='128' \
  -DFLASHATTN_TESTS=OFF -DFLASHATTN_BENCH=OFF >"$OUT/cmake-ctrl.log" 2>&1 &&
  cmake --build build-ctrl -j 4 --target flashattn >"$OUT/build-ctrl.log" 2>&1 &
wait
echo "builds: $((SECONDS - t0)) s"
for lib in build/libflashattn.so build-ctrl/libflashattn.so; do
  [ -f $lib ] || { echo "missing $lib"; tail -n 30 "$OUT"/build*.log; exit 1; }
done

build/tests/flashattn_tests --gtest_brief=1 --gtest_filter='TailStream.*:LastRoundSplit.*' >"$OUT/cpu-tests.log" 2>&1
echo "cpu split tests rc=$?"; tail -n 3 "$OUT/cpu-tests.log"
timeout 400 build/tests/flashattn_cuda_tests --gtest_brief=1 --gtest_filter="${TESTS:-*Sm90Forward*:*Sm90Dispatch*}" >"$OUT/tests.log" 2>&1
echo "sm90 forward tests rc=$? ($((SECONDS - t0)) s)"; grep -E "FAILED|PASSED|tests ran" "$OUT/tests.log" | head -20

for tool in memcheck racecheck synccheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/flashattn_cuda_tests --gtest_brief=1 \
    --gtest_filter='Sm90Forward.LastRoundSplitIsDeterministic' >"$OUT/sanitize-$tool.log" 2>&1
  echo "$tool rc=$? ($((SECONDS - t0)) s)"; tail -n 2 "$OUT/sanitize-$tool.log"
done

# ctrl2: the control's library again, under another name: the spread of one build timed twice.
cp build-ctrl/libflashattn.so build-ctrl/libflashattn-2.so
N=${N:-20} python3 dev/sm90/fwd_ab.py ctrl=build-ctrl/libflashattn.so,new=build/libflashattn.so,ctrl2=build-ctrl/libflashattn-2.so \
  "$SHAPES" 2>&1 |
  grep -v -i warn | tee "$OUT/ab.txt"

# Spills in the SASS: local loads / stores per head_dim 128 forward kernel (Traits<128, ...>).
for lib in build/libflashattn.so build-ctrl/libflashattn.so; do
  cuobjdump -sass "$lib" 2>/dev/null | awk -v lib="$lib" '/Function : /{fn=$3} /LDL|STL/{if (fn ~ /fwd_kernelINS1_6TraitsILi128/) c[fn]++}
    END{for (k in c) print lib, c[k], k}'
done | tee "$OUT/spills.txt"
cuobjdump -sass build/libflashattn.so 2>/dev/null | awk '/Function : /{p = ($3 ~ /fwd_kernelINS1_6TraitsILi128ELb1ELi128ELb0ELb0ELi3ELb1E/)} p' \
  >"$OUT/sass-3wg-bf16.txt"
echo "total: $((SECONDS - t0)) s"
# The device tool brings back a few files only: the logs in one archive.
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=ab.txt --exclude=run.txt * && find . -maxdepth 1 -type f \
  ! -name logs.tgz ! -name ab.txt ! -name run.txt -delete)
