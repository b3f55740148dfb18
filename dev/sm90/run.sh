#!/bin/bash
# The Hopper forward's device run, one command: build the dev harness with parallel nvcc for each
# variant (a set of dev switches of src/cuda/sm90/params.cuh), check every variant against the fp64
# reference (123 cases + 2 dispatch checks), time them side by side on the standard sweep (two rounds, the second in
# reverse order), time cuDNN (torch SDPA) in the same run, run compute-sanitizer on small shapes.
# Logs go to $OUT. Usage (repository root):
#   dev/sm90/run.sh [check] [bench] [cudnn] [sass] [sanitize] [ncu] [ncu-source] [trace]
# VARIANTS below: name|head dims timed|defines (dev switches of params.cuh)|source root (of
# cuda/sm90/*, default src). "default" is the library's build; "before" the sources of the commit
# before step 8 (docs/sm90.md), copied to dev/sm90/before/cuda/sm90 (not committed) with
#   for f in $(git ls-tree --name-only <commit> src/cuda/sm90/); do
#     git show <commit>:$f > dev/sm90/before/cuda/sm90/$(basename $f); done
# SAN names the variant that compute-sanitizer runs (default: the last of VARIANTS); NO_CHECK
# (space-separated names) the variants the check step skips.
set -u
OUT=${OUT:-/tmp/sm90-out}
mkdir -p "$OUT"
STEPS=${*:-check bench cudnn sass sanitize}
B=build-sm90-dev
VARIANTS=(
  "default|64,128,256|"
  "trace|128|-DFLASHATTN_SM90_TRACE=1 -DFLASHATTN_SM90_HDIM128_BLOCK_N=128 -DFLASHATTN_SM90_RESCALE_EARLY=1"
)
# VARIANTS_OVERRIDE: ';'-separated variants in place of the list above.
[ -n "${VARIANTS_OVERRIDE:-}" ] && IFS=';' read -ra VARIANTS <<< "$VARIANTS_OVERRIDE"
SAN=${SAN:-$(echo "${VARIANTS[-1]}" | cut -d'|' -f1)}
FLAGS="-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -diag-suppress 20012
  -Xptxas=-warn-spills -Iinclude -Isrc"
nvidia-smi -L | tee "$OUT/device.log"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv >> "$OUT/device.log"

