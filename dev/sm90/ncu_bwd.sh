#!/bin/bash
# Nsight Compute on the Hopper backward against cuDNN's (dev/sm90/ncu_bwd.py: one call each, NCU_DIM /
# NCU_SEQLEN / NCU_CAUSAL there): every kernel of the two calls with the throughput, pipe, memory and
# warp-state sections, as text in $OUT/ncu-bwd.txt. Builds build/ (head dim NCU_DIM) if it has no library.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ncu-bwd}
mkdir -p "$OUT"
if [ ! -f build/libflashattn.so ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS="${NCU_DIM:-128}" \
    -DFLASHATTN_TESTS=OFF -DFLASHATTN_BENCH=OFF >"$OUT/build.log" 2>&1 && cmake --build build -j 16 --target flashattn >>"$OUT/build.log" 2>&1 || exit 1
fi
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active'
timeout ${NCU_TIMEOUT:-300} ncu --profile-from-start off --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy --metrics "$M" \
  -o /tmp/ncu-bwd -f python3 dev/sm90/ncu_bwd.py build/libflashattn.so >"$OUT/ncu.log" 2>&1 || tail -5 "$OUT/ncu.log"
ncu -i /tmp/ncu-bwd.ncu-rep --page details >"$OUT/ncu-bwd.txt" 2>&1
ncu -i /tmp/ncu-bwd.ncu-rep --page raw --metrics "$M" >"$OUT/ncu-bwd-raw.txt" 2>&1
grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput" "$OUT/ncu-bwd.txt" | head -40
# NCU_SOURCE=1: our main kernel again with the source counters (stall samples per SASS line), gzipped CSV.
if [ -n "${NCU_SOURCE:-}" ]; then
  timeout ${NCU_TIMEOUT:-300} ncu --profile-from-start off --clock-control none -k regex:bwd_ws_kernel --section WarpStateStats \
    --section SourceCounters -o /tmp/ncu-bwd-src -f python3 dev/sm90/ncu_bwd.py build/libflashattn.so >"$OUT/ncu-src.log" 2>&1 ||
    tail -5 "$OUT/ncu-src.log"
  ncu -i /tmp/ncu-bwd-src.ncu-rep --page source --csv --print-source sass | gzip >"$OUT/bwd-sass.csv.gz"
  ncu -i /tmp/ncu-bwd-src.ncu-rep --page details >"$OUT/ncu-bwd-src.txt" 2>&1
fi
