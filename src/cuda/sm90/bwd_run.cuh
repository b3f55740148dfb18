// Host side of the Hopper backward: the sm80 row kernels (D = rowsum(dO * O) and the dQ
// conversion) around the wgmma main kernel of bwd_kernel.cuh, on bp's stream.
#pragma once

#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/sm90/bwd_kernel.cuh"

// Dev switch: the producer kernel's grid a CTA an SM, each running task-grid CTAs in turn (1), or the task grid
// (0). Session 57 (H200): even to +2.7% without a mask, 0.67-0.97 causal, whose tasks differ in length and are
// dealt round-robin here (the hardware's block scheduler balances them); a dynamic scheduler would be needed.
#ifndef FLASHATTN_SM90_BWD_PERSISTENT
#define FLASHATTN_SM90_BWD_PERSISTENT 0
#endif

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
      // dK, dV (stored from shared memory by both kernels) and the producer kernel's K, V (varlen: a k-block
      // past its sequence reads the next one's keys, masked like keys past seqlen_k).
      const int64_t rows_k = varlen ? bp.rows_k : bp.seqlen_k;
      maps.tma = maps.tma &&
                 make_tensor_map(&maps.dk, bp.dk, Tr::kBf16, bp.head_dim, rows_k, bp.num_heads_kv, batch,
                                 bp.dk_row_stride, bp.dk_head_stride, bp.dk_batch_stride, Tr::kBlockN).ok() &&
                 make_tensor_map(&maps.dv, bp.dv, Tr::kBf16, bp.head_dim, rows_k, bp.num_heads_kv, batch,
                                 bp.dv_row_stride, bp.dv_head_stride, bp.dv_batch_stride, Tr::kBlockN).ok();
      if constexpr (Tr::kProducer)
        maps.tma = maps.tma &&
                   make_tensor_map(&maps.k, bp.k, Tr::kBf16, bp.head_dim, rows_k, bp.num_heads_kv, batch,
                                   bp.k_row_stride, bp.k_head_stride, bp.k_batch_stride, Tr::kBlockN).ok() &&
                   make_tensor_map(&maps.v, bp.v, Tr::kBf16, bp.head_dim, rows_k, bp.num_heads_kv, batch,
                                   bp.v_row_stride, bp.v_head_stride, bp.v_batch_stride, Tr::kBlockN).ok();
    }
    if constexpr (Tr::kProducer) {
      unsigned grid = ctas;
      if constexpr (FLASHATTN_SM90_BWD_PERSISTENT) {
        cuda::DeviceInfo dev;
        FA_RETURN_IF_ERROR(cuda::device_info(&dev));
        grid = std::min(ctas, unsigned(dev.num_sms));
      }
      kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(bp, maps, int(ctas));
    } else {
      kernel<<<ctas, Tr::kThreads, Tr::kSmemBytes, stream>>>(bp, maps);
    }
    FA_CUDA_CHECK_LAUNCH("sm90 backward main");
  }
  return sm80::launch_bwd_convert_dq<T, kHeadDim>(bp, stream);
}

// One explicit instantiation per (dtype, head_dim) translation unit (bwd_hdim<N>_<dtype>.cu).
#define FLASHATTN_SM90_BWD_INSTANTIATE(T, D) \
  template Status run_bwd<T, D>(const sm80::BwdParams&, cudaStream_t, int32_t);

}  // namespace flashattn::cuda::sm90
