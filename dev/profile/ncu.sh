#!/bin/bash
# Nsight Compute profiles of the two kernels furthest from their targets, one command on the GPU
# machine: the sm90 forward (head_dim 128, 16k, non-causal) and the sm80 backward main kernel
# (head_dim 128, 16k, non-causal). Full section set with SASS-level source counters; the reports,
# their detail pages and per-instruction stall samples (CSV) go to $OUT as one archive.
set -u
OUT=${OUT:-/tmp/ncu-out}
B=build-ncu
mkdir -p "$OUT" $B
nvidia-smi -L | tee "$OUT/device.log"
F="-std=c++20 -O3 --expt-relaxed-constexpr -lineinfo -diag-suppress 20012 -Iinclude -Isrc -DFLASHATTN_HDIM_128=1"
H="-gencode=arch=compute_90a,code=sm_90a"
t0=$(date +%s)
nvcc $F $H -Xcompiler -fopenmp -c dev/sm90/harness.cu -o $B/h.o &
nvcc $F $H -c src/cuda/sm90/launch.cu -o $B/l90.o &
nvcc $F $H -c src/cuda/sm90/fwd_hdim128_bf16.cu -o $B/f90.o &
nvcc $F $H -c src/cuda/sm90/fwd_hdim128_fp16.cu -o $B/f90h.o &
nvcc $F -arch=sm_90 -Xcompiler -fopenmp -c dev/sm80bwd/bwd_dev.cu -o $B/bd.o &
nvcc $F -arch=sm_90 -c src/cuda/sm80/bwd_launch.cu -o $B/bl.o &
nvcc $F -arch=sm_90 -c src/cuda/sm80/bwd_hdim128_bf16.cu -o $B/bh.o &
nvcc $F -arch=sm_90 -c src/cuda/sm80/bwd_hdim128_fp16.cu -o $B/bh16.o &
nvcc $F -arch=sm_90 -Xcompiler -fopenmp -c src/cpu/reference.cpp -o $B/ref.o &
wait
nvcc $H $B/h.o $B/l90.o $B/f90.o $B/f90h.o -Xcompiler -fopenmp -o $B/sm90 || exit 1
nvcc -arch=sm_90 $B/bd.o $B/bl.o $B/bh.o $B/bh16.o $B/ref.o -Xcompiler -fopenmp -o $B/bwd || exit 1
echo "build: $(( $(date +%s) - t0 )) s"
$B/sm90 profile 128 0 16384
BWD_BENCH_HDIM=128 timeout 60 $B/bwd bench | tee "$OUT/bwd_bench.log"
NCU="ncu --clock-control none --set full --import-source yes"
timeout 200 $NCU -k regex:fwd_kernel -s 2 -c 1 -o "$OUT/sm90" $B/sm90 profile 128 0 16384 > "$OUT/ncu_sm90.log" 2>&1
BWD_BENCH_HDIM=128 timeout 250 $NCU -k regex:bwd_main -s 42 -c 1 -o "$OUT/bwd" $B/bwd bench > "$OUT/ncu_bwd.log" 2>&1
for r in sm90 bwd; do
  [ -f "$OUT/$r.ncu-rep" ] || continue
  ncu -i "$OUT/$r.ncu-rep" --page details > "$OUT/${r}_details.txt" 2>&1
  ncu -i "$OUT/$r.ncu-rep" --page source --csv --print-source sass > "$OUT/${r}_sass.csv" 2>&1
  grep -E "Duration|Throughput|Hit Rate|Eligible|Issued Warp|No Eligible|Registers|Stall" "$OUT/${r}_details.txt" | head -40
done
echo "total: $(( $(date +%s) - t0 )) s"
(cd "$OUT" && tar czf ncu.tgz --exclude=ncu.tgz * && find . -type f ! -name ncu.tgz ! -name device.log -delete)
