// Epilogue: O / row_sum to the output dtype and the lse, written straight from the accumulator
// registers with the rows past the sequence's end predicated off (varlen tiles may overhang the
// next sequence's rows in the packed tensor).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm90/params.cuh"
#include "cuda/sm90/primitives.cuh"
#include "cuda/sm90/scheduler.cuh"

namespace flashattn::cuda::sm90 {

template <class T>
__device__ __forceinline__ void store_tile(const float (&o)[T::kHeadDim / 2], const float (&row_max)[2],
                                           const float (&row_sum)[2], const FwdParams& p, const Tile& tile,
                                           int consumer_wg) {
  constexpr float kLn2 = 0.6931471805599453f;
  const int thread = threadIdx.x % 128, lane = threadIdx.x % 32;
  const int32_t row0 = tile.m_block * T::kBlockM + 64 * consumer_wg + 16 * (thread / 32) + lane / 4;
  const int64_t batch_offset = p.cu_seqlens_q ? 0 : int64_t(tile.batch) * p.o_batch_stride;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int32_t row = row0 + 8 * i;
    if (row >= tile.seqlen_q) continue;
    // A row that saw no key: o = 0, lse = -inf.
    const float inv = row_sum[i] > 0.f ? 1.f / row_sum[i] : 0.f;
    uint32_t* out = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.o) + batch_offset +
                                                (tile.q_start + row) * p.o_row_stride +
                                                int64_t(tile.head) * p.o_head_stride + 2 * (lane % 4));
#pragma unroll
    for (int n = 0; n < T::kHeadDim / 8; ++n) out[4 * n] = pack2(o[4 * n + 2 * i] * inv, o[4 * n + 2 * i + 1] * inv, T::kBf16);
    if (p.lse && lane % 4 == 0) {
      const float lse = row_sum[i] > 0.f ? (row_max[i] + log2f(row_sum[i])) * kLn2 : -INFINITY;
      const int64_t index = p.cu_seqlens_q ? int64_t(tile.head) * p.total_q + tile.q_start + row
                                           : (int64_t(tile.batch) * p.num_heads + tile.head) * p.seqlen_q + row;
      p.lse[index] = lse;
    }
  }
}

}  // namespace flashattn::cuda::sm90
