#!/bin/bash
# One device run for the Hopper backward of head_dim 256 (bwd_wide_kernel, session 69): builds the working tree
# with its GPU tests (and a control's library when CTRL_SRC exists, see dev/build_new_ctrl.sh), runs the GPU
# backward cases of the kernel (TESTS), then times the backward at head_dim 256 through flashattn-sm80 and
# flashattn-sm90 of the same library, bf16, 16k tokens, 8 heads, with cuDNN's backward (torch SDPA through
# autograd) in the same rounds (SHAPES "d,causal,seqlen;..", LIBS name@impl=library,..); SANITIZE, DROPOUT_SHAPES:
# below. Usage (repository root, GPU machine): OUT=$OUT bash dev/sm90/bwd256_check.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/bwd256-check}
CTRL_HEAD_DIMS=${CTRL_HEAD_DIMS:-256}
t0=$SECONDS
. dev/build_new_ctrl.sh
build_new_and_ctrl || exit 1
grep -h "spill" "$OUT/build-new.log" | grep "wide" | sort | uniq >"$OUT/spills.txt"
cat "$OUT/spills.txt"
(cd "$OUT" && tar czf builds.tgz cmake-*.log build-*.log && rm cmake-*.log build-*.log)  # 8 files come back
run_gpu_tests "${TESTS:-*Sm90Backward*d256*:*Sm90Backward*d200*:*Sm90Backward*d232*}" "${TEST_TIMEOUT:-240}"
# SANITIZE: a gtest filter run under compute-sanitizer memcheck and synccheck (SANITIZE_TIMEOUT s each).
run_sanitize "${SANITIZE:-}" "${SANITIZE_TIMEOUT:-120}"
[ "${AB:-1}" = 1 ] || exit 0
SHAPES=${SHAPES:-"256,0,1024;256,0,4096;256,0,16384;256,1,1024;256,1,4096;256,1,16384"}
LIBS=${LIBS:-"sm80@flashattn-sm80=build/libflashattn.so,sm90@flashattn-sm90=build/libflashattn.so"}
echo "## head_dim 256 backward: sm80 vs the wide sm90 kernel (cudnn: torch's cuDNN SDPA backward)"
BWD=1 CUDNN=1 N=${N:-10} timeout "${AB_TIMEOUT:-200}" python3 dev/sm90/fwd_ab.py "$LIBS" "$SHAPES" 2>&1 |
  grep --line-buffered -v -i warn
# DROPOUT_SHAPES: the backward with dropout 0.1 beside torch's SDPA flash backend (FlashAttention-2; ours: auto).
if [ -n "${DROPOUT_SHAPES:-}" ]; then
  echo "## with dropout 0.1 beside torch's SDPA flash backend (ours: auto)"
  timeout 100 python3 dev/sm80fwd/dropout_ab.py build/libflashattn.so "$DROPOUT_SHAPES" 2>&1 | grep -v -i warn
fi
echo "total: $((SECONDS - t0)) s"
