// The last round's split (src/common/last_round_split.hpp): tail_stream as the Hopper forward uses it (a
// segment per SM, at most 8 pieces a tile: sm90/launch_template.cuh, fwd_tail_plan), and piece_range, the
// backward's pieces (its plan: test_bwd_tail_split.cpp). The kernel's side (pieces merged in the workspace)
// runs in the CUDA forward suite (Sm90Forward.LastRoundSplit*).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "common/last_round_split.hpp"

namespace {

using flashattn::TailPiece;
using flashattn::TailStream;
using flashattn::tail_stream;

constexpr int kSms = 132, kMaxPieces = 8;

// Every piece of the stream, as the kernel's tail tasks find them: piece 0 of each segment, then piece 1.
std::vector<TailPiece> pieces_of(const TailStream& s) {
  std::vector<TailPiece> out;
  for (int sub = 0; sub < 2; ++sub)
    for (int32_t c = 0; c < s.segments; ++c) {
      TailPiece piece{};
      if (flashattn::tail_piece(s, c, sub, piece)) out.push_back(piece);
    }
  return out;
}

// The pieces cover each task's iterations once, in piece order; each task's piece count and first slot
// agree among its pieces; no two pieces share a workspace slot; each segment's pieces add up to it.
void expect_partition(const TailStream& s) {
  const std::string what = std::to_string(s.tasks) + " tasks x " + std::to_string(s.iters) + " / " +
                           std::to_string(s.segments) + " segments";
  std::vector<std::vector<TailPiece>> by_task(s.tasks);
  std::vector<int> slot_use(s.workspace_slots(), 0);
  for (const TailPiece& piece : pieces_of(s)) {
    ASSERT_GE(piece.task, 0) << what;
    ASSERT_LT(piece.task, s.tasks) << what;
    EXPECT_LT(piece.begin, piece.end) << what << ": an empty piece";
    ASSERT_GE(piece.first + piece.piece, 0) << what;
    ASSERT_LT(piece.first + piece.piece, s.workspace_slots()) << what;
    ++slot_use[piece.first + piece.piece];
    by_task[piece.task].push_back(piece);
  }
  for (int count : slot_use) EXPECT_LE(count, 1) << what << ": two pieces in one workspace slot";
  for (int32_t t = 0; t < s.tasks; ++t) {
    auto& pieces = by_task[t];
    std::sort(pieces.begin(), pieces.end(), [](const TailPiece& x, const TailPiece& y) { return x.begin < y.begin; });
    ASSERT_FALSE(pieces.empty()) << what << ", task " << t;
    int32_t next = 0;
    for (size_t j = 0; j < pieces.size(); ++j) {
      EXPECT_EQ(pieces[j].piece, int32_t(j)) << what << ", task " << t << ": pieces out of key order";
      EXPECT_EQ(pieces[j].pieces, int32_t(pieces.size())) << what << ", task " << t;
      EXPECT_EQ(pieces[j].first, pieces[0].first) << what << ", task " << t;
      EXPECT_EQ(pieces[j].begin, next) << what << ", task " << t;
      next = pieces[j].end;
    }
    EXPECT_EQ(next, s.iters) << what << ", task " << t;
  }
  for (int32_t c = 0; c < s.segments; ++c) {
    int64_t covered = 0;
    for (int sub = 0; sub < 2; ++sub) {
      TailPiece piece{};
      if (flashattn::tail_piece(s, c, sub, piece)) covered += piece.end - piece.begin;
    }
    EXPECT_EQ(covered, s.segment_begin(c + 1) - s.segment_begin(c)) << what << ", segment " << c;
  }
}

TEST(TailStream, PiecesPartitionEveryTask) {
  for (int32_t tasks : {1, 2, 3, 7, 16, 56, 68, 100, 131})
    for (int32_t iters : {1, 2, 5, 32, 57, 114, 128})
      for (int32_t segments : {tasks, tasks + 1, 2 * tasks, 97, 128, 132})
        if (segments >= tasks && segments <= int64_t(tasks) * iters) {
          TailStream s;
          s.tasks = tasks, s.iters = iters, s.segments = segments;
          expect_partition(s);
        }
}

TEST(TailStream, ForwardSweepTails) {
  // head_dim 128, block_n 144, 128-row tiles (past 4k queries and keys): 16k is 2048 tiles of 114 key
  // blocks, 68 left; 8k 1024 of 57, 100 left. A segment per SM, about half a tile (a piece of two tiles).
  for (auto [tiles, blocks, left] : {std::tuple{2048, 114, 68}, std::tuple{1024, 57, 100}}) {
    const TailStream s = tail_stream(tiles, blocks, kSms, kMaxPieces);
    EXPECT_EQ(s.tasks, left);
    EXPECT_EQ(s.iters, blocks);
    EXPECT_EQ(s.segments, kSms);
    EXPECT_LE(flashattn::tail_stream_max_pieces(s), 3);
    expect_partition(s);
  }
  // 3 consumer warpgroups, 192-row tiles: 1376 at 8k and 16k (64 / 128 key blocks of 128), 56 left; 4k
  // 1408 of 32, 88 left (equal pieces could not split those in one round).
  for (auto [tiles, blocks, left] : {std::tuple{1376, 64, 56}, std::tuple{1376, 128, 56}, std::tuple{1408, 32, 88}}) {
    const TailStream s = tail_stream(tiles, blocks, kSms, kMaxPieces);
    EXPECT_EQ(s.tasks, left);
    EXPECT_EQ(s.segments, kSms);
    expect_partition(s);
  }
}

TEST(TailStream, FewTilesTakeEqualPieces) {
  // 16 tiles of 128 key blocks (decode): a segment per SM would cut a tile into up to 10 pieces; 8 equal
  // pieces each instead (128 segments that end where tiles do).
  TailStream s = tail_stream(16, 128, kSms, kMaxPieces);
  EXPECT_EQ(s.tasks, 16);
  EXPECT_EQ(s.segments, 128);
  EXPECT_EQ(flashattn::tail_stream_max_pieces(s), kMaxPieces);
  expect_partition(s);
  // 27 tiles of 33 key blocks: 4 equal pieces each (108 segments of 8-9 blocks, one piece's cost) cost less
  // than 132 segments of 6-7 blocks that may hold two pieces (7 + 2 x 3 against 9 + 3).
  s = tail_stream(27, 33, kSms, kMaxPieces);
  EXPECT_EQ(s.segments, 108);
  EXPECT_EQ(flashattn::tail_stream_max_pieces(s), 4);
  expect_partition(s);
  // One tile past whole rounds: 8 pieces.
  s = tail_stream(133, 12, kSms, kMaxPieces);
  EXPECT_EQ(s.tasks, 1);
  EXPECT_EQ(s.segments, kMaxPieces);
}

TEST(TailStream, ShortAndFullTailsStayWhole) {
  // 131 tiles left of 114 key blocks: a segment of 113 blocks + 2 pieces' cost is no better than a tile.
  EXPECT_EQ(tail_stream(131, 114, kSms, kMaxPieces).tasks, 0);
  // 2 key blocks: halves cost 1 + 3 against 2 + 3 whole, worth it; 1 block cannot split.
  EXPECT_EQ(tail_stream(133, 2, kSms, kMaxPieces).segments, 2);
  EXPECT_EQ(tail_stream(133, 1, kSms, kMaxPieces).tasks, 0);
  EXPECT_EQ(tail_stream(264, 50, kSms, kMaxPieces).tasks, 0);  // whole rounds
  EXPECT_EQ(tail_stream(0, 10, kSms, kMaxPieces).tasks, 0);
  EXPECT_EQ(tail_stream(10, 0, kSms, kMaxPieces).tasks, 0);
  EXPECT_EQ(tail_stream(10, 10, 0, kMaxPieces).tasks, 0);  // SM count unknown
  EXPECT_EQ(tail_stream(10, 10, kSms, 1).tasks, 0);        // pieces not allowed
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

// even_rounds_grid: the same number of rounds as a CTA per SM, no round but the last short of a task a
// CTA, and no smaller grid does it (the sweep's 2048 tiles: 128 CTAs).
TEST(EvenRoundsGrid, SameRoundsEveryRoundFull) {
  EXPECT_EQ(flashattn::even_rounds_grid(2048, 132), 128);
  EXPECT_EQ(flashattn::even_rounds_grid(1024, 132), 128);
  EXPECT_EQ(flashattn::even_rounds_grid(133, 132), 67);
  EXPECT_EQ(flashattn::even_rounds_grid(132, 132), 132);
  EXPECT_EQ(flashattn::even_rounds_grid(5, 132), 5);
  EXPECT_EQ(flashattn::even_rounds_grid(0, 132), 1);
  for (int64_t sms : {1, 7, 78, 114, 132})
    for (int64_t tasks = 1; tasks <= 3000; ++tasks) {
      const int64_t grid = flashattn::even_rounds_grid(tasks, sms), rounds = (tasks + sms - 1) / sms;
      ASSERT_GE(grid, 1);
      ASSERT_LE(grid, std::min(tasks, sms)) << tasks << " tasks, " << sms << " SMs";
      ASSERT_EQ((tasks + grid - 1) / grid, rounds) << tasks << " tasks, " << sms << " SMs";  // as many rounds
      ASSERT_LT(grid * rounds - tasks, rounds) << tasks << " tasks, " << sms << " SMs";  // < 1 task a round idle
      if (grid > 1) ASSERT_GT((tasks + grid - 2) / (grid - 1), rounds) << "a smaller grid takes as many rounds";
    }
}

}  // namespace
