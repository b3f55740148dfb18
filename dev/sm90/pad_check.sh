#!/bin/bash
# One device run for the Hopper forward at head dims between its kernels (session 67: a multiple of 8 up to 256
# zero-padded to the kernel of 64, 128 or 256): builds the working tree with its GPU tests and the control's
# library (CTRL_SRC, default .ctrl: `git archive` of the commit before), runs the GPU cases of TESTS (default the
# Hopper forward's), then times, bf16, 16k tokens:
#   - the padded head dims through the sm80 and the sm90 kernels of the new build, with cuDNN beside them;
#   - the kernels' own head dims, control against new (the epilogue's column guard).
# Usage (repository root, on the GPU machine): OUT=$OUT bash dev/sm90/pad_check.sh   Logs and tables to $OUT.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/pad-check}
CTRL_HEAD_DIMS='64;128;256'
t0=$SECONDS
. dev/build_new_ctrl.sh
build_new_and_ctrl || exit 1
grep -h "spill" "$OUT/build-new.log" | grep -i "sm90" | sort | uniq | head -30 >"$OUT/spills.txt"
run_gpu_tests "${TESTS:-*Sm90Forward*:*Sm90Dispatch*}" "${TEST_TIMEOUT:-240}"
[ "${AB:-1}" = 1 ] || exit 0
lib=build/libflashattn.so
ab() { timeout "${AB_TIMEOUT:-150}" python3 "$@" 2>&1 | grep --line-buffered -v -i warn; }
shapes() {  # the head dims $1, causal and not, at the seqlens $2
  local out=""
  for d in $1; do for c in 0 1; do for s in $2; do out+="$d,$c,$s;"; done; done; done
  echo "${out%;}"
}
echo "## padded head dims: sm80 and sm90 kernels of the new build, cuDNN (forward)"
CUDNN=1 N=10 ab dev/sm90/fwd_ab.py "sm80@flashattn-sm80=$lib,sm90@flashattn-sm90=$lib" \
  "$(shapes "${PAD_DIMS:-32 48 80 96 112 160 192 224}" "${PAD_SEQLENS:-1024 4096}")"
echo "## the kernels' head dims: ctrl vs new (sm90 forward)"
N=10 ab dev/sm90/fwd_ab.py "ctrl=build-ctrl/libflashattn.so,new=$lib" "${CTRL_SHAPES:-$(shapes "64 128 256" "512 4096 16384")}"
echo "total: $((SECONDS - t0)) s"
