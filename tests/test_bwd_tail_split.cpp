// The backward's last-wave split (src/cuda/sm80/bwd_tail_split.hpp), decided on the host: which problems
// split, how many tasks and pieces, on the standard sweep's shapes for an H100's 132 SMs and on the edges.
// The kernels' side (pieces adding dK, dV, the last one writing) runs in the CUDA backward suites.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/sm80/bwd_tail_split.hpp"

namespace {

using flashattn::sm80::causal_task_group;
using flashattn::sm80::persistent_tasks;
using flashattn::sm80::task_pair;
using flashattn::sm80::tail_split;
using flashattn::sm80::TailSplit;

constexpr int kSms = 132, kBlockN = 128;
constexpr double kCost = 3;  // the sm80 kernel's piece cost, in iterations

fa_params problem(int batch, int seqlen, int heads, int heads_kv) {
  fa_params p;
  fa_params_init(&p);
  p.batch = batch, p.seqlen_q = p.seqlen_k = seqlen, p.num_heads = heads, p.num_heads_kv = heads_kv;
  p.head_dim = 128;
  return p;
}

// ceil(R P / W) (I / P + C): the model's cost of the split tail, in iterations.
double cost(const TailSplit& t, int iters) {
  if (t.split == 0) return iters + kCost;
  return double((int64_t(t.split) * t.pieces + kSms - 1) / kSms) * (double(iters) / t.pieces + kCost);
}

TEST(BwdTailSplit, SweepShapesSplitTheirLastWave) {
  // d128 (block_m 64): 2048 tasks at every seqlen of the sweep, 68 past 15 whole waves.
  const TailSplit t = tail_split(problem(1, 16384, 16, 16), 64, kBlockN, true, kSms, kCost);
  EXPECT_EQ(t.tasks, 2048);
  EXPECT_EQ(t.split, 2048 % kSms);
  EXPECT_GT(t.pieces, 1);
  EXPECT_LT(cost(t, 256), 0.65 * cost(TailSplit{2048, 0, 1}, 256));
  // Every P in range costs at least what the chosen one does.
  for (int pieces = 2; pieces <= 64; ++pieces)
    EXPECT_GE(cost(TailSplit{2048, 68, pieces}, 256), cost(t, 256)) << pieces;
  // d64 (block_m 128): 4096 tasks, 4 past 31 waves: many small pieces in one round.
  const TailSplit d64 = tail_split(problem(1, 16384, 32, 32), 128, kBlockN, true, kSms, kCost);
  EXPECT_EQ(d64.split, 4096 % kSms);
  EXPECT_LE(int64_t(d64.split) * d64.pieces, kSms);
  EXPECT_GE(d64.pieces, 16);
}

TEST(BwdTailSplit, ShortTasksStayWhole) {
  // 512 keys at d128: 8 iterations a task; pieces would cost more than the tail.
  EXPECT_EQ(tail_split(problem(32, 512, 16, 16), 64, kBlockN, true, kSms, kCost).split, 0);
  // Whole waves: nothing to split.
  EXPECT_EQ(tail_split(problem(1, 16384, 33, 33), 64, kBlockN, true, kSms, kCost).split, 0);
}

TEST(BwdTailSplit, APieceCostlierThanAFifthOfATaskKeepsItWhole) {
  // d128 1k: 2048 tasks of 16 iterations, 68 past 15 waves. At 3 iterations a piece, 3 pieces of 5-6
  // (2 rounds of 8.3 against 19); at the Hopper kernel's 8 the whole task (24) beats every split (3 pieces:
  // 26.7). 2k (32 iterations): both split, in 3 pieces (2 rounds of 18.7 against 40 at 8).
  const fa_params k1 = problem(16, 1024, 16, 16), k2 = problem(8, 2048, 16, 16);
  EXPECT_EQ(tail_split(k1, 64, kBlockN, true, kSms, 3).pieces, 3);
  EXPECT_EQ(tail_split(k1, 64, kBlockN, true, kSms, 8).split, 0);
  EXPECT_EQ(tail_split(k2, 64, kBlockN, true, kSms, 3).pieces, 3);
  const TailSplit t = tail_split(k2, 64, kBlockN, true, kSms, 8);
  EXPECT_EQ(t.split, 68);
  EXPECT_EQ(t.pieces, 3);
}

TEST(BwdTailSplit, OnlyUnmaskedFixedLengthNonDeterministic) {
  const fa_params base = problem(1, 16384, 16, 16);
  ASSERT_GT(tail_split(base, 64, kBlockN, true, kSms, kCost).split, 0);
  fa_params p = base;
  p.causal = 1;
  EXPECT_EQ(tail_split(p, 64, kBlockN, true, kSms, kCost).split, 0);
  p = base, p.window_left = 1000;
  EXPECT_EQ(tail_split(p, 64, kBlockN, true, kSms, kCost).split, 0);
  p = base, p.deterministic = 1;
  EXPECT_EQ(tail_split(p, 64, kBlockN, true, kSms, kCost).split, 0);
  const int32_t cu[2] = {0, 16384};
  p = base, p.cu_seqlens_q = p.cu_seqlens_k = cu;
  EXPECT_EQ(tail_split(p, 64, kBlockN, true, kSms, kCost).split, 0);
  EXPECT_EQ(tail_split(base, 64, kBlockN, false, kSms, kCost).split, 0);  // a kernel without pieces
  EXPECT_EQ(tail_split(base, 64, kBlockN, true, 0, kCost).split, 0);      // SM count unknown
}

TEST(BwdTailSplit, GqaCountsTasksPerKvHead) {
  // 8 query heads on 2 kv heads: tasks are per kv head, iterations cover the group.
  const TailSplit t = tail_split(problem(1, 1000, 8, 2), 64, kBlockN, true, kSms, kCost);
  EXPECT_EQ(t.tasks, 8 * 2);
  EXPECT_EQ(t.split, 16);
  EXPECT_EQ(t.pieces, 8);  // 4 x 16 = 64 iterations: 8 pieces of 8 in one round of 128 CTAs
}

TEST(BwdTailSplit, EmptyAndHugeProblems) {
  EXPECT_EQ(tail_split(problem(1, 0, 16, 16), 64, kBlockN, true, kSms, kCost).split, 0);
  // More tasks than the kernels' 32-bit piece arithmetic allows: whole tasks.
  EXPECT_EQ(tail_split(problem(1 << 20, 16384, 16, 16), 64, kBlockN, true, kSms, kCost).split, 0);
}

// The Hopper kernel's persistent grid: equal tasks of at most 16 q-block iterations (its threshold), counted over
// the group's query heads.
TEST(BwdPersistentTasks, ShortEqualTasksOnly) {
  EXPECT_TRUE(persistent_tasks(problem(32, 1024, 32, 32), 128, 16));   // d64 1k: 8 iterations
  EXPECT_TRUE(persistent_tasks(problem(16, 1024, 16, 16), 64, 16));    // d128 1k: 16
  EXPECT_FALSE(persistent_tasks(problem(8, 2048, 16, 16), 64, 16));    // d128 2k: 32
  EXPECT_FALSE(persistent_tasks(problem(16, 1024, 16, 4), 64, 16));    // a group of 4: 64
  EXPECT_TRUE(persistent_tasks(problem(1, 1, 16, 16), 64, 16));        // one query
  EXPECT_FALSE(persistent_tasks(problem(16, 1024, 16, 16), 64, 0));    // threshold 0: never
  const fa_params base = problem(16, 1000, 16, 16);
  ASSERT_TRUE(persistent_tasks(base, 64, 16));
  fa_params p = base;
  p.causal = 1;
  EXPECT_FALSE(persistent_tasks(p, 64, 16));
  p = base, p.window_left = 100;
  EXPECT_FALSE(persistent_tasks(p, 64, 16));
  p = base, p.deterministic = 1;
  EXPECT_FALSE(persistent_tasks(p, 64, 16));
  const int32_t cu[2] = {0, 1000};
  p = base, p.cu_seqlens_q = p.cu_seqlens_k = cu;
  EXPECT_FALSE(persistent_tasks(p, 64, 16));
}

// The causal tasks' groups: 32k query rows of (batch, kv head) pairs, heads of 8 k-blocks or more.
TEST(BwdCausalTaskGroup, PairsOfTheRowsCausalOnly) {
  fa_params p = problem(16, 1024, 16, 16);
  p.causal = 1;
  EXPECT_EQ(causal_task_group(p, kBlockN, 8, 32768), 32);      // 256 pairs of 1k rows
  fa_params q = problem(2, 8192, 16, 16);
  q.causal = 1;
  EXPECT_EQ(causal_task_group(q, kBlockN, 8, 32768), 4);
  q = problem(1, 16384, 16, 4), q.causal = 1;                  // 4 pairs: 2 a group (GQA counts kv heads)
  EXPECT_EQ(causal_task_group(q, kBlockN, 8, 32768), 2);
  q = problem(1, 1024, 16, 16), q.causal = 1;                  // fewer pairs than the rows allow: all in one
  EXPECT_EQ(causal_task_group(q, kBlockN, 8, 32768), 16);
  q = problem(32, 512, 16, 16), q.causal = 1;                  // 4 k-blocks a head: the k-block fastest
  EXPECT_EQ(causal_task_group(q, kBlockN, 8, 32768), 0);
  q = problem(1, 32768, 16, 16), q.causal = 1;                 // one pair a group
  EXPECT_EQ(causal_task_group(q, kBlockN, 8, 32768), 0);
  EXPECT_EQ(causal_task_group(p, kBlockN, 8, 0), 0);           // rows 0: off
  fa_params r = p;
  r.causal = 0;
  EXPECT_EQ(causal_task_group(r, kBlockN, 8, 32768), 0);
  r = p, r.window_left = 256;
  EXPECT_EQ(causal_task_group(r, kBlockN, 8, 32768), 0);
  const int32_t cu[2] = {0, 1024};
  r = p, r.cu_seqlens_q = r.cu_seqlens_k = cu;
  EXPECT_EQ(causal_task_group(r, kBlockN, 8, 32768), 0);
}

// Every order visits each (k-block, pair) once; in groups, a group's pairs at one k-block come together, and
// the k-blocks ascend within a group (so the deterministic order's earlier k-blocks are handed out first).
TEST(BwdTaskPair, EveryTaskOnceInEachOrder) {
  for (int n_blocks : {1, 3, 8}) {
    for (int pairs : {1, 5, 16, 37}) {
      for (int group : {0, 2, 4, 16, 37}) {
        if (group > pairs) continue;
        const flashattn::FastDivmod nb(n_blocks), gb(group * n_blocks), gp(group);
        std::vector<int> seen(size_t(n_blocks) * pairs, 0);
        int prev_group = 0, prev_n = 0;
        for (int t = 0; t < n_blocks * pairs; ++t) {
          int n_block = -1;
          const int pair = task_pair(t, group, pairs, nb, gb, gp, n_block);
          ASSERT_GE(n_block, 0);
          ASSERT_LT(n_block, n_blocks);
          ASSERT_GE(pair, 0);
          ASSERT_LT(pair, pairs);
          ++seen[size_t(pair) * n_blocks + n_block];
          if (group > 0) {
            const int g = pair / group;
            EXPECT_GE(g, prev_group) << t;
            if (g == prev_group) EXPECT_GE(n_block, prev_n) << t;
            prev_group = g, prev_n = n_block;
          } else {
            EXPECT_EQ(n_block, t % n_blocks);
          }
        }
        for (int c : seen) EXPECT_EQ(c, 1) << n_blocks << " " << pairs << " " << group;
      }
    }
  }
}

}  // namespace
