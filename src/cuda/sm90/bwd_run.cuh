// Host side of the Hopper backward: the sm80 row kernels (D = rowsum(dO * O) and the dQ
// conversion) around the wgmma main kernel of bwd_kernel.cuh, on bp's stream.
#pragma once

#include "cuda/sm90/bwd_kernel.cuh"

namespace flashattn::cuda::sm90 {

template <class T, int kHeadDim>
Status run_bwd(const sm80::BwdParams& bp, cudaStream_t stream, int32_t num_semaphores) {
  using Tr = BwdTraits<T, kHeadDim>;
  FA_RETURN_IF_ERROR((sm80::launch_bwd_preprocess<T, kHeadDim>(bp, stream, num_semaphores)));
  if (bp.seqlen_k > 0) {
    constexpr auto kernel = bwd_kernel<T, kHeadDim>();
    FA_RETURN_IF_ERROR(opt_in_shared_memory<kernel>(Tr::kSmemBytes, "flashattn-sm90", "backward", kHeadDim));
    // One grid dimension of tasks (k-block, kv head, batch), the split ones as tail_pieces CTAs each.
    unsigned ctas = 0;
    FA_RETURN_IF_ERROR(sm80::bwd_task_ctas(bp, "flashattn-sm90", &ctas));
    // Q and dO by TMA where their bases and strides are 16-byte multiples (bp.vectorized) and the driver encodes
    // the maps; by cp.async otherwise. Varlen: one batch of total_q packed rows (a sequence's last q-block reads
    // the next one's first rows, masked like rows past seqlen_q).
    BwdMaps maps{};
    if (bp.vectorized) {
      const bool varlen = bp.cu_seqlens_q != nullptr;
      const int64_t rows = varlen ? bp.rows_q : bp.seqlen_q;
      const int batch = varlen ? 1 : bp.batch;
      maps.tma = make_tensor_map(&maps.q, bp.q, Tr::kBf16, bp.head_dim, rows, bp.num_heads, batch, bp.q_row_stride,
                                 bp.q_head_stride, bp.q_batch_stride, Tr::kBlockM).ok() &&
                 make_tensor_map(&maps.dout, bp.dout, Tr::kBf16, bp.head_dim, rows, bp.num_heads, batch,
                                 bp.do_row_stride, bp.do_head_stride, bp.do_batch_stride, Tr::kBlockM).ok();
    }
    kernel<<<ctas, Tr::kThreads, Tr::kSmemBytes, stream>>>(bp, maps);
    FA_CUDA_CHECK_LAUNCH("sm90 backward main");
  }
  return sm80::launch_bwd_convert_dq<T, kHeadDim>(bp, stream);
}

// One explicit instantiation per (dtype, head_dim) translation unit (bwd_hdim<N>_<dtype>.cu).
#define FLASHATTN_SM90_BWD_INSTANTIATE(T, D) \
  template Status run_bwd<T, D>(const sm80::BwdParams&, cudaStream_t, int32_t);

}  // namespace flashattn::cuda::sm90
