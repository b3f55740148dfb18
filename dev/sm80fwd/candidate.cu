// One candidate forward config (bf16), compiled by run.sh with -DCAND_INDEX=i and the config's fields
// -DCAND_D, CAND_BM, CAND_BN, CAND_WARPS, CAND_STAGES (nvcc splits a -D value at commas).
#include "cuda/sm80/fwd_launch.cuh"

namespace fs = flashattn::sm80;

#define CAND_FN_(i) candidate_launch_##i
#define CAND_FN(i) CAND_FN_(i)

flashattn::Status CAND_FN(CAND_INDEX)(const fs::FwdParams& p, cudaStream_t stream) {
  constexpr fs::FwdConfig kConfig{CAND_D, CAND_BM, CAND_BN, CAND_WARPS, CAND_STAGES};
  return fs::run_fwd_config<__nv_bfloat16, kConfig>(p, stream);
}
