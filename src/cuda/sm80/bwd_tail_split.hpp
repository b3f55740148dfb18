// The backward's last-wave split, decided on the host (plain C++: the CPU tests check it): the model of
// common/last_round_split.hpp on k-block tasks (k-block, kv head, batch) of I q-block iterations. On the
// H100 (132 SMs) the d128 16k backward read 319 TFLOP/s with 2048 tasks against 326 with 4224 (32 whole
// waves; dev/sm80bwd/waves.py). Only problems whose tasks all have I iterations (no mask, not varlen), and
// not deterministic (the pieces' fp32 adds come in any order). The kernels' side: tail_sum in bwd_kernel.cuh.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/last_round_split.hpp"

namespace flashattn::sm80 {

struct TailSplit {
  int32_t tasks = 0;   // T
  int32_t split = 0;   // R: the last R tasks are split (0: none)
  int32_t pieces = 1;  // P
};

// splittable: the main kernel can run pieces (the sm80 2D and the Hopper kernels). num_sms <= 0: no split.
// piece_cost: a CTA's own cost in q-block iterations (the kernel's, bwd_config.cuh).
inline TailSplit tail_split(const fa_params& p, int block_m, int block_n, bool splittable, int num_sms,
                            double piece_cost) {
  TailSplit t;
  const int64_t tasks = int64_t((p.seqlen_k + block_n - 1) / block_n) * p.num_heads_kv * p.batch;
  t.tasks = int32_t(std::min<int64_t>(tasks, INT32_MAX));
  const int64_t iters = int64_t(p.num_heads / p.num_heads_kv) * ((p.seqlen_q + block_m - 1) / block_m);
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
  const int64_t iters = int64_t(p.num_heads / p.num_heads_kv) * ((p.seqlen_q + block_m - 1) / block_m);
  return equal_tasks(p) && !p.deterministic && iters <= max_iters;
}

}  // namespace flashattn::sm80