start=$(date +%s)
mkdir -p $B
nvcc $FLAGS -DFLASHATTN_HDIM_64=1 -DFLASHATTN_HDIM_128=1 -DFLASHATTN_HDIM_256=1 -Xcompiler -fopenmp -c dev/sm90/harness.cu -o $B/harness.o > $B/harness.log 2>&1 &
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name hdims defs root <<< "$v"
  root=${root:-src}
  [ -d $root/cuda/sm90 ] || { echo "$name: no $root/cuda/sm90"; continue; }
  rm -rf $B/$name && mkdir -p $B/$name
  # Only the head dims the variant is timed at: launch.cu dispatches to those alone.
  hflags=$(for d in 64 128 256; do echo -n " -DFLASHATTN_HDIM_$d=$([[ ,$hdims, == *,$d,* ]] && echo 1 || echo 0)"; done)
  for f in $root/cuda/sm90/launch.cu $(for d in ${hdims//,/ }; do echo $root/cuda/sm90/fwd_hdim${d}_*.cu; done); do
    nvcc -I$root $FLAGS $hflags $defs -Xptxas -v -c $f -o $B/$name/$(basename $f .cu).o \
      > $B/$name/$(basename $f .cu).log 2>&1 &
  done
done
wait
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name hdims defs <<< "$v"
  for l in $B/$name/*.log; do echo "== $name $(basename $l)"; cat $l; done >> "$OUT/build.log"
  nvcc -gencode=arch=compute_90a,code=sm_90a $B/harness.o $B/$name/*.o -o $B/$name/sm90_harness -Xcompiler -fopenmp \
    2>&1 | tee -a "$OUT/build.log"
done
echo "build: $(( $(date +%s) - start )) s"
grep -E "error|registers|spill|C75" "$OUT/build.log" | sort | uniq -c

for step in $STEPS; do
  case $step in
    check)
      for v in "${VARIANTS[@]}"; do
        IFS='|' read -r name hdims defs <<< "$v"
        [ -x $B/$name/sm90_harness ] || { echo "$name: no binary"; continue; }
        [[ " ${NO_CHECK:-} " == *" $name "* ]] && continue
        BENCH_HDIMS=$hdims OMP_NUM_THREADS=8 timeout 300 $B/$name/sm90_harness check > "$OUT/check_$name.log" 2>&1 &
      done
      wait
      for v in "${VARIANTS[@]}"; do
        IFS='|' read -r name hdims defs <<< "$v"
        echo "check $name: $(tail -1 "$OUT/check_$name.log")"; grep FAIL "$OUT/check_$name.log" | head -5
      done ;;
    bench)
      smi=$(scripts/gpu_clocks.sh start "$OUT/clocks.log")  # the clock and power through the timed runs
      for round in 1 2; do
        list=("${VARIANTS[@]}")
        [ $round = 2 ] && list=($(printf '%s\n' "${VARIANTS[@]}" | tac | tr ' ' '~'))
        for v in "${list[@]}"; do
          IFS='|' read -r name hdims defs <<< "${v//\~/ }"
          [ -x $B/$name/sm90_harness ] || continue
          BENCH_HDIMS=$hdims timeout 60 $B/$name/sm90_harness bench $name 2>&1 | grep -v variant >> "$OUT/bench_round$round.log"
        done
      done
      echo "variant   hdim seqlen cau  round1  round2 (TFLOP/s)"
      join -j1 <(awk 'NF==8 {print $1":"$2":"$3":"$5, $8}' "$OUT/bench_round1.log" | sort) \
               <(awk 'NF==8 {print $1":"$2":"$3":"$5, $8}' "$OUT/bench_round2.log" | sort) |
        tr ':' ' ' | sort -k2,2n -k4,4n -k3,3n -k1,1 | tee "$OUT/bench_table.log"
      kill $smi
      echo "bench: $(scripts/gpu_clocks.sh summary "$OUT/clocks.log")" | tee -a "$OUT/device.log" ;;
    cudnn) timeout 90 python3 dev/sm90/cudnn_bench.py 2>&1 | tee "$OUT/cudnn.log" ;;
    sass)
      cuobjdump -sass $B/default/fwd_hdim128_bf16.o > "$OUT/sass_default_128.txt" 2>&1
      cuobjdump -sass $B/$SAN/fwd_hdim128_bf16.o > "$OUT/sass_${SAN}_128.txt" 2>&1
      grep -cE "HGMMA" "$OUT/sass_default_128.txt" ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        san_hdims=$(printf '%s\n' "${VARIANTS[@]}" | awk -F'|' -v n="$SAN" '$1 == n {print $2}')
        BENCH_HDIMS=$san_hdims timeout 60 compute-sanitizer --tool $tool $B/$SAN/sm90_harness check small \
          > "$OUT/${tool}_$SAN.log" 2>&1
        echo "$tool $SAN: rc=$? $(tail -2 "$OUT/${tool}_$SAN.log" | tr '\n' ' ')"
      done ;;
    trace) # TRACE_SHAPES: "head_dim causal seqlen" triples, ';'-separated, of the variants named trace*
      IFS=';' read -ra shapes <<< "${TRACE_SHAPES:-128 0 512;128 0 2048;128 0 16384}"
      for v in "${VARIANTS[@]}"; do
        IFS='|' read -r name hdims defs <<< "$v"
        [[ $name == trace* ]] || continue
        for shape in "${shapes[@]}"; do
          tag=$(echo $shape | tr ' ' _)
          bn=$(echo "$defs" | grep -o 'BLOCK_N=[0-9]*' | head -1 | cut -d= -f2)
          TRACE_BLOCK_N=${bn:-128} timeout 60 $B/$name/sm90_harness trace $shape > "$OUT/trace_${name}_$tag.log" 2>&1
          echo "== trace $name $shape"; grep -v "^variant\|^$" "$OUT/trace_${name}_$tag.log"
        done
      done ;;
    repro) # REPRO_MATCH (a check case's description, or part of it) run REPRO_REPEAT (30) times by each variant
      for v in "${VARIANTS[@]}"; do
        IFS='|' read -r name hdims defs <<< "$v"
        CHECK_MATCH="$REPRO_MATCH" CHECK_REPEAT=${REPRO_REPEAT:-30} timeout 120 $B/$name/sm90_harness check > "$OUT/repro_$name.log" 2>&1
        echo "repro $name: rc=$? $(grep -c PASS "$OUT/repro_$name.log") passed, $(grep -c FAIL "$OUT/repro_$name.log") failed"
        grep -m 60 WATCHDOG "$OUT/repro_$name.log"
      done ;;
    ncu) # NCU_SHAPES: "head_dim causal seqlen" triples, ';'-separated, of the default variant
      IFS=';' read -ra shapes <<< "${NCU_SHAPES:-128 0 16384}"
      for shape in "${shapes[@]}"; do
        tag=$(echo $shape | tr ' ' _)
        timeout 120 ncu --clock-control none --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
          --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats \
          $B/default/sm90_harness profile $shape > "$OUT/ncu_$tag.log" 2>&1
        echo "== ncu $shape"
        grep -E "Throughput|Duration|Stall|Issued|Eligible|Hit Rate|Active Warps|Registers|Bandwidth" "$OUT/ncu_$tag.log" | head -40
      done ;;
    ncu-source) # per-SASS-instruction stall samples of the default variant, NCU_SHAPES as above
      IFS=';' read -ra shapes <<< "${NCU_SHAPES:-128 0 512}"
      for shape in "${shapes[@]}"; do
        tag=$(echo $shape | tr ' ' _)
        timeout 200 ncu --clock-control none --launch-skip 3 --launch-count 1 --section WarpStateStats --section SourceCounters \
          --metrics 'regex:^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active\.ratio$' \
          -o "$B/src_$tag" -f $B/default/sm90_harness profile $shape > "$OUT/ncusrc_$tag.log" 2>&1
        ncu -i "$B/src_$tag.ncu-rep" --page raw --csv 2>&1 | tr ',' '\n' > "$OUT/ncuraw_$tag.txt"
        ncu -i "$B/src_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/ncusass_$tag.csv" 2>&1
        echo "== ncu-source $shape: $(wc -l < "$OUT/ncusass_$tag.csv") lines"
      done ;;
  esac
done
echo "total: $(( $(date +%s) - start )) s"
# Few files come back from the device machine: everything in one archive, the tables beside it.
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz * && find . -type f ! -name logs.tgz ! -name bench_table.log \
  ! -name cudnn.log ! -name device.log -delete)
