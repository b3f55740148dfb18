#!/bin/bash
# Builds of the working tree that differ in dev switches (params.cuh), against a control, side by side on
# the Hopper forward in one device run (HEAD_DIMS, default 128): for exploring, before tail_ab.sh
# checks the winner. VARIANTS: ';'-separated "name=-DFLASHATTN_SM90_X=v -D..." (the flags go to nvcc);
# the control: the sources in CTRL_SRC (e.g. `git archive HEAD src include tools CMakeLists.txt` unpacked
# into the untracked .ctrl/, carried; ctrl2: the same library again; `git rev-parse --short HEAD > .ctrl/REV` records
# which commit it is, printed first: a control left from before a commit is easy to miss). SHAPES, N, ROUNDS:
# dev/sm90/fwd_ab.py's.
# TESTS: a gtest filter of the GPU tests, built and run for the variants named in TESTED (default: the first;
# name only the head dims built, e.g. 'Standard/Sm90Forward.*_d128_*': the others fail; the 184 head_dim 64
# and 128 sm90 forward cases take ~200 s on an H100, their fp64 references on the CPU most of it; TEST_TIMEOUT, default 300 s);
# SANITIZE: one run under the sanitizers (needs TESTS; the first tested variant). AB: the timing script (default
# dev/sm90/fwd_ab.py; dev/sm80fwd/decode_ab.py takes the same arguments, its own SHAPES). Logs to $OUT.
# Usage (repository root): VARIANTS='new=;noqregs=-DFLASHATTN_SM90_Q_REGS=0' bash dev/sm90/variants_ab.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/variants-ab}
mkdir -p "$OUT"
CTRL_SRC=${CTRL_SRC:-.ctrl}
SHAPES=${SHAPES:-"128,0,8192,16,2;128,0,16384,16,1;128,0,8192,12,2;128,0,4096,16,4"}
VARIANTS=${VARIANTS:-"new="}
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/device.txt"
echo "ctrl: $CTRL_SRC at $(cat "$CTRL_SRC/REV" 2>/dev/null || echo 'an unrecorded commit')" | tee -a "$OUT/device.txt"
build() {  # name source flags [tests]
  local tests=${4:-OFF} target=flashattn
  [ "$tests" = ON ] && target=flashattn_cuda_tests
  cmake -S "$2" -B "build-$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS="${HEAD_DIMS:-128}" \
    -DFLASHATTN_TESTS=$tests -DFLASHATTN_BENCH=OFF -DCMAKE_CUDA_FLAGS="$3" >"$OUT/cmake-$1.log" 2>&1 &&
    cmake --build "build-$1" -j 4 --target $target >"$OUT/build-$1.log" 2>&1
}
build ctrl "$CTRL_SRC" "" &
libs="ctrl=build-ctrl/libflashattn.so"
IFS=';' read -ra specs <<<"$VARIANTS"
TESTED=${TESTED:-${specs[0]%%=*}}
for spec in "${specs[@]}"; do
  name=${spec%%=*}
  build "$name" . "${spec#*=}" $([ -n "${TESTS:-}" ] && [[ " $TESTED " == *" $name "* ]] && echo ON) &
  libs="$libs,$name=build-$name/libflashattn.so"
done
wait
echo "builds: $((SECONDS - t0)) s"
for lib in $(echo "$libs" | tr ',' '\n' | cut -d= -f2); do
  [ -f "$lib" ] || { echo "missing $lib"; tail -n 30 "$OUT"/build-*.log; exit 1; }
done
# TESTS: a gtest filter of the GPU tests, run on each tested variant's build.
for name in ${TESTS:+$TESTED}; do
  # Every case's line (not --gtest_brief): a run cut by TEST_TIMEOUT still tells how many passed.
  timeout ${TEST_TIMEOUT:-300} "build-$name/tests/flashattn_cuda_tests" --gtest_filter="$TESTS" >"$OUT/tests-$name.log" 2>&1
  echo "tests ($name, $TESTS) rc=$? ($((SECONDS - t0)) s): $(grep -c '^\[       OK \]' "$OUT/tests-$name.log") passed"
  grep -E "^\[  FAILED  \]|PASSED|tests ran" "$OUT/tests-$name.log" | head -20
done
# SANITIZE: a gtest filter run under compute-sanitizer memcheck, racecheck and synccheck (the first tested variant).
first=${TESTED%% *}
for tool in ${SANITIZE:+memcheck racecheck synccheck}; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 "build-$first/tests/flashattn_cuda_tests" --gtest_brief=1 \
    --gtest_filter="$SANITIZE" >"$OUT/sanitize-$tool.log" 2>&1
  echo "$tool rc=$? ($((SECONDS - t0)) s)"; tail -n 2 "$OUT/sanitize-$tool.log"
done
# ctrl2: the control's library again, under another name: the spread of one build timed twice.
cp build-ctrl/libflashattn.so build-ctrl/libflashattn-2.so
libs="$libs,ctrl2=build-ctrl/libflashattn-2.so"
# Line-buffered, and under AB_TIMEOUT (s): a run cut short still returns the shapes timed so far.
N=${N:-20} timeout ${AB_TIMEOUT:-900} python3 "${AB:-dev/sm90/fwd_ab.py}" "$libs" "$SHAPES" 2>&1 | grep --line-buffered -v -i warn |
  tee "$OUT/ab.txt"
echo "total: $((SECONDS - t0)) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=ab.txt * && find . -maxdepth 1 -type f \
  ! -name logs.tgz ! -name ab.txt -delete)
