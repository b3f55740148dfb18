// Host side of the sm80 backward: the three launches of one (dtype, head_dim) instantiation, the main
// kernel picked by the config's layout (0: bwd_main_kernel, 1: bwd_main_2d_kernel).
#pragma once

#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/sm80/bwd_kernel_2d.cuh"

namespace flashattn::sm80 {

// The 2D main kernel (layout 1), one instance per softcap (bwd_kernel_2d.cuh); ALiBi takes the softcap
// instance, whose general path adds its bias.
template <class T, int kHeadDim, bool kSoftcap>
Status launch_bwd_main_2d(const BwdParams& bp, cudaStream_t stream) {
  using Tr = Bwd2dTraits<T, kHeadDim>;
  constexpr auto kernel = &bwd_main_2d_kernel<T, kHeadDim, kSoftcap>;
  // The sm_90 build of the kernel stages dQ in shared memory (FLASHATTN_BWD_BULK_DQ).
  cuda::DeviceInfo dev;
  FA_RETURN_IF_ERROR(cuda::device_info(&dev));
  const int smem = Tr::kSmemBytes + (dev.sm / 10 == 9 ? Tr::kDqStageBytes : 0);
  FA_RETURN_IF_ERROR(cuda::opt_in_shared_memory<kernel>(dev, smem, "flashattn-sm80", "backward", kHeadDim));
  // One grid dimension of tasks (k-block, kv head, batch), the split ones as tail_pieces CTAs each.
  unsigned ctas = 0;
  FA_RETURN_IF_ERROR(bwd_task_ctas(bp, "flashattn-sm80", &ctas));
  kernel<<<ctas, Tr::kThreads, smem, stream>>>(bp);
  return {};
}

// The three launches on bp's stream.
template <class T, int kHeadDim>
Status run_bwd(const BwdParams& bp, cudaStream_t stream, int32_t num_semaphores) {
  constexpr BwdConfig kConfig = bwd_config(kHeadDim);
  FA_RETURN_IF_ERROR((launch_bwd_preprocess<T, kHeadDim>(bp, stream, num_semaphores)));
  if (bp.seqlen_k > 0) {
    if constexpr (kConfig.layout == 1) {
      FA_RETURN_IF_ERROR((bp.softcap > 0.f || bp.alibi_slopes ? launch_bwd_main_2d<T, kHeadDim, true>(bp, stream)
                                           : launch_bwd_main_2d<T, kHeadDim, false>(bp, stream)));
    } else {
      using Tr = BwdTraits<T, kHeadDim>;
      constexpr auto kernel = &bwd_main_kernel<T, kHeadDim>;
      FA_RETURN_IF_ERROR(cuda::opt_in_shared_memory<kernel>(Tr::kSmemBytes, "flashattn-sm80", "backward", kHeadDim));
      const dim3 grid(unsigned((bp.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN * Tr::kSplitD),
                      unsigned(bp.num_heads_kv), unsigned(bp.batch));
      kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(bp);
    }
    FA_CUDA_CHECK_LAUNCH("sm80 backward main");
  }
  return launch_bwd_convert_dq<T, kHeadDim>(bp, stream);
}

// One explicit instantiation per (dtype, head_dim) translation unit.
#define FLASHATTN_SM80_BWD_INSTANTIATE(T, D) \
  template Status run_bwd<T, D>(const BwdParams&, cudaStream_t, int32_t);

}  // namespace flashattn::sm80
