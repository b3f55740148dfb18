#!/bin/bash
# One device run for the Hopper forward at head dims between its kernels (session 67: a multiple of 8 up to 256
# zero-padded to the next kernel; session 68: a kernel of 192): builds the working tree with its GPU tests and the
# control's library (CTRL_SRC, default .ctrl: `git archive` of the commit before; its head dims CTRL_HEAD_DIMS),
# and VARIANTS beside them (';'-separated "name=-DFLASHATTN_SM90_X=v ...", the flags to nvcc; head dims
# VARIANT_HEAD_DIMS, default 192), runs the GPU cases of TESTS (default the Hopper forward's) in gtest shards, then
# times, bf16, 16k tokens:
#   - the padded head dims (PAD_DIMS at PAD_SEQLENS) through the sm80 and the sm90 kernels of the new build, the
#     control's sm90 forward, the variants, and cuDNN beside them;
#   - the kernels' own head dims, control against new (CTRL_SHAPES);
# before the timings, the GPU cases of SANITIZE under compute-sanitizer memcheck and synccheck.
# Usage (repository root, on the GPU machine): OUT=$OUT bash dev/sm90/pad_check.sh   Logs and tables to $OUT.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pad-check}
CTRL_HEAD_DIMS=${CTRL_HEAD_DIMS:-'64;128;192;256'}
t0=$SECONDS
. dev/build_new_ctrl.sh
variant_libs=""
IFS=';' read -ra specs <<<"${VARIANTS:-}"
for spec in "${specs[@]}"; do
  name=${spec%%=*}
  (cmake -S . -B "build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_TESTS=OFF \
     -DFLASHATTN_BENCH=OFF -DFLASHATTN_CUDA_HEAD_DIMS="${VARIANT_HEAD_DIMS:-192}" -DCMAKE_CUDA_FLAGS="${spec#*=}" \
     >"$OUT/cmake-$name.log" 2>&1 && cmake --build "build-$name" -j 3 --target flashattn >"$OUT/build-$name.log" 2>&1
   echo "$name build rc=$?") &
  variant_libs+=",$name=build-$name/libflashattn.so"
done
build_new_and_ctrl || exit 1
grep -h "spill" "$OUT/build-new.log" | grep -i "sm90" | sort | uniq | head -30 >"$OUT/spills.txt"
(cd "$OUT" && tar czf builds.tgz cmake-*.log build-*.log && rm cmake-*.log build-*.log)  # 8 files come back
run_gpu_tests "${TESTS:-*Sm90Forward*:*Sm90Dispatch*}" "${TEST_TIMEOUT:-240}"
echo "tests done: $((SECONDS - t0)) s"
# SANITIZE: a gtest filter run under compute-sanitizer memcheck and synccheck (SANITIZE_TIMEOUT s each).
run_sanitize "${SANITIZE:-}" "${SANITIZE_TIMEOUT:-120}"
[ "${AB:-1}" = 1 ] || exit 0
lib=build/libflashattn.so
ab() { timeout "${AB_TIMEOUT:-150}" python3 "$@" 2>&1 | grep --line-buffered -v -i warn; }
shapes() {  # the head dims $1, causal and not, at the seqlens $2
  local out=""
  for d in $1; do for c in 0 1; do for s in $2; do out+="$d,$c,$s;"; done; done; done
  echo "${out%;}"
}
echo "## padded head dims: sm80 and sm90 kernels of the new build, the control's sm90, variants, cuDNN (forward)"
CUDNN=1 N=10 ab dev/sm90/fwd_ab.py \
  "sm90@flashattn-sm90=$lib,sm80@flashattn-sm80=$lib,ctrl@flashattn-sm90=build-ctrl/libflashattn.so$variant_libs" \
  "$(shapes "${PAD_DIMS:-32 48 80 96 112 160 192 224}" "${PAD_SEQLENS:-1024 4096}")"
echo "## the kernels' head dims: ctrl vs new (sm90 forward; ctrl2: the control's library again, the spread)"
cp build-ctrl/libflashattn.so build-ctrl/libflashattn-2.so
N=10 ab dev/sm90/fwd_ab.py "ctrl=build-ctrl/libflashattn.so,ctrl2=build-ctrl/libflashattn-2.so,new=$lib" \
  "${CTRL_SHAPES:-$(shapes "64 128 256" "512 4096 16384")}"
echo "total: $((SECONDS - t0)) s"
