// Addressing of the params struct's tensors, shared by the CPU backend and the host side of CUDA.
//
// Every tensor is (batch, seqlen, heads, head_dim) with element strides and a contiguous last
// axis; in varlen mode the batch axis is folded into the rows (packed (total, heads, head_dim))
// and sequence b starts at row cu_seqlens[b].
#pragma once

#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn {

struct TensorRef {
  const void* data = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

inline TensorRef q_ref(const fa_params& p) { return {p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride}; }
inline TensorRef k_ref(const fa_params& p) { return {p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride}; }
inline TensorRef v_ref(const fa_params& p) { return {p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride}; }
inline TensorRef o_ref(const fa_params& p) { return {p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride}; }
inline TensorRef do_ref(const fa_params& p) { return {p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride}; }
inline TensorRef dq_ref(const fa_params& p) { return {p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride}; }
inline TensorRef dk_ref(const fa_params& p) { return {p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride}; }
inline TensorRef dv_ref(const fa_params& p) { return {p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride}; }

inline bool is_varlen(const fa_params& p) { return p.cu_seqlens_q != nullptr; }

// One sequence of the batch: where its rows start in the (possibly packed) tensors, and its lengths.
struct Sequence {
  int32_t batch_index = 0;
  int64_t q_start = 0, k_start = 0;  // first row (varlen: in the packed tensor; else 0)
  int32_t seqlen_q = 0, seqlen_k = 0;
};

// ALiBi's slope of sequence b, query head h (0: no ALiBi). Host-readable slopes only (the CPU backend).
inline float alibi_slope(const fa_params& p, int32_t b, int32_t h) {
  return p.alibi_slopes ? p.alibi_slopes[int64_t(b) * p.alibi_slopes_batch_stride + h] : 0.f;
}

// Host-readable cu_seqlens and seqused_k only (the CPU backend). Lengths were validated.
inline Sequence sequence(const fa_params& p, int32_t b) {
  Sequence s;
  s.batch_index = b;
  if (is_varlen(p)) {
    s.q_start = p.cu_seqlens_q[b];
    s.k_start = p.cu_seqlens_k[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    s.seqlen_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  } else {
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqused_k ? p.seqused_k[b] : p.seqlen_k;  // a KV cache's used keys
    if (p.leftpad_k) {  // a left-padded cache: the keys start at row leftpad_k[b]
      s.k_start = p.leftpad_k[b];
      s.seqlen_k -= p.leftpad_k[b];
    }
  }
  return s;
}

// Element offset of row `row` (within the sequence) of head `head` in tensor t. A paged KV cache's
// k / v row is row % page_block_size of the sequence's page row / page_block_size (host-readable
// block_table, validated).
inline int64_t row_offset(const fa_params& p, const TensorRef& t, const Sequence& s, bool is_q_side, int64_t row,
                          int64_t head) {
  if (!is_q_side && p.block_table) {
    const int64_t page = p.block_table[s.batch_index * p.block_table_batch_stride + row / p.page_block_size];
    return page * t.batch_stride + (row % p.page_block_size) * t.row_stride + head * t.head_stride;
  }
  int64_t start = is_q_side ? s.q_start : s.k_start;
  int64_t batch = is_varlen(p) ? 0 : int64_t(s.batch_index) * t.batch_stride;
  return batch + (start + row) * t.row_stride + head * t.head_stride;
}

// Index of row `row` of head `head` in lse: (batch, heads, seqlen_q) or varlen (heads, total_q).
inline int64_t lse_index(const fa_params& p, const Sequence& s, int64_t row, int64_t head) {
  if (is_varlen(p)) return head * p.total_q + s.q_start + row;
  return (int64_t(s.batch_index) * p.num_heads + head) * p.seqlen_q + row;
}

}  // namespace flashattn
