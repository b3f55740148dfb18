// The mask of one sequence as a key range per query row, shared by the CPU and CUDA backends.
//
// Row i of a sequence (lengths seqlen_q, seqlen_k) sees keys j in [key_begin(i), key_end(i)):
// causal and the sliding window are both bands around the bottom-right-aligned diagonal
// j = i + seqlen_k - seqlen_q, so one (left, right) pair describes every mask option.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA_HOST_DEVICE inline
#endif

namespace flashattn {

struct Mask {
  int32_t seqlen_q = 0, seqlen_k = 0;
  int32_t left = -1, right = -1;  // -1: unbounded; causal sets right = 0

  Mask() = default;
  FA_HOST_DEVICE Mask(int32_t sq, int32_t sk, bool causal, int32_t window_left, int32_t window_right)
      : seqlen_q(sq), seqlen_k(sk), left(window_left), right(window_right) {
    if (causal) right = 0;
  }

  FA_HOST_DEVICE int64_t diagonal(int64_t i) const { return i + seqlen_k - seqlen_q; }

  // First visible key of row i (may exceed key_end: then the row is fully masked).
  FA_HOST_DEVICE int64_t key_begin(int64_t i) const {
    int64_t lo = left < 0 ? 0 : diagonal(i) - left;
    return lo < 0 ? 0 : lo;
  }
  // One past the last visible key of row i.
  FA_HOST_DEVICE int64_t key_end(int64_t i) const {
    int64_t hi = right < 0 ? int64_t(seqlen_k) : diagonal(i) + right + 1;
    return hi > seqlen_k ? int64_t(seqlen_k) : (hi < 0 ? 0 : hi);
  }
  FA_HOST_DEVICE bool visible(int64_t i, int64_t j) const { return j >= key_begin(i) && j < key_end(i); }
  FA_HOST_DEVICE bool is_banded() const { return left >= 0 || right >= 0; }
  // |diagonal(i) - j|: ALiBi's distance (its bias is -slope times it).
  FA_HOST_DEVICE int64_t diagonal_distance(int64_t i, int64_t j) const {
    const int64_t d = diagonal(i) - j;
    return d < 0 ? -d : d;
  }
};

}  // namespace flashattn
