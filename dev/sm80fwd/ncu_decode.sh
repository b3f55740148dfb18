#!/bin/bash
# Nsight Compute on decode, ours against cuDNN's (dev/sm80fwd/ncu_decode.py; NCU_SHAPES: ';'-separated
# "batch seqlen_k [heads [heads_kv]]", default "16 16384;1 65536"): every kernel of the two calls with the
# throughput, memory, warp-state and occupancy sections, as text in $OUT/ncu-decode-<shape>.txt. LIB: the
# library (default build/libflashattn.so; built with head_dim 128 if missing).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ncu-decode}
mkdir -p "$OUT"
LIB=${LIB:-build/libflashattn.so}
if [ ! -f "$LIB" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS=128 \
    -DFLASHATTN_TESTS=OFF -DFLASHATTN_BENCH=OFF >"$OUT/build.log" 2>&1 && cmake --build build -j 16 --target flashattn >>"$OUT/build.log" 2>&1 || exit 1
fi
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|regex:l1tex__data_pipe_lsu_wavefronts_mem_shared.*sum.*pct.*|regex:sm__pipe_.*cycles_active\.avg\.pct_of_peak_sustained_active'
IFS=';' read -ra shapes <<<"${NCU_SHAPES:-16 16384;1 65536}"
for shape in "${shapes[@]}"; do
  tag=$(echo "$shape" | tr ' ' '_')
  timeout ${NCU_TIMEOUT:-200} ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy --metrics "$M" \
    -o /tmp/ncu-decode -f python3 dev/sm80fwd/ncu_decode.py "$LIB" $shape >"$OUT/ncu-$tag.log" 2>&1 || tail -5 "$OUT/ncu-$tag.log"
  ncu -i /tmp/ncu-decode.ncu-rep --page details >"$OUT/ncu-decode-$tag.txt" 2>&1
  ncu -i /tmp/ncu-decode.ncu-rep --page raw --metrics "$M" >>"$OUT/ncu-decode-$tag.txt" 2>&1
  echo "== $shape"
  grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Shared Memory Configuration Size|Block Limit" "$OUT/ncu-decode-$tag.txt" | head -40
done
