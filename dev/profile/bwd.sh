#!/bin/bash
# sm80 backward A/B on the GPU machine: the working tree's kernels ("new") against the copy of
# bwd_kernel_2d.cuh under dev/profile/old ("old"), head_dim 64 and 128: correctness of "new"
# (bwd_dev check), the sweep of both, torch's flash backward, ncu source counters of "new" (d128 16k).
set -u
OUT=${OUT:-/tmp/bwd-out}
B=build-bwdab
mkdir -p "$OUT" $B/new $B/old
nvidia-smi -L | tee "$OUT/device.log"
F="-std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr -lineinfo -DFLASHATTN_HDIM_64=1 -DFLASHATTN_HDIM_128=1"
t0=$(date +%s)
nvcc $F -Iinclude -Isrc -Xcompiler -fopenmp -c dev/sm80bwd/bwd_dev.cu -o $B/bd.o &
nvcc $F -Iinclude -Isrc -Xcompiler -fopenmp -c src/cpu/reference.cpp -o $B/ref.o &
for v in new old; do
  I="-Iinclude -Isrc"; [ $v = old ] && I="-Idev/profile/old -Iinclude -Isrc"
  L=src/cuda/sm80/bwd_launch.cu; [ $v = old ] && [ -f dev/profile/old/bwd_launch.cu ] && L=dev/profile/old/bwd_launch.cu
  for f in $L src/cuda/sm80/bwd_hdim{64,128}_{bf16,fp16}.cu; do
    nvcc $F $I -Xptxas -v -c $f -o $B/$v/$(basename $f).o > $B/$v/$(basename $f).log 2>&1 &
  done
done
wait
for v in new old; do
  nvcc -arch=sm_90 $B/bd.o $B/ref.o $B/$v/*.o -Xcompiler -fopenmp -o $B/$v/bwd || exit 1
  grep -h -A2 main_2d $B/$v/bwd_hdim*_bf16*.log | grep -E "spill|registers" | sed "s/^/$v /"
done
echo "build: $(( $(date +%s) - t0 )) s"
for d in 64 128; do BWD_CHECK_HDIM=$d timeout 60 $B/new/bwd check > "$OUT/check_$d.log" 2>&1; grep -E "FAIL|check:" "$OUT/check_$d.log" | head; done
for r in 1 2; do for v in new old; do
  echo "== $v round $r"; timeout 60 $B/$v/bwd bench 2>&1 | grep -v device
done; done 2>&1 | tee "$OUT/bench.log"
timeout 90 python3 dev/sm80bwd/torch_bwd.py 2>&1 | tee "$OUT/torch.log"
if [ "${NCU:-1}" = 1 ]; then
  BWD_BENCH_HDIM=${NCU_HDIM:-128} timeout 200 ncu --clock-control none --set full --import-source yes -k regex:bwd_main -s 42 -c 1 \
    -o "$OUT/bwd" $B/new/bwd bench > "$OUT/ncu.log" 2>&1
  ncu -i "$OUT/bwd.ncu-rep" --page source --csv --print-source sass > "$OUT/bwd_sass.csv" 2>&1
  ncu -i "$OUT/bwd.ncu-rep" --page details > "$OUT/bwd_details.txt" 2>&1
fi
echo "total: $(( $(date +%s) - t0 )) s"
(cd "$OUT" && tar czf out.tgz --exclude=out.tgz * && find . -type f ! -name out.tgz ! -name bench.log ! -name torch.log -delete)
