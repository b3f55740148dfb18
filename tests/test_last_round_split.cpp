// The last round's split model (src/common/last_round_split.hpp) as the Hopper forward uses it: one round
// (split * pieces <= SMs), at most 8 pieces (sm90/launch_template.cuh, fwd_tail_plan). The backward's use
// of it: test_bwd_tail_split.cpp. The kernel's side (pieces merged in the workspace) runs in the CUDA
// forward suite (Sm90Forward.LastRoundSplitMatchesReference).
#include <gtest/gtest.h>

#include <algorithm>

#include "common/last_round_split.hpp"

namespace {

using flashattn::last_round_split;

constexpr int kSms = 132, kMaxPieces = 8;

flashattn::LastRoundSplit forward(int64_t tiles, int64_t key_blocks) {
  const int64_t rest = tiles % kSms;
  return last_round_split(tiles, key_blocks, kSms, std::min<int64_t>(kMaxPieces, rest ? kSms / rest : 1));
}

TEST(LastRoundSplit, ForwardSweepTails) {
  // d128 past 2k keys: 192-row tiles, 1376 at 8k and 16k (128 / 64 key blocks): 56 left, 2 pieces.
  for (int64_t blocks : {64, 128}) {
    const auto s = forward(1376, blocks);
    EXPECT_EQ(s.split, 56);
    EXPECT_EQ(s.pieces, 2);
  }
  // 4k: 1408 tiles, 88 left: two pieces of each (176) do not fit in one round.
  EXPECT_EQ(forward(1408, 32).split, 0);
}

TEST(LastRoundSplit, FewTilesSpreadOverTheGpu) {
  // 27 tiles of 33 key blocks: 4 pieces each (108 CTAs), not more (5 x 27 > 132).
  const auto s = forward(27, 33);
  EXPECT_EQ(s.split, 27);
  EXPECT_EQ(s.pieces, 4);
  // One tile past whole rounds: as many pieces as allowed.
  EXPECT_EQ(forward(133, 12).pieces, kMaxPieces);
}

TEST(LastRoundSplit, ShortTilesAndEdgesStayWhole) {
  // 2 key blocks: halves cost 1 + 3 against 2 + 3 whole, worth it; 1 block cannot split.
  EXPECT_EQ(forward(133, 2).pieces, 2);
  EXPECT_EQ(forward(133, 1).split, 0);
  EXPECT_EQ(forward(264, 50).split, 0);  // whole rounds
  EXPECT_EQ(last_round_split(0, 10, kSms, 8).split, 0);
  EXPECT_EQ(last_round_split(10, 0, kSms, 8).split, 0);
  EXPECT_EQ(last_round_split(10, 10, 0, 8).split, 0);  // SM count unknown
}

TEST(LastRoundSplit, PiecesCoverTheIterationsInOrder) {
  for (int iters : {1, 2, 7, 33, 128})
    for (int pieces = 1; pieces <= std::min(iters, 8); ++pieces) {
      int next = 0;
      for (int j = 0; j < pieces; ++j) {
        int begin = -1, end = -1;
        flashattn::piece_range(j, pieces, iters, begin, end);
        EXPECT_EQ(begin, next) << iters << " / " << pieces << ", piece " << j;
        EXPECT_GE(end - begin, iters / pieces);  // none empty, none more than one over the share
        EXPECT_LE(end - begin, (iters + pieces - 1) / pieces);
        next = end;
      }
      EXPECT_EQ(next, iters) << iters << " / " << pieces;
    }
}

}  // namespace
