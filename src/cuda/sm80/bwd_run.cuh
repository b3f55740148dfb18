// Host side of the sm80 backward: the three launches of one (dtype, head_dim) instantiation, the main
// kernel picked by the config's layout (0: bwd_main_kernel, 1: bwd_main_2d_kernel).
#pragma once

#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/sm80/bwd_kernel_2d.cuh"

namespace flashattn::sm80 {

// The main kernel of head_dim's layout. kScoreMod: its instance for softcapped or ALiBi scores, compiled
// in a translation unit of its own (bwd_hdim<N>_<dtype>_scoremod.cu): beside the other instance, ptxas
// allocated the 1D kernel's registers worse (d256 on sm_90: 24 bytes spilled, not 8). kDropout: dropout's
// (with or without them; bwd_hdim<N>_<dtype>_dropout.cu).
template <class T, int kHeadDim, bool kScoreMod, bool kDropout = false>
Status launch_bwd_main(const BwdParams& bp, cudaStream_t stream) {
  if constexpr (bwd_config(kHeadDim).layout == 1) {  // bwd_kernel_2d.cuh
    using Tr = Bwd2dTraits<T, kHeadDim>;
    constexpr auto kernel = &bwd_main_2d_kernel<T, kHeadDim, kScoreMod, kDropout>;
    // The sm_90 build of the kernel stages dQ in shared memory (FLASHATTN_BWD_BULK_DQ).
    cuda::DeviceInfo dev;
    FA_RETURN_IF_ERROR(cuda::device_info(&dev));
    const int smem = Tr::kSmemBytes + (dev.sm / 10 == 9 ? Tr::kDqStageBytes : 0);
    FA_RETURN_IF_ERROR(cuda::opt_in_shared_memory<kernel>(dev, smem, "flashattn-sm80", "backward", kHeadDim));
    // One grid dimension of tasks (k-block, kv head, batch), the split ones as tail_pieces CTAs each.
    unsigned ctas = 0;
    FA_RETURN_IF_ERROR(bwd_task_ctas(bp, "flashattn-sm80", &ctas));
    kernel<<<ctas, Tr::kThreads, smem, stream>>>(bp);
  } else {  // bwd_kernel.cuh: a CTA per (k-block, part of head_dim), kv head, batch
    using Tr = BwdTraits<T, kHeadDim>;
    constexpr auto kernel = &bwd_main_kernel<T, kHeadDim, kScoreMod, kDropout>;
    FA_RETURN_IF_ERROR(cuda::opt_in_shared_memory<kernel>(Tr::kSmemBytes, "flashattn-sm80", "backward", kHeadDim));
    const dim3 grid(unsigned((bp.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN * Tr::kSplitD), unsigned(bp.num_heads_kv),
                    unsigned(bp.batch));
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(bp);
  }
  FA_CUDA_CHECK_LAUNCH("sm80 backward main");
  return {};
}

// The three launches on bp's stream.
template <class T, int kHeadDim>
Status run_bwd(const BwdParams& bp, cudaStream_t stream, int32_t num_semaphores) {
  FA_RETURN_IF_ERROR((launch_bwd_preprocess<T, kHeadDim>(bp, stream, num_semaphores)));
  if (bp.seqlen_k > 0) {
    const bool score_mod = bp.softcap > 0.f || bp.alibi_slopes != nullptr;
    FA_RETURN_IF_ERROR((bp.dropout.on() ? launch_bwd_main<T, kHeadDim, true, true>(bp, stream)
                        : score_mod     ? launch_bwd_main<T, kHeadDim, true>(bp, stream)
                                        : launch_bwd_main<T, kHeadDim, false>(bp, stream)));
  }
  return launch_bwd_convert_dq<T, kHeadDim>(bp, stream);
}

// The explicit instantiations of one (dtype, head_dim): run_bwd in bwd_hdim<N>_<dtype>.cu, the score-mod
// main kernel in bwd_hdim<N>_<dtype>_scoremod.cu, dropout's in bwd_hdim<N>_<dtype>_dropout.cu.
#define FLASHATTN_SM80_BWD_INSTANTIATE(T, D)                                                  \
  extern template Status launch_bwd_main<T, D, true>(const BwdParams&, cudaStream_t);       \
  extern template Status launch_bwd_main<T, D, true, true>(const BwdParams&, cudaStream_t); \
  template Status run_bwd<T, D>(const BwdParams&, cudaStream_t, int32_t);
#define FLASHATTN_SM80_BWD_INSTANTIATE_SCORE_MOD(T, D) \
  template Status launch_bwd_main<T, D, true>(const BwdParams&, cudaStream_t);
#define FLASHATTN_SM80_BWD_INSTANTIATE_DROPOUT(T, D) \
  template Status launch_bwd_main<T, D, true, true>(const BwdParams&, cudaStream_t);

}  // namespace flashattn::sm80
