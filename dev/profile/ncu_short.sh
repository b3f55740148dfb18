#!/bin/bash
# Where a short backward spends its time (head_dim 64, seqlen 512, batch 32, causal): durations of the
# three kernels of one call, and the main kernel's full ncu section set with SASS source counters.
set -u
OUT=${OUT:-/tmp/ncu-short}
B=build-bwdab
mkdir -p "$OUT" $B/new
F="-std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr -lineinfo -DFLASHATTN_HDIM_64=1 -DFLASHATTN_HDIM_128=1"
nvcc $F -Iinclude -Isrc -Xcompiler -fopenmp -c dev/sm80bwd/bwd_dev.cu -o $B/bd.o &
nvcc $F -Iinclude -Isrc -Xcompiler -fopenmp -c src/cpu/reference.cpp -o $B/ref.o &
for f in src/cuda/sm80/bwd_launch.cu src/cuda/sm80/bwd_hdim{64,128}_{bf16,fp16}.cu; do
  nvcc $F -Iinclude -Isrc -c $f -o $B/new/$(basename $f).o &
done
wait
nvcc -arch=sm_90 $B/bd.o $B/ref.o $B/new/*.o -Xcompiler -fopenmp -o $B/new/bwd || exit 1
# bench order at BWD_BENCH_HDIM=64: 512, 2k, 4k, 16k non-causal, then causal; 13 calls each, 3 kernels a call.
for c in 0 1; do
  skip=$(( c * 156 + 9 ))
  BWD_BENCH_HDIM=64 timeout 120 ncu --clock-control none --section SpeedOfLight -s $skip -c 3 $B/new/bwd bench \
    > "$OUT/durations_c$c.txt" 2>&1
  grep -E "bwd_|Duration" "$OUT/durations_c$c.txt"
done
BWD_BENCH_HDIM=64 timeout 200 ncu --clock-control none --set full --import-source yes -k regex:bwd_main -s 55 -c 1 \
  -o "$OUT/short" $B/new/bwd bench > "$OUT/ncu.log" 2>&1
ncu -i "$OUT/short.ncu-rep" --page source --csv --print-source sass > "$OUT/short_sass.csv" 2>&1
ncu -i "$OUT/short.ncu-rep" --page details > "$OUT/short_details.txt" 2>&1
grep -E "Duration|Throughput|Eligible|Issued Warp|Waves|Occupancy" "$OUT/short_details.txt" | head -20
(cd "$OUT" && tar czf out.tgz --exclude=out.tgz * && find . -type f ! -name out.tgz -delete)
