// Host launchers of the sm80 forward. run_fwd<T, kHeadDim> is instantiated once per (dtype,
// head_dim) in the generated fwd_hdim<N>_<dtype>.cu files; run_fwd_combine<T> in fwd_api.cu.
#pragma once

#include "cuda/common.cuh"
#include "cuda/sm80/fwd_kernel.cuh"

namespace flashattn::sm80 {

// Grid: (q-blocks, heads, batch * splits); x varies fastest, so the q-blocks sharing one head's k
// and v run side by side and reuse them from L2.
inline dim3 fwd_grid(const FwdParams& p, int block_m) {
  return dim3(unsigned((p.seqlen_q + block_m - 1) / block_m), unsigned(p.num_heads), unsigned(p.batch * p.num_splits));
}

template <class T, FwdConfig kConfig, FwdVariant kVariant = FwdVariant::kPlain>
Status run_fwd_config(const FwdParams& p, cudaStream_t stream) {
  using Traits = FwdTraits<kConfig>;
  constexpr auto kernel =
      &fwd_kernel<kConfig.head_dim, kConfig.block_m, kConfig.block_n, kConfig.warps, kConfig.stages, T, kVariant>;
  FA_RETURN_IF_ERROR(cuda::opt_in_shared_memory<kernel>(Traits::kSmemBytes, "flashattn-sm80", "forward", kConfig.head_dim));
  kernel<<<fwd_grid(p, Traits::kBlockM), Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  FA_CUDA_CHECK_LAUNCH("flashattn-sm80 forward kernel launch");
  return {};
}

// Dropout's instance (with or without ALiBi) of the table's config, in a translation unit of its own
// (fwd_hdim<N>_<dtype>_dropout.cu; fwd_hdim<N>_<dtype>.cu declares it extern).
template <class T, int kHeadDim>
Status run_fwd_dropout(const FwdParams& p, cudaStream_t stream) {
  return run_fwd_config<T, fwd_config(kHeadDim), FwdVariant::kDropout>(p, stream);
}

// The table's config for kHeadDim, or the first of its decode and few-rows configs whose tile holds
// the query rows (one q-block either way, so the split count chosen with the table's config holds).
// A paged or left-padded KV cache (decode, or a chunk of prefill) takes one instance (kGeneral): the
// decode config's, at any number of rows (more q-blocks; the split count needs one q-block, so it
// splits only decode); ALiBi that one too up to 16 rows, else its own instance of the table's config;
// dropout another one.
template <class T, int kHeadDim>
Status run_fwd(const FwdParams& p, cudaStream_t stream) {
  constexpr FwdConfig kConfig = fwd_config(kHeadDim);
  static_assert(kConfig.head_dim == kHeadDim, "no forward config for this head_dim");
  constexpr FwdConfig kDecode = fwd_decode_config(kHeadDim), kFewRows = fwd_few_rows_config(kHeadDim);
  switch (fwd_variant(p.block_table || p.leftpad_k, p.alibi_slopes != nullptr, p.dropout.on(), p.seqlen_q, kHeadDim)) {
    case FwdVariant::kGeneral: return run_fwd_config<T, kDecode, FwdVariant::kGeneral>(p, stream);
    case FwdVariant::kAlibi: return run_fwd_config<T, kConfig, FwdVariant::kAlibi>(p, stream);
    case FwdVariant::kDropout: return run_fwd_dropout<T, kHeadDim>(p, stream);
    case FwdVariant::kPlain: break;
  }
  if constexpr (kDecode.block_m < kFewRows.block_m)
    if (p.seqlen_q <= kDecode.block_m) return run_fwd_config<T, kDecode>(p, stream);
  if constexpr (kFewRows.block_m < kConfig.block_m)
    if (p.seqlen_q <= kFewRows.block_m) return run_fwd_config<T, kFewRows>(p, stream);
  return run_fwd_config<T, kConfig>(p, stream);
}

template <class T>
Status run_fwd_combine(const FwdParams& p, cudaStream_t stream) {
  const int64_t items = p.num_rows * p.num_heads;  // one warp each, 4 per CTA
  // On sm_90, a programmatic dependent of the split grid (wait_for_prior_grid).
  cuda::DeviceInfo dev;
  FA_RETURN_IF_ERROR(cuda::device_info(&dev));
  cudaLaunchAttribute pdl[1] = {};
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned((items + 3) / 4));
  config.blockDim = dim3(128);
  config.stream = stream;
  config.attrs = pdl;
  config.numAttrs = dev.sm >= 90 ? 1 : 0;
  FA_CUDA_CHECK(cudaLaunchKernelEx(&config, fwd_combine_kernel<T>, p));
  FA_CUDA_CHECK_LAUNCH("flashattn-sm80 split-KV combine launch");
  return {};
}

}  // namespace flashattn::sm80
