// Which key blocks a tile of query rows visits: the Hopper forward's kernels (sm90/scheduler.cuh) and the
// host's choices about their tiles (sm90/fwd_config.hpp, sm90/launch_template.cuh) share it, so the CPU tests
// check those choices (tests/test_tile_geometry.cpp, tests/test_sm90_fwd_config.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/mask.hpp"

namespace flashattn {

// The key blocks [n_begin, n_end) a tile of kBlockM rows from row0 (of those, the rows in [0,
// mask.seqlen_q); row0 < 0 where the tiles are aligned to the sequence's end) must visit, from the mask of
// its rows.
template <int kBlockM, int kBlockN>
FA_HOST_DEVICE void key_block_range(int32_t row0, const Mask& mask, int32_t& n_begin, int32_t& n_end) {
  const int64_t first_row = row0 > 0 ? row0 : 0;
  const int64_t end_row = int64_t(row0) + kBlockM < mask.seqlen_q ? int64_t(row0) + kBlockM : mask.seqlen_q;
  const int64_t key_begin = mask.key_begin(first_row), key_end = mask.key_end(end_row - 1);
  n_begin = int32_t(key_begin / kBlockN);
  n_end = key_end > key_begin ? int32_t((key_end + kBlockN - 1) / kBlockN) : n_begin;
}

template <int kBlockM>
inline int32_t num_m_blocks(const Mask& mask) {
  return int32_t((int64_t(mask.seqlen_q) + kBlockM - 1) / kBlockM);
}

// The key blocks each of a sequence's num_m_blocks tiles visits, m_block 0 first; the tiles start row_shift
// rows before row 0.
template <int kBlockM, int kBlockN>
std::vector<int32_t> tile_key_blocks(const Mask& mask, int32_t num_m_blocks, int32_t row_shift) {
  std::vector<int32_t> blocks(static_cast<size_t>(num_m_blocks));
  for (int32_t m = 0; m < num_m_blocks; ++m) {
    int32_t n_begin, n_end;
    key_block_range<kBlockM, kBlockN>(m * kBlockM - row_shift, mask, n_begin, n_end);
    blocks[size_t(m)] = n_end - n_begin;
  }
  return blocks;
}

template <int kBlockM, int kBlockN>
int64_t total_key_blocks(const Mask& mask, int32_t num_m_blocks, int32_t row_shift) {
  const std::vector<int32_t> blocks = tile_key_blocks<kBlockM, kBlockN>(mask, num_m_blocks, row_shift);
  return std::accumulate(blocks.begin(), blocks.end(), int64_t(0));
}

// The tiles aligned to the sequence's end instead of its start (the first tile overhangs row 0 by the rows
// the last one would have past the end) where that visits fewer key blocks: the partial tile is then the one
// that sees the fewest keys (causal). The shift, or 0. Where kBlockM is a multiple of kBlockN the count is the
// same either way.
template <int kBlockM, int kBlockN>
int32_t end_aligned_row_shift(const Mask& mask) {
  const int32_t m_blocks = num_m_blocks<kBlockM>(mask);
  const int32_t pad = m_blocks * kBlockM - mask.seqlen_q;
  if (pad == 0 || kBlockM % kBlockN == 0) return 0;
  return total_key_blocks<kBlockM, kBlockN>(mask, m_blocks, pad) < total_key_blocks<kBlockM, kBlockN>(mask, m_blocks, 0)
             ? pad
             : 0;
}

// The scores a sequence's tiles compute, masked ones included: query rows x keys of the key blocks each
// tile visits (end_aligned: the tiles placed by end_aligned_row_shift).
template <int kBlockM, int kBlockN>
double tile_scores(const Mask& mask, bool end_aligned) {
  const int32_t shift = end_aligned ? end_aligned_row_shift<kBlockM, kBlockN>(mask) : 0;
  return double(total_key_blocks<kBlockM, kBlockN>(mask, num_m_blocks<kBlockM>(mask), shift)) * kBlockM * kBlockN;
}

}  // namespace flashattn
