#!/bin/bash
# The Hopper forward's device run, one command: build the dev harness with parallel nvcc, check
# it against the fp64 reference on many shapes, run compute-sanitizer on small shapes, time the
# standard sweep. Logs go to $OUT. Usage (repository root):
#   dev/sm90/run.sh [check] [sanitize] [bench] [ncu] [pingpong] [bn128]
# pingpong / bn128 rebuild the kernels with a dev switch of src/cuda/sm90/params.cuh flipped
# (ping-pong on; block_n 128 for head_dim 128), check that build and time it, for docs/sm90.md;
# ncu profiles head_dim 128, seqlen 16k, non-causal.
set -u
OUT=${OUT:-/tmp/sm90-out}
mkdir -p "$OUT"
STEPS=${*:-check sanitize bench}
B=build-sm90-dev
FLAGS="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -diag-suppress 20012
  -Xptxas=-warn-spills -DFLASHATTN_HDIM_64=1 -DFLASHATTN_HDIM_128=1 -DFLASHATTN_HDIM_256=1 -Iinclude -Isrc"
nvidia-smi -L | tee "$OUT/device.log"

# build <dir> [defines...]: every sm90 TU and the harness, in parallel, into <dir>/sm90_harness.
build() {
  local dir=$1
  shift
  mkdir -p $dir
  for f in src/cuda/sm90/*.cu dev/sm90/harness.cu; do
    nvcc $FLAGS "$@" -Xptxas -v -Xcompiler -fopenmp -c $f -o $dir/$(basename $f .cu).o > $dir/$(basename $f .cu).log 2>&1 &
  done
}
start=$(date +%s)
build $B
[[ " $STEPS " == *" pingpong "* ]] && build $B/pingpong -DFLASHATTN_SM90_PINGPONG=1
[[ " $STEPS " == *" bn128 "* ]] && build $B/bn128 -DFLASHATTN_SM90_HDIM128_BLOCK_N=128
wait
for dir in $B $B/pingpong $B/bn128; do
  [ -f $dir/harness.o ] || continue
  cat $dir/*.log >> "$OUT/build.log"
  nvcc -gencode=arch=compute_90a,code=sm_90a $dir/*.o -o $dir/sm90_harness -Xcompiler -fopenmp 2>&1 | tee -a "$OUT/build.log"
done
echo "build: $(( $(date +%s) - start )) s"
grep -E "error|registers|spill|C7508" "$OUT/build.log" | sort | uniq -c
[ -x $B/sm90_harness ] || exit 1

for step in $STEPS; do
  case $step in
    check) timeout 120 $B/sm90_harness check 2>&1 | tee "$OUT/check.log" | grep -v ^PASS ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 90 compute-sanitizer --tool $tool $B/sm90_harness check small > "$OUT/$tool.log" 2>&1
        echo "$tool: rc=$? $(tail -2 "$OUT/$tool.log" | tr '\n' ' ')"
      done ;;
    bench) timeout 150 $B/sm90_harness bench sm90 2>&1 | tee "$OUT/bench.log" ;;
    pingpong | bn128)
      timeout 120 $B/$step/sm90_harness check 2>&1 | tail -1
      timeout 150 $B/$step/sm90_harness bench $step 2>&1 | tee "$OUT/bench_$step.log" ;;
    ncu) timeout 120 ncu --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
           --section SchedulerStats --section MemoryWorkloadAnalysis $B/sm90_harness profile 128 0 16384 > "$OUT/ncu.log" 2>&1
         grep -E "Throughput|Duration|Stall|Issued|Eligible|Hit Rate|Active Warps" "$OUT/ncu.log" | head -40 ;;
  esac
done
