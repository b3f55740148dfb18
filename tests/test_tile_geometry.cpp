// The key blocks a tile visits (src/common/tile_geometry.hpp: the Hopper forward's kernels and the host's
// choices about their tiles): key_block_range against the mask row by row, the end-aligned tiles, the
// scores the tiles compute (the head_dim 64 causal pick made from them: test_sm90_fwd_config.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "common/tile_geometry.hpp"

namespace {

using flashattn::Mask;

// Every visible key of the tile's rows lies in its key blocks, and the first and last of them hold one.
template <int kBlockM, int kBlockN>
void expect_tight_cover(const Mask& mask, int32_t row0, const std::string& what) {
  int32_t n_begin, n_end;
  flashattn::key_block_range<kBlockM, kBlockN>(row0, mask, n_begin, n_end);
  int64_t lo = INT64_MAX, hi = -1;  // the tile's visible keys
  for (int64_t i = std::max(row0, 0); i < std::min<int64_t>(int64_t(row0) + kBlockM, mask.seqlen_q); ++i)
    for (int64_t j = mask.key_begin(i); j < mask.key_end(i); ++j) lo = std::min(lo, j), hi = std::max(hi, j);
  if (hi < 0) {
    EXPECT_EQ(n_end, n_begin) << what << ": no visible key, yet blocks to visit";
    return;
  }
  EXPECT_LE(int64_t(n_begin) * kBlockN, lo) << what;
  EXPECT_GT(int64_t(n_begin + 1) * kBlockN, lo) << what;
  EXPECT_GT(int64_t(n_end) * kBlockN, hi) << what;
  EXPECT_LE(int64_t(n_end - 1) * kBlockN, hi) << what;
}

template <int kBlockM, int kBlockN>
void check_random_masks(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> len(1, 700), win(-1, 300), shift(0, kBlockM - 1);
  for (int trial = 0; trial < 300; ++trial) {
    const int sq = len(rng), sk = len(rng);
    const bool causal = trial % 3 != 0;
    const Mask mask(sq, sk, causal, win(rng), causal ? 0 : win(rng));
    const int32_t row_shift = trial % 2 ? shift(rng) : 0;
    const int32_t m_blocks = (sq + row_shift + kBlockM - 1) / kBlockM;  // tiles that hold a row of the sequence
    const std::string what = "sq " + std::to_string(sq) + " sk " + std::to_string(sk) + " left " +
                             std::to_string(mask.left) + " right " + std::to_string(mask.right) + " shift " +
                             std::to_string(row_shift);
    for (int32_t m = 0; m < m_blocks; ++m) expect_tight_cover<kBlockM, kBlockN>(mask, m * kBlockM - row_shift, what);
  }
}

TEST(TileGeometry, KeyBlockRangeIsTheTightCoverOfTheVisibleKeys) {
  check_random_masks<128, 128>(1);
  check_random_masks<192, 128>(2);
  check_random_masks<192, 192>(3);
  check_random_masks<128, 144>(4);
  check_random_masks<128, 64>(5);
}

TEST(TileGeometry, EndAlignedTilesVisitFewerKeyBlocks) {
  // 192-row tiles over 128-key blocks, causal 4096: 22 tiles; aligned to the end 363 blocks, to the start 384.
  const Mask causal4k(4096, 4096, true, -1, -1);
  EXPECT_EQ((flashattn::total_key_blocks<192, 128>(causal4k, 22, 0)), 384);
  EXPECT_EQ((flashattn::end_aligned_row_shift<192, 128>(causal4k)), 22 * 192 - 4096);
  EXPECT_EQ((flashattn::total_key_blocks<192, 128>(causal4k, 22, 22 * 192 - 4096)), 363);
  // block_m a multiple of block_n, or no partial tile: no shift.
  EXPECT_EQ((flashattn::end_aligned_row_shift<192, 192>(causal4k)), 0);
  EXPECT_EQ((flashattn::end_aligned_row_shift<128, 128>(Mask(1000, 1000, true, -1, -1))), 0);
  EXPECT_EQ((flashattn::end_aligned_row_shift<192, 128>(Mask(3072, 3072, true, -1, -1))), 0);
  // Without a mask every tile visits every key block either way: no shift.
  EXPECT_EQ((flashattn::end_aligned_row_shift<192, 128>(Mask(1000, 1000, false, -1, -1))), 0);
}

TEST(TileGeometry, TileScoresCountTheVisitedBlocks) {
  const Mask causal512(512, 512, true, -1, -1);
  EXPECT_EQ((flashattn::tile_scores<128, 128>(causal512, true)), 10.0 * 128 * 128);  // 1 + 2 + 3 + 4 blocks
  EXPECT_EQ((flashattn::tile_scores<192, 192>(causal512, true)), 6.0 * 192 * 192);   // 1 + 2 + 3
  // Tiles from row -64: 128, 320 and 512 keys' worth; from row 0: 192, 384, 512 (2 + 3 + 4 blocks).
  EXPECT_EQ((flashattn::tile_scores<192, 128>(causal512, true)), 8.0 * 192 * 128);
  EXPECT_EQ((flashattn::tile_scores<192, 128>(causal512, false)), 9.0 * 192 * 128);
  EXPECT_EQ((flashattn::tile_scores<192, 128>(Mask(512, 512, false, -1, -1), true)), 12.0 * 192 * 128);
}

}  // namespace
