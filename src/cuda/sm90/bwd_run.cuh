// Host side of the Hopper backward: the sm80 row kernels (D = rowsum(dO * O) and the dQ
// conversion) around the wgmma main kernel of bwd_kernel.cuh, on bp's stream.
#pragma once

#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_wide_kernel.cuh"

namespace flashattn::cuda::sm90 {

// The main kernel's launch. kDropout: dropout's instance, in a translation unit of its own
// (bwd_hdim<N>_<dtype>_dropout.cu); kAlibi: ALiBi's (the wide kernel only; bwd_hdim<N>_<dtype>_alibi.cu).
// The kernel of the config's layout: warpgroups owning keys (bwd_ws_kernel) or splitting the products
// (bwd_wide_kernel), and its traits.
template <int kHeadDim>
constexpr bool kWideBwd = sm80::sm90_bwd_config(kHeadDim).wide != 0;
template <class T, int kHeadDim, bool kDropout, bool kAlibi, bool kWide = kWideBwd<kHeadDim>>
struct BwdKernel {
  static_assert(!kAlibi, "bwd_ws_kernel has no ALiBi instance");
  using Traits = BwdTraits<T, kHeadDim>;
  static constexpr auto kernel = &bwd_ws_kernel<T, kHeadDim, kDropout>;
};
template <class T, int kHeadDim, bool kDropout, bool kAlibi>
struct BwdKernel<T, kHeadDim, kDropout, kAlibi, true> {
  using Traits = BwdWideTraits<T, kHeadDim>;
  static constexpr auto kernel = &bwd_wide_kernel<T, kHeadDim, kDropout, kAlibi>;
};

template <class T, int kHeadDim, bool kDropout, bool kAlibi = false>
Status launch_bwd_main(const sm80::BwdParams& bp, cudaStream_t stream) {
  using Tr = typename BwdKernel<T, kHeadDim, kDropout, kAlibi>::Traits;
  constexpr auto kernel = BwdKernel<T, kHeadDim, kDropout, kAlibi>::kernel;
  FA_RETURN_IF_ERROR(opt_in_shared_memory<kernel>(Tr::kSmemBytes, "flashattn-sm90", "backward", kHeadDim));
  // One grid dimension of tasks (k-block, kv head, batch), the split ones as tail_pieces CTAs each.
  unsigned ctas = 0;
  FA_RETURN_IF_ERROR(sm80::bwd_task_ctas(bp, "flashattn-sm90", &ctas));
  // Q, dO, K, V and dK, dV by TMA where their bases and strides are 16-byte multiples (bp.vectorized) and the
  // driver encodes the maps; by cp.async and register stores otherwise. Varlen: one batch of total_q (total_k)
  // packed rows (a sequence's last q-block (k-block) reads the next one's first rows, masked like rows past
  // seqlen_q (seqlen_k); such a k-block stores its dK, dV from registers).
  BwdMaps maps{};
  if (bp.vectorized) {
    const bool varlen = bp.cu_seqlens_q != nullptr;
    const int64_t rows = varlen ? bp.rows_q : bp.seqlen_q, rows_k = varlen ? bp.rows_k : bp.seqlen_k;
    const int batch = varlen ? 1 : bp.batch;
    auto map = [&](CUtensorMap* m, const void* base, int64_t rows_, int heads, int64_t row_stride, int64_t head_stride,
                   int64_t batch_stride, int box_rows) {
      return make_tensor_map(m, base, Tr::kBf16, bp.head_dim, rows_, heads, batch, row_stride, head_stride,
                             batch_stride, box_rows).ok();
    };
    const int hq = bp.num_heads, hk = bp.num_heads_kv, bm = Tr::kBlockM, bn = Tr::kBlockN;
    maps.tma = map(&maps.q, bp.q, rows, hq, bp.q_row_stride, bp.q_head_stride, bp.q_batch_stride, bm) &&
               map(&maps.dout, bp.dout, rows, hq, bp.do_row_stride, bp.do_head_stride, bp.do_batch_stride, bm) &&
               map(&maps.k, bp.k, rows_k, hk, bp.k_row_stride, bp.k_head_stride, bp.k_batch_stride, bn) &&
               map(&maps.v, bp.v, rows_k, hk, bp.v_row_stride, bp.v_head_stride, bp.v_batch_stride, bn) &&
               map(&maps.dk, bp.dk, rows_k, hk, bp.dk_row_stride, bp.dk_head_stride, bp.dk_batch_stride, bn) &&
               map(&maps.dv, bp.dv, rows_k, hk, bp.dv_row_stride, bp.dv_head_stride, bp.dv_batch_stride, bn);
  }
  // A CTA a task, or a CTA an SM taking the tasks in turn (bp.persistent_ctas: short equal tasks).
  const unsigned grid = bp.persistent_ctas > 0 ? std::min(ctas, unsigned(bp.persistent_ctas)) : ctas;
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(bp, maps, int(ctas));
  FA_CUDA_CHECK_LAUNCH("sm90 backward main");
  return {};
}

// ALiBi runs the wide kernel's instance, not with dropout (validate.cpp turns the other cases away first).
template <class T, int kHeadDim>
Status run_bwd(const sm80::BwdParams& bp, cudaStream_t stream, int32_t num_semaphores) {
  constexpr bool kAlibi = kWideBwd<kHeadDim>;
  if (bp.alibi_slopes && (!kAlibi || bp.dropout.on()))
    return unsupported("flashattn-sm90 backward: ALiBi at head_dim %d%s (it takes ALiBi from 129 on, without dropout)",
                       bp.head_dim, bp.dropout.on() ? " with dropout" : "");
  FA_RETURN_IF_ERROR((sm80::launch_bwd_preprocess<T, kHeadDim>(bp, stream, num_semaphores)));
  if (bp.seqlen_k > 0)
    FA_RETURN_IF_ERROR((bp.dropout.on()   ? launch_bwd_main<T, kHeadDim, true>(bp, stream)
                        : bp.alibi_slopes ? launch_bwd_main<T, kHeadDim, false, kAlibi>(bp, stream)
                                          : launch_bwd_main<T, kHeadDim, false>(bp, stream)));
  return sm80::launch_bwd_convert_dq<T, kHeadDim>(bp, stream);
}

// The explicit instantiations of one (dtype, head_dim): run_bwd in bwd_hdim<N>_<dtype>.cu, dropout's main kernel
// in bwd_hdim<N>_<dtype>_dropout.cu, ALiBi's in bwd_hdim<N>_<dtype>_alibi.cu (the wide kernel's head dims).
#define FLASHATTN_SM90_BWD_INSTANTIATE(T, D)                                                        \
  extern template Status launch_bwd_main<T, D, true>(const sm80::BwdParams&, cudaStream_t);       \
  extern template Status launch_bwd_main<T, D, false, true>(const sm80::BwdParams&, cudaStream_t); \
  template Status run_bwd<T, D>(const sm80::BwdParams&, cudaStream_t, int32_t);
#define FLASHATTN_SM90_BWD_INSTANTIATE_DROPOUT(T, D) \
  template Status launch_bwd_main<T, D, true>(const sm80::BwdParams&, cudaStream_t);
#define FLASHATTN_SM90_BWD_INSTANTIATE_ALIBI(T, D) \
  template Status launch_bwd_main<T, D, false, true>(const sm80::BwdParams&, cudaStream_t);

}  // namespace flashattn::cuda::sm90
