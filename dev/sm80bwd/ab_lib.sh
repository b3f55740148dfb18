#!/bin/bash
# Two builds of the library side by side on the GPU machine: the working tree (build/, every head dim)
# and a control (build-ctrl/, head dims 64 and 128): the sources in CTRL_SRC (e.g. `git archive HEAD`
# unpacked into an untracked folder), else the working tree, compiled with CTRL_FLAGS (the dev switches
# of a change off). Runs the sm80 GPU tests on the first (TESTS: gtest filter), then short_profile.py
# for each build in its own process, beside torch's flash backend (SEQLENS; PASSES=fwd or bwd: one pass
# only; PROFILE=0: not). EXTRA="name:flags;name:flags": more builds of the working tree (head dims 64
# and 128) with those CUDA flags, profiled the same way. Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ab-lib}
mkdir -p "$OUT"
CTRL_FLAGS=${CTRL_FLAGS:-}
CTRL_SRC=${CTRL_SRC:-.}
t0=$SECONDS
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS='32;64;96;128;192;256' >"$OUT/cmake.log" 2>&1 &&
  cmake --build build -j 12 >"$OUT/build.log" 2>&1 &
cmake -S "$CTRL_SRC" -B build-ctrl -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS='64;128' \
  -DFLASHATTN_TESTS=OFF -DFLASHATTN_BENCH=OFF -DCMAKE_CUDA_FLAGS="$CTRL_FLAGS" >"$OUT/cmake-ctrl.log" 2>&1 &&
  cmake --build build-ctrl -j 4 --target flashattn >"$OUT/build-ctrl.log" 2>&1 &
libs="new=build/libflashattn.so ctrl=build-ctrl/libflashattn.so"
IFS=';' read -ra extra <<<"${EXTRA:-}"
for spec in "${extra[@]}"; do
  name=${spec%%:*} flags=${spec#*:}
  cmake -S . -B "build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS='64;128' \
    -DFLASHATTN_TESTS=OFF -DFLASHATTN_BENCH=OFF -DCMAKE_CUDA_FLAGS="$flags" >"$OUT/cmake-$name.log" 2>&1 &&
    cmake --build "build-$name" -j 4 --target flashattn >"$OUT/build-$name.log" 2>&1 &
  libs="$libs $name=build-$name/libflashattn.so"
done
wait
echo "builds: $((SECONDS - t0)) s"; tail -n 2 "$OUT"/build*.log
for lib in $libs; do [ -f "${lib#*=}" ] || exit 1; done
if [ -n "${TESTS:-}" ]; then
  timeout 300 build/tests/flashattn_cuda_tests --gtest_brief=1 --gtest_filter="$TESTS" >"$OUT/tests.log" 2>&1
  echo "tests rc=$?"; tail -n 4 "$OUT/tests.log"
fi
[ "${PROFILE:-1}" = 1 ] || exit 0
for lib in $libs; do
  python3 dev/sm80bwd/short_profile.py "$lib" "${SEQLENS:-512,1024,2048}" 2>&1 | grep -v -i warn >>"$OUT/short_profile.txt"
done
grep -E "^d|flash/ours" "$OUT/short_profile.txt"
