#!/usr/bin/env bash
# The sm80 forward's device run: builds dev/sm80fwd/check (nvcc, sm_90 by default, -j16), runs the
# correctness cases, then the timing sweep with candidate configs. KEEP_BUILD=1 reuses objects already in $BUILD. Logs go to $OUT (default ./out).
#   bash dev/sm80fwd/run.sh [check|time]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/dev/sm80fwd/out}
ARCH=${ARCH:-90}
JOBS=${JOBS:-16}
BUILD=${BUILD:-/tmp/sm80fwd-build}
[ "${KEEP_BUILD:-0}" = 1 ] || rm -rf "$BUILD"
mkdir -p "$OUT" "$BUILD"

# Candidate configs {head_dim, block_m, block_n, warps, stages}, timed beside the table's.
# CAND=0 times the table alone.
CANDIDATES=(
  "128,128,128,8,2" "128,128,48,4,2" "128,128,32,4,2"
  "64,128,64,4,2" "64,128,96,4,2"
)
[ -n "${CANDS:-}" ] && read -ra CANDIDATES <<< "$CANDS"  # CANDS="256,64,64,4,1 ...": these instead
[ "${CAND:-1}" = 0 ] && CANDIDATES=()

NVCC=(nvcc -std=c++20 -O3 --expt-relaxed-constexpr -diag-suppress 20012 -lineinfo -Xptxas=-v,-warn-spills
      -gencode "arch=compute_${ARCH},code=sm_${ARCH}" -I src -I include -I .)
DEFS=(-DFLASHATTN_HDIM_32=1 -DFLASHATTN_HDIM_64=1 -DFLASHATTN_HDIM_96=1 -DFLASHATTN_HDIM_128=1
      -DFLASHATTN_HDIM_192=1 -DFLASHATTN_HDIM_256=1)

jobs_file="$BUILD/jobs.txt"
: > "$jobs_file"
for f in src/cuda/sm80/fwd_hdim*.cu; do
  n=$(basename "$f" .cu)
  echo "${NVCC[*]} ${DEFS[*]} -c $f -o $BUILD/$n.o > $BUILD/$n.log 2>&1" >> "$jobs_file"
done
{
  echo '#include "dev/sm80fwd/candidates.hpp"'
  for i in "${!CANDIDATES[@]}"; do
    echo "flashattn::Status candidate_launch_$i(const flashattn::sm80::FwdParams&, cudaStream_t);"
  done
  echo 'const std::vector<Candidate>& candidates() {'
  echo '  static const std::vector<Candidate> list = {'
  for i in "${!CANDIDATES[@]}"; do
    c=${CANDIDATES[$i]}
    echo "    {\"{$c}\", ${c%%,*}, candidate_launch_$i},"
  done
  echo '  };'
  echo '  return list;'
  echo '}'
} > "$BUILD/candidate_list.cu"
for i in "${!CANDIDATES[@]}"; do
  IFS=, read -r cd cbm cbn cw cs <<< "${CANDIDATES[$i]}"
  echo "${NVCC[*]} -DCAND_INDEX=$i -DCAND_D=$cd -DCAND_BM=$cbm -DCAND_BN=$cbn -DCAND_WARPS=$cw -DCAND_STAGES=$cs -c dev/sm80fwd/candidate.cu -o $BUILD/cand$i.o > $BUILD/cand$i.log 2>&1" >> "$jobs_file"
done
echo "${NVCC[*]} -c $BUILD/candidate_list.cu -o $BUILD/candidate_list.o > $BUILD/list.log 2>&1" >> "$jobs_file"
echo "${NVCC[*]} ${DEFS[*]} -Xcompiler -fopenmp -c dev/sm80fwd/check.cu -o $BUILD/check.o > $BUILD/check.log 2>&1" >> "$jobs_file"
echo "g++ -std=c++20 -O2 -fopenmp -I src -I include -c src/cpu/reference.cpp -o $BUILD/reference.o > $BUILD/reference.log 2>&1" >> "$jobs_file"

# Each job compiles one object: skip those already built (KEEP_BUILD=1).
awk '{ for (i = 1; i < NF; ++i) if ($i == "-o") { o = $(i + 1) } print "[ -f " o " ] || " $0 }' "$jobs_file" > "$jobs_file.new"
mv "$jobs_file.new" "$jobs_file"
start=$(date +%s)
status=0
xargs -P "$JOBS" -I CMD bash -c CMD < "$jobs_file" || status=$?
cat "$BUILD"/*.log > "$OUT/build.log"
echo "build: $(( $(date +%s) - start )) s (status $status)" | tee -a "$OUT/build.log"
grep -A3 "Compiling entry function.*fwd_kernel" "$OUT/build.log" | grep -E "entry|spill|Used" > "$OUT/ptxas.txt" || true
if [ "$status" != 0 ]; then grep -B2 -A10 "error" "$OUT/build.log" | head -60; exit 1; fi
nvcc -o "$BUILD/check" "$BUILD"/*.o -Xcompiler -fopenmp -lgomp
"$BUILD/check" "${1:-all}" 2>&1 | tee "$OUT/check.log"
