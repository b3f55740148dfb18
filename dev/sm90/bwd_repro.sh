#!/bin/bash
# One failing backward case on several builds (the control in .ctrl and variants of the working tree):
# the seed that failed, then REPEAT fresh seeds, then racecheck / synccheck on the seed (first variant).
# SKIP_CTRL=1: no control build.
# Usage: CASE='Standard/Sm90Backward.MatchesReference/...' SEED=... VARIANTS='prod=;p40=-D...' bash dev/sm90/bwd_repro.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/bwd-repro}; mkdir -p "$OUT"
t0=$SECONDS
build() {  # name source flags
  cmake -S "$2" -B "build-$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS="${HEAD_DIMS:-64}" \
    -DFLASHATTN_TESTS=ON -DFLASHATTN_BENCH=OFF -DCMAKE_CUDA_FLAGS="$3" >"$OUT/cmake-$1.log" 2>&1 &&
    cmake --build "build-$1" -j 6 --target flashattn_cuda_tests >"$OUT/build-$1.log" 2>&1
}
names=
[ -n "${SKIP_CTRL:-}" ] || { names=ctrl; build ctrl .ctrl "" & }
IFS=';' read -ra specs <<<"$VARIANTS"
for spec in "${specs[@]}"; do build "${spec%%=*}" . "${spec#*=}" & names="$names ${spec%%=*}"; done
wait
echo "builds: $((SECONDS - t0)) s"
for n in $names; do
  bin=build-$n/tests/flashattn_cuda_tests
  [ -x $bin ] || { echo "missing $bin"; tail -n 20 "$OUT/build-$n.log"; continue; }
  FA_TEST_SEED=$SEED $bin --gtest_brief=1 --gtest_filter="$CASE" >"$OUT/seed-$n.log" 2>&1
  echo "$n seed rc=$? $(grep -m1 -E 'dq:|dk:|dv:' "$OUT/seed-$n.log" | cut -c1-150)"
  timeout ${REPEAT_TIMEOUT:-60} $bin --gtest_brief=1 --gtest_repeat=${REPEAT:-10} --gtest_filter="${REPEAT_FILTER:-$CASE}" >"$OUT/repeat-$n.log" 2>&1
  echo "$n repeat rc=$? failed: $(grep -c '^\[  FAILED  \].*MatchesReference' "$OUT/repeat-$n.log") of $(grep -c 'tests ran' "$OUT/repeat-$n.log") rounds ($((SECONDS - t0)) s)"
done
first=${specs[0]%%=*}
for tool in ${SANITIZE_TOOLS:-}; do
  FA_TEST_SEED=$SEED timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 build-$first/tests/flashattn_cuda_tests --gtest_brief=1 \
    --gtest_filter="$CASE" >"$OUT/sanitize-$tool.log" 2>&1
  echo "$tool rc=$? ($((SECONDS - t0)) s)"; grep -m3 -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Warning" "$OUT/sanitize-$tool.log"
done
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz * && find . -maxdepth 1 -type f ! -name logs.tgz -delete)
