#!/bin/bash
# One device run for dropout in the Hopper kernels and the softcap's tanh.approx (session 66): builds the working
# tree with its GPU tests and the control's library (the sources in CTRL_SRC, default .ctrl: `git archive` of the
# commit before, which takes dropout to sm80 and caps with tanhf), runs the GPU cases of TESTS (default every
# dropout and softcap case), then times, bf16, 16k tokens:
#   - dropout 0.1 through the sm80 and the sm90 kernels of the new build (forward, then backward at d64 / d128);
#   - the same beside torch's SDPA flash backend (FlashAttention-2) with dropout (dev/sm80fwd/dropout_ab.py);
#   - softcap 30, control (tanhf) against new (tanh.approx): the sm90 forward, the sm80 forward and backward.
# Usage (repository root, on the GPU machine): OUT=$OUT bash dev/sm90/dropout_check.sh   Logs and tables to $OUT.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dropout-check}
CTRL_HEAD_DIMS='64;128'
t0=$SECONDS
. dev/build_new_ctrl.sh
build_new_and_ctrl || exit 1
grep -h "spill" "$OUT/build-new.log" | grep -i "sm90\|Lb1E" | sort | uniq | head -20 >"$OUT/spills.txt"
run_gpu_tests "${TESTS:-*ropout*:*oftcap*}" "${TEST_TIMEOUT:-300}"
[ "${AB:-1}" = 1 ] || exit 0
lib=build/libflashattn.so
ab() { timeout "${AB_TIMEOUT:-120}" python3 "$@" 2>&1 | grep --line-buffered -v -i warn; }
echo "## dropout 0.1: the sm80 and sm90 kernels of the new build, forward"
DROPOUT=0.1 N=10 ab dev/sm90/fwd_ab.py "sm80@flashattn-sm80=$lib,sm90@flashattn-sm90=$lib" \
  "64,0,4096;64,1,4096;128,0,4096;128,1,4096;128,1,16384;256,0,4096;256,1,4096"
echo "## dropout 0.1: backward"
BWD=1 DROPOUT=0.1 N=10 ab dev/sm90/fwd_ab.py "sm80@flashattn-sm80=$lib,sm90@flashattn-sm90=$lib" \
  "64,0,4096;64,1,4096;128,0,4096;128,1,4096;128,1,16384"
echo "## dropout 0.1 beside torch's SDPA flash backend (ours: auto)"
ab dev/sm80fwd/dropout_ab.py "$lib" "64,0,4096;64,1,4096;128,0,4096;128,1,4096;128,1,16384;256,0,4096"
if [ -f build-ctrl/libflashattn.so ]; then
  echo "## softcap 30: tanhf (ctrl) vs tanh.approx (new); sm90 forward"
  SOFTCAP=30 N=10 ab dev/sm90/fwd_ab.py "ctrl=build-ctrl/libflashattn.so,new=$lib" \
    "64,0,4096;64,1,4096;128,0,4096;128,1,4096;128,0,16384"
  echo "## softcap 30: sm80 forward"
  IMPL=flashattn-sm80 SOFTCAP=30 N=10 ab dev/sm90/fwd_ab.py "ctrl=build-ctrl/libflashattn.so,new=$lib" \
    "64,0,4096;64,1,4096;128,0,4096;128,1,4096"
  echo "## softcap 30: sm80 backward"
  IMPL=flashattn-sm80 BWD=1 SOFTCAP=30 N=10 ab dev/sm90/fwd_ab.py "ctrl=build-ctrl/libflashattn.so,new=$lib" \
    "64,0,4096;64,1,4096;128,0,4096;128,1,4096"
fi
echo "total: $((SECONDS - t0)) s"
