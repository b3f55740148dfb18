// The last round's split of equal tasks (plain C++: the CPU tests check it). T tasks of I iterations each
// on W SMs, one CTA at a time per SM, run in rounds, and the last R = T mod W tasks run while the other
// SMs idle. Run as P pieces of I / P iterations each, they take ceil(R P / W) rounds of I / P + kPieceCost
// instead of one of I + kPieceCost (kPieceCost: a CTA's own cost in iterations: its loads, the pipeline's
// start and end, the pieces' partial results). Used by both backwards (k-block tasks over q-blocks,
// sm80/bwd_tail_split.hpp) and the Hopper forward (q tiles over key blocks, sm90/launch.cu).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/layout.hpp"
#include "common/mask.hpp"  // FA_HOST_DEVICE
#include "flashattn/flashattn.h"

namespace flashattn {

// Whether every task of p has the same iterations: fixed length (not varlen) and no mask (every query
// row sees every key). Only then is the last round's work one task's times the tasks left.
inline bool equal_tasks(const fa_params& p) {
  return !is_varlen(p) && !p.causal && p.window_left < 0 && p.window_right < 0;
}

// Piece `piece` of `pieces` of a task's `iters` iterations: [begin, end) = [I j / P, I (j + 1) / P)
// (iters * pieces < 2^31).
FA_HOST_DEVICE void piece_range(int32_t piece, int32_t pieces, int32_t iters, int32_t& begin, int32_t& end) {
  begin = piece * iters / pieces;
  end = (piece + 1) * iters / pieces;
}

struct LastRoundSplit {
  int32_t split = 0;   // R: the last R tasks are split (0: none)
  int32_t pieces = 1;  // P
};

// max_pieces caps P (e.g. at I, or at W / R for a single round).
inline LastRoundSplit last_round_split(int64_t tasks, int64_t iters, int num_sms, int64_t max_pieces) {
  constexpr double kPieceCost = 3;
  LastRoundSplit s;
  if (num_sms <= 0 || tasks <= 0 || iters <= 0) return s;
  const int rest = int(tasks % num_sms);
  double best = double(iters) + kPieceCost;
  for (int pieces = 2; pieces <= std::min<int64_t>(iters, max_pieces); ++pieces) {
    const double rounds = double((int64_t(rest) * pieces + num_sms - 1) / num_sms);
    const double cost = rounds * (double(iters) / pieces + kPieceCost);
    if (cost < best) best = cost, s.split = rest, s.pieces = pieces;
  }
  return s;
}

}  // namespace flashattn
