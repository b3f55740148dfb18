#!/bin/bash
# Warp stall reasons per issued instruction, side by side: torch's FlashAttention-2 backward kernel and
# flashattn-sm80's 2D kernel (dev/sm80bwd/ncu_vs_flash.py), at each of NCU_SEQLENS (default 2048 and
# 16384; NCU_DIMS as there, default 64), plus the SASS source pages (stall samples per line) at the first
# seqlen, gzipped. Builds build/ (head dims NCU_DIMS) if it has no library. Output in $OUT/n.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ncu-stalls}
mkdir -p "$OUT/n"
dims=${NCU_DIMS:-64}
if [ ! -f build/libflashattn.so ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS="$dims" \
    -DFLASHATTN_TESTS=OFF -DFLASHATTN_BENCH=OFF >"$OUT/n/build.log" 2>&1 && cmake --build build -j 16 --target flashattn >>"$OUT/n/build.log" 2>&1 || exit 1
fi
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|smsp__inst_executed.sum|sm__cycles_elapsed.avg|l1tex__data_bank_conflicts_pipe_lsu_mem_shared.*sum'
first=
for s in ${NCU_SEQLENS:-2048 16384}; do
  first=${first:-$s}
  NCU_SEQLEN=$s NCU_DIMS=$dims timeout 240 ncu --clock-control none -k regex:"flash_bwd_dq_dk_dv|bwd_main_2d" -c 2 \
    --section WarpStateStats --section SourceCounters --metrics "$M" -o "/tmp/stalls$s" -f \
    python3 dev/sm80bwd/ncu_vs_flash.py build/libflashattn.so >"/tmp/stalls$s.log" 2>&1 || tail -5 "/tmp/stalls$s.log"
  ncu -i "/tmp/stalls$s.ncu-rep" --page raw --metrics "$M" >"$OUT/n/raw$s.txt" 2>&1
done
for i in 0 1; do
  ncu -i "/tmp/stalls$first.ncu-rep" --page source --csv --print-source sass --launch-skip $i --launch-count 1 \
    | gzip >"$OUT/n/sass${first}_$i.csv.gz"
done
ls -la "$OUT/n"
