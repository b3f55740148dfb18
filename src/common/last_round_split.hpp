// The last round's split of equal tasks (plain C++: the CPU tests check it). T tasks of I iterations each
// on W SMs, one CTA at a time per SM, run in rounds, and the last R = T mod W tasks run while the other
// SMs idle. Two ways to spread them:
//   last_round_split: P pieces of I / P iterations each, ceil(R P / W) rounds of I / P + C instead of
//     one of I + C (C, piece_cost: a CTA's own cost in iterations: its loads, the pipeline's start and
//     end, the pieces' partial results; the kernel's). Both backwards (k-block tasks over q-blocks,
//     sm80/bwd_tail_split.hpp).
//   tail_stream: the R I iterations as one stream cut into S <= W equal segments, one per CTA (stream-K):
//     R I / S iterations a CTA, whatever R; a segment holds a piece of one task or of two. The Hopper
//     forward (q tiles over key blocks, sm90/launch_template.cuh).
// Or, unsplit, even_rounds_grid: the fewest CTAs that still take ceil(T / W) rounds, every round full.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/layout.hpp"
#include "common/mask.hpp"  // FA_HOST_DEVICE
#include "flashattn/flashattn.h"

namespace flashattn {

// Whether every task of p has the same iterations: fixed length (not varlen) and no mask (every query
// row sees every key). Only then is the last round's work one task's times the tasks left.
inline bool equal_tasks(const fa_params& p) {
  return !is_varlen(p) && !p.causal && p.window_left < 0 && p.window_right < 0;
}

// The grid for `tasks` equal tasks on `num_sms` SMs that runs as many rounds as one CTA per SM, with every
// round full but the last, which lacks fewer than one task a round: ceil(T / ceil(T / W)). 2048 tasks on
// 132 SMs: 128 CTAs, 16 full rounds, instead of 15 rounds of 132 and one of 68. 1 for no task.
inline int64_t even_rounds_grid(int64_t tasks, int64_t num_sms) {
  if (tasks <= 0 || num_sms <= 0) return 1;
  const int64_t rounds = (tasks + num_sms - 1) / num_sms;
  return (tasks + rounds - 1) / rounds;
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
inline LastRoundSplit last_round_split(int64_t tasks, int64_t iters, int num_sms, int64_t max_pieces,
                                       double piece_cost) {
  LastRoundSplit s;
  if (num_sms <= 0 || tasks <= 0 || iters <= 0) return s;
  const int rest = int(tasks % num_sms);
  double best = double(iters) + piece_cost;
  for (int pieces = 2; pieces <= std::min<int64_t>(iters, max_pieces); ++pieces) {
    const double rounds = double((int64_t(rest) * pieces + num_sms - 1) / num_sms);
    const double cost = rounds * (double(iters) / pieces + piece_cost);
    if (cost < best) best = cost, s.split = rest, s.pieces = pieces;
  }
  return s;
}

// The last R tasks of I iterations as one stream of T = R I iterations, cut into S segments: segment c is
// [b(c), b(c + 1)) with b(c) = floor(c T / S). With R <= S <= T a segment is 1 to I iterations, so it
// holds the end of one task, the start of the next, or both: its piece 0 lies in task floor(b(c) / I),
// its piece 1 (if any) in the task after. Task t's pieces come from segments first_segment(t) ..
// last_segment(t) in key order; they have workspace slots first_segment(t) + t + j (j: the piece's index
// in the task): distinct, below S + R - 1 (segment c's pieces take c + t, and a segment that starts in
// task t + 1 starts past every segment that touches task t).
struct TailStream {
  int32_t tasks = 0;     // R (0: no split)
  int32_t iters = 0;     // I
  int32_t segments = 0;  // S
  // 32-bit unsigned arithmetic (64-bit divisions are calls that made the kernels spill): tail_stream
  // plans only streams with R I S < 2^31, which bounds every product below.
  FA_HOST_DEVICE uint32_t total() const { return uint32_t(tasks) * uint32_t(iters); }
  FA_HOST_DEVICE uint32_t segment_begin(int32_t c) const { return uint32_t(c) * total() / uint32_t(segments); }
  // The last segment that begins at or before task t's first iteration: b(c) <= t I <=> c T < (t I + 1) S.
  FA_HOST_DEVICE int32_t first_segment(int32_t t) const {
    return int32_t(((uint32_t(t) * uint32_t(iters) + 1) * uint32_t(segments) - 1) / total());
  }
  // The last segment that begins before task t's end.
  FA_HOST_DEVICE int32_t last_segment(int32_t t) const {
    return int32_t(((uint32_t(t) + 1) * uint32_t(iters) * uint32_t(segments) - 1) / total());
  }
  FA_HOST_DEVICE int32_t workspace_slots() const { return segments + tasks - 1; }
};

// A piece of the stream: iterations [begin, end) of task `task` (of the R), the piece `piece` of its
// `pieces`; the task's piece j has workspace slot first + j.
struct TailPiece {
  int32_t task, piece, pieces, first, begin, end;
};

// Piece `sub` (0 or 1) of segment c; false when the segment has no piece 1.
FA_HOST_DEVICE bool tail_piece(const TailStream& s, int32_t c, int32_t sub, TailPiece& out) {
  const uint32_t b = s.segment_begin(c), e = s.segment_begin(c + 1), iters = uint32_t(s.iters);
  const int32_t t = int32_t(b / iters) + sub;
  const uint32_t t0 = uint32_t(t) * iters;  // the task's first iteration in the stream
  if (t0 >= e) return false;
  const int32_t c0 = s.first_segment(t);
  out.task = t;
  out.piece = c - c0;
  out.pieces = s.last_segment(t) - c0 + 1;
  out.first = c0 + t;
  out.begin = int32_t((b > t0 ? b : t0) - t0);
  out.end = int32_t((e < t0 + iters ? e : t0 + iters) - t0);
  return true;
}

// The longest a CTA runs on the stream's segments, in iterations: a segment's iterations plus kPieceCost a
// piece.
inline double tail_stream_cost(const TailStream& s, double piece_cost) {
  double worst = 0;
  for (int32_t c = 0; c < s.segments; ++c) {
    const int64_t b = s.segment_begin(c), e = s.segment_begin(c + 1);
    const int pieces = (b / s.iters + 1) * s.iters < e ? 2 : 1;
    worst = std::max(worst, double(e - b) + piece_cost * pieces);
  }
  return worst;
}

// The most pieces any task of the stream is cut into.
inline int32_t tail_stream_max_pieces(const TailStream& s) {
  int32_t most = 0;
  for (int32_t t = 0; t < s.tasks; ++t) most = std::max(most, s.last_segment(t) - s.first_segment(t) + 1);
  return most;
}

// The stream for `tasks` tasks of `iters` iterations on num_sms SMs, no task in more than max_pieces
// pieces: one segment per SM (or per iteration, if fewer), or P = W / R pieces of each task (P <=
// max_pieces, I; segments then end where tasks do: for few tasks, where a segment per SM cuts a task
// into too many pieces), whichever costs less; none (tasks = 0) where whole tasks cost no more.
inline TailStream tail_stream(int64_t tasks, int64_t iters, int num_sms, int max_pieces) {
  constexpr double kPieceCost = 3;
  TailStream none;
  if (num_sms <= 0 || tasks <= 0 || iters <= 0 || max_pieces < 2) return none;
  const int64_t rest = tasks % num_sms;
  // TailStream's 32-bit arithmetic: R I W < 2^31 (at 132 SMs and 131 tiles left, 124k key blocks: 15.9M keys
  // of 128-key blocks).
  if (rest == 0 || rest * iters * num_sms > std::numeric_limits<int32_t>::max()) return none;
  TailStream best = none;
  double best_cost = double(iters) + kPieceCost;
  auto consider = [&](int64_t segments) {
    TailStream s;
    s.tasks = int32_t(rest), s.iters = int32_t(iters), s.segments = int32_t(segments);
    if (segments <= rest || segments > s.total() || tail_stream_max_pieces(s) > max_pieces) return;
    const double cost = tail_stream_cost(s, kPieceCost);
    if (cost < best_cost) best = s, best_cost = cost;
  };
  consider(std::min<int64_t>(num_sms, rest * iters));
  consider(rest * std::min<int64_t>({max_pieces, num_sms / rest, iters}));
  return best;
}

}  // namespace flashattn
