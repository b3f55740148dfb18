#!/bin/bash
# Nsight Compute, side by side: torch's FlashAttention-2 backward kernel and flashattn-sm80's main
# backward kernel, head_dim 64 and 128 at 16k non-causal (dev/sm80bwd/ncu_vs_flash.py; NCU_SEQLEN and
# NCU_CAUSAL=1 pick another shape; NCU_PASS=fwd: the forward kernels): instruction mix (per opcode),
# warp stall reasons, pipe utilization, memory, and executed instructions per SASS line. Needs
# build/libflashattn.so.
# Output in $OUT: ncu_vs_flash.txt (details), ncu_vs_flash_ops.txt (per opcode), sass_<i>.csv (the
# source page of kernel i in launch order: flash d64, ours d64, flash d128, ours d128), vs.ncu-rep.
set -u
OUT=${OUT:-/tmp/ncu-vs-flash}
mkdir -p "$OUT"
command -v ncu >/dev/null || { echo "no ncu"; exit 1; }
M=sass__inst_executed_per_opcode,smsp__inst_executed.sum
kernels="flash_bwd_dq_dk_dv|bwd_main_2d"
[ "${NCU_PASS:-bwd}" = fwd ] && kernels="fwd_kernel"  # flash_fwd_kernel and ours
timeout 400 ncu --clock-control none -k regex:"$kernels" -c 4 \
  --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
  --section SpeedOfLight --section SourceCounters --metrics $M \
  -o "$OUT/vs" python3 dev/sm80bwd/ncu_vs_flash.py build/libflashattn.so > "$OUT/ncu_run.log" 2>&1
ncu -i "$OUT/vs.ncu-rep" --page details > "$OUT/ncu_vs_flash.txt" 2>&1
ncu -i "$OUT/vs.ncu-rep" --page raw --print-metric-instances details --metrics $M > "$OUT/ncu_vs_flash_ops.txt" 2>&1
for i in 0 1 2 3; do
  ncu -i "$OUT/vs.ncu-rep" --page source --csv --print-source sass --launch-skip $i --launch-count 1 \
    > "$OUT/sass_$i.csv" 2>&1
done
tail -3 "$OUT/ncu_run.log"
