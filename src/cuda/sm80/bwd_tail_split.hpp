// The backward's task schedule, decided on the host (plain C++: the CPU tests check it): the last wave's split,
// the Hopper kernel's persistent grid and the causal tasks' order.
// The split: the model of common/last_round_split.hpp on k-block tasks (k-block, kv head, batch) of I q-block
// iterations. On the H100 (132 SMs) the d128 16k backward read 319 TFLOP/s with 2048 tasks against 326 with 4224
// (32 whole waves; dev/sm80bwd/waves.py). Only problems whose tasks all have I iterations (no mask, not varlen),
// and not deterministic (the pieces' fp32 adds come in any order). The kernels' side: tail_sum in bwd_kernel.cuh.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/fast_divmod.hpp"
#include "common/last_round_split.hpp"

namespace flashattn::sm80 {

struct TailSplit {
  int32_t tasks = 0;   // T
  int32_t split = 0;   // R: the last R tasks are split (0: none)
  int32_t pieces = 1;  // P
};

// A task's q-block iterations without a mask: every q-block of each query head of its kv head's group.
inline int64_t task_iters(const fa_params& p, int block_m) {
  return int64_t(p.num_heads / p.num_heads_kv) * ((p.seqlen_q + block_m - 1) / block_m);
}

// splittable: the main kernel can run pieces (the sm80 2D and the Hopper kernels). num_sms <= 0: no split.
// piece_cost: a CTA's own cost in q-block iterations (the kernel's, bwd_config.cuh).
inline TailSplit tail_split(const fa_params& p, int block_m, int block_n, bool splittable, int num_sms,
                            double piece_cost) {
  TailSplit t;
  const int64_t tasks = int64_t((p.seqlen_k + block_n - 1) / block_n) * p.num_heads_kv * p.batch;
  t.tasks = int32_t(std::min<int64_t>(tasks, INT32_MAX));
  const int64_t iters = task_iters(p, block_m);
  // (The kernels compute a piece's range in 32 bits: 64 * iters < 2^31.)
  if (!splittable || p.deterministic || !equal_tasks(p) || num_sms <= 0 || tasks > INT32_MAX / 64 || iters > INT32_MAX / 64)
    return t;
  const LastRoundSplit s = last_round_split(tasks, iters, num_sms, 64, piece_cost);
  t.split = s.split, t.pieces = s.pieces;
  return t;
}

// Whether the Hopper kernel runs a CTA an SM, each taking tasks b, b + SMs, .. in turn (bwd_ws_kernel's task
// loop), instead of a CTA a task: for equal tasks (no mask, not varlen) of at most max_iters q-block iterations,
// where a new CTA's start (K, V and the first Q, dO with nothing to overlap them) weighs; a persistent CTA's
// producer loads the next task's Q, dO while the consumers finish the last. Masked tasks differ in length and
// would be dealt unevenly (the block scheduler balances a task grid). Not deterministic: its ordered dQ adds
// wait on other tasks, which a CTA a task never does on a CTA not yet started.
inline bool persistent_tasks(const fa_params& p, int block_m, int max_iters) {
  return equal_tasks(p) && !p.deterministic && task_iters(p, block_m) <= max_iters;
}

// The causal tasks' order. The block scheduler hands the tasks out in grid order as SMs free, so the last ones
// should be short. With the k-block fastest, a head's k-blocks (the first sees every query, the last only the
// diagonal) follow one another to the end of the grid, and a model of the list schedule has the calls 5-7%
// longer than their work at 512-8k keys (d128). Here the (batch, kv head) pairs go in groups of group_rows query
// rows in all, the k-block slowest within a group, so each group's tasks come longest first (0.2-2% in the model).
// One group of every pair read 0.73-0.84 of the k-block fastest at 512-2k keys (Q, dO no longer shared in the
// L2), groups of 32k rows +1.9 / 3.5% at 1k / 2k and 0.98 at 512 (session 60, H200). So heads of fewer than
// min_n_blocks k-blocks keep the k-block fastest, as do masks without a causal edge, varlen and one pair a group
// (0: the k-block fastest).
inline int causal_task_group(const fa_params& p, int block_n, int min_n_blocks, int64_t group_rows) {
  if (!p.causal || is_varlen(p) || p.window_left >= 0 || p.seqlen_q <= 0) return 0;
  if ((int64_t(p.seqlen_k) + block_n - 1) / block_n < min_n_blocks) return 0;
  const int64_t pairs = int64_t(p.num_heads_kv) * p.batch;
  const int64_t g = std::min(pairs, group_rows / p.seqlen_q);
  return g > 1 ? int(g) : 0;
}

// Task t's k-block and (batch, kv head) pair (b * num_heads_kv + kv head) in that order: group pairs a group of
// pairs in all, the last group maybe fewer, the k-block slowest within one (group 0: the k-block fastest).
// Divisors: n_blocks (k-blocks a head), group_blocks (group * n_blocks), group_pairs (group).
FA_HOST_DEVICE int task_pair(int task, int group, int pairs, const FastDivmod& n_blocks, const FastDivmod& group_blocks,
                             const FastDivmod& group_pairs, int& n_block) {
  int pair;
  if (group <= 0) {
    n_block = n_blocks.divmod(task, pair);
    return pair;
  }
  int g;
  const int r = group_blocks.divmod(task, g), in_group = pairs - g * group;
  if (in_group >= group) pair = group_pairs.divmod(r, n_block);
  else n_block = r / in_group, pair = r - n_block * in_group;
  return g * group + pair;
}

}  // namespace flashattn::sm80
