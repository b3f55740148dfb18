#!/bin/bash
# One device run for the sm80 backward at head_dim 256 (session 66: the 2D kernel with one q, dO buffer in place
# of the d-split 1D kernel): builds the working tree with its GPU tests and the control's library (CTRL_SRC,
# default .ctrl: `git archive` of the commit before; head_dim 256 only), runs the GPU backward cases at the kernel
# head_dim 256 (TESTS), then times the backward, control against new, bf16, 16k tokens, 8 heads, with cuDNN's
# backward in the same rounds. Usage (repository root, GPU machine): OUT=$OUT bash dev/sm80bwd/hdim256_check.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/hdim256-check}
CTRL_HEAD_DIMS=256
t0=$SECONDS
. dev/build_new_ctrl.sh
build_new_and_ctrl || exit 1
grep -h "spill" "$OUT/build-new.log" | grep "Li256E" | sort | uniq >"$OUT/spills.txt"
run_gpu_tests "${TESTS:-*Backward*_d256_*:*Backward*_d200_*:*Sm80Dropout*}" "${TEST_TIMEOUT:-240}"
[ "${AB:-1}" = 1 ] && [ -f build-ctrl/libflashattn.so ] || exit 0
SHAPES=${SHAPES:-"256,0,1024;256,0,4096;256,0,16384;256,1,1024;256,1,4096;256,1,16384"}
echo "## head_dim 256 backward, sm80 kernels: ctrl vs new (cudnn: torch's cuDNN SDPA backward)"
IMPL=flashattn-sm80 BWD=1 CUDNN=1 N=10 timeout 200 python3 dev/sm90/fwd_ab.py \
  "ctrl=build-ctrl/libflashattn.so,new=build/libflashattn.so" "$SHAPES" 2>&1 | grep --line-buffered -v -i warn
echo "## with dropout 0.1 beside torch's SDPA flash backend (ours: auto)"
timeout 100 python3 dev/sm80fwd/dropout_ab.py build/libflashattn.so "256,0,4096;256,1,4096" 2>&1 | grep -v -i warn
echo "total: $((SECONDS - t0)) s"
