// Which Hopper forward kernel a problem runs (src/cuda/sm90/fwd_config.hpp): the head_dim 64 causal pick by
// the scores the tiles compute, and the thresholds of the table, one problem on each side of each. Plain
// C++: no GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

#include "cuda/sm90/fwd_config.hpp"

namespace {

using flashattn::Mask;
using flashattn::cuda::sm90::FwdKernel;
using flashattn::cuda::sm90::fwd_kernel;

// A problem's shape and mask only (fwd_kernel reads nothing else). varlen: a non-null cu_seqlens_q, never
// read.
fa_params problem(int head_dim, int seqlen_q, int seqlen_k, bool causal = false, int window_left = -1,
                  bool varlen = false) {
  static const int32_t cu_seqlens[2] = {0, 1};
  fa_params p{};
  p.head_dim = head_dim, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k, p.causal = causal;
  p.window_left = window_left, p.window_right = window_left >= 0 ? 0 : -1;
  p.batch = 1, p.num_heads = p.num_heads_kv = 1;
  if (varlen) p.cu_seqlens_q = p.cu_seqlens_k = cu_seqlens;
  return p;
}

// The model's picks at lengths step 43 timed (docs/sm90.md; square causal, fixed length): a change to the
// geometry or the weight that moves one shows here.
TEST(Sm90FwdConfig, Hdim64CausalPicksTheKernelWithTheFewestScores) {
  struct Pick {
    int seqlen;
    FwdKernel kernel;
  };
  const Pick picks[] = {{384, FwdKernel::kHdim64Serial},
                        {512, FwdKernel::kHdim64TwoWarpgroups},    {640, FwdKernel::kHdim64TwoWarpgroups},
                        {700, FwdKernel::kHdim64ThreeWarpgroups},  {768, FwdKernel::kHdim64Serial},
                        {1024, FwdKernel::kHdim64ThreeWarpgroups}, {1536, FwdKernel::kHdim64Serial},
                        {2048, FwdKernel::kHdim64ThreeWarpgroups}, {3072, FwdKernel::kHdim64Serial},
                        {4096, FwdKernel::kHdim64ThreeWarpgroups}};
  for (const Pick& pick : picks) {
    const Mask mask(pick.seqlen, pick.seqlen, true, -1, -1);
    EXPECT_EQ(flashattn::cuda::sm90::hdim64_causal_kernel(mask, true), pick.kernel) << "seqlen " << pick.seqlen;
    if (pick.seqlen > 2048) continue;  // fwd_kernel asks the model up to 2k keys only
    // The 2 and the 3 warpgroups causal: their instantiations with the key blocks ascending.
    const FwdKernel kernel = pick.kernel == FwdKernel::kHdim64ThreeWarpgroups ? FwdKernel::kHdim64ThreeWarpgroupsCausal
                             : pick.kernel == FwdKernel::kHdim64TwoWarpgroups ? FwdKernel::kHdim64TwoWarpgroupsCausal
                                                                              : pick.kernel;
    EXPECT_EQ(fwd_kernel(problem(64, pick.seqlen, pick.seqlen, true)), kernel) << "seqlen " << pick.seqlen;
  }
}

TEST(Sm90FwdConfig, Hdim64) {
  EXPECT_EQ(fwd_kernel(problem(64, 128, 4096)), FwdKernel::kHdim64TwoWarpgroups);  // one tile of rows
  EXPECT_EQ(fwd_kernel(problem(64, 128, 4096, true)), FwdKernel::kHdim64TwoWarpgroups);
  // Without a mask the optimistic softmax, causal with the key blocks ascending; a window keeps the full one.
  EXPECT_EQ(fwd_kernel(problem(64, 129, 4096)), FwdKernel::kHdim64ThreeWarpgroupsOptimistic);
  EXPECT_EQ(fwd_kernel(problem(64, 16384, 16384)), FwdKernel::kHdim64ThreeWarpgroupsOptimistic);
  EXPECT_EQ(fwd_kernel(problem(64, 1000, 1000, false, -1, true)), FwdKernel::kHdim64ThreeWarpgroupsOptimistic);
  EXPECT_EQ(fwd_kernel(problem(64, 2000, 2000, false, 300)), FwdKernel::kHdim64ThreeWarpgroups);  // a window
  EXPECT_EQ(fwd_kernel(problem(64, 300, 1000, true, 200)), FwdKernel::kHdim64ThreeWarpgroups);
  // Causal past 2k keys the 3 warpgroups, key blocks ascending (where the model picks the serial GEMMs too);
  // up to 2k by the scores.
  EXPECT_EQ(fwd_kernel(problem(64, 3072, 3072, true)), FwdKernel::kHdim64ThreeWarpgroupsCausal);
  EXPECT_EQ(fwd_kernel(problem(64, 12288, 12288, true)), FwdKernel::kHdim64ThreeWarpgroupsCausal);
  EXPECT_EQ(fwd_kernel(problem(64, 300, 2049, true)), FwdKernel::kHdim64ThreeWarpgroupsCausal);
  EXPECT_EQ(fwd_kernel(problem(64, 9000, 9100, true, -1, true)), FwdKernel::kHdim64ThreeWarpgroupsCausal);
  EXPECT_EQ(fwd_kernel(problem(64, 1536, 1536, true)), FwdKernel::kHdim64Serial);
  EXPECT_EQ(fwd_kernel(problem(64, 300, 1000, true)), FwdKernel::kHdim64ThreeWarpgroupsCausal);
  // A window's left edge: by the scores below 8k rows, from 8k the 3 warpgroups (the full softmax).
  EXPECT_EQ(fwd_kernel(problem(64, 6144, 6144, true, 512)), FwdKernel::kHdim64TwoWarpgroups);
  EXPECT_EQ(fwd_kernel(problem(64, 8192, 8192, true, 1024)), FwdKernel::kHdim64ThreeWarpgroups);
  // The 2 warpgroups by the scores: causal with the key blocks ascending, under a window the full softmax.
  EXPECT_EQ(fwd_kernel(problem(64, 512, 512, true)), FwdKernel::kHdim64TwoWarpgroupsCausal);
  EXPECT_EQ(fwd_kernel(problem(64, 512, 512, true, 200)), FwdKernel::kHdim64TwoWarpgroups);
}

TEST(Sm90FwdConfig, Hdim128) {
  // Up to 2k keys the short-key kernel: with the optimistic softmax where no mask applies, with it and the key
  // blocks ascending causal, with the full one under a window.
  EXPECT_EQ(fwd_kernel(problem(128, 512, 512)), FwdKernel::kHdim128ShortKeysOptimistic);
  EXPECT_EQ(fwd_kernel(problem(128, 8192, 2048)), FwdKernel::kHdim128ShortKeysOptimistic);
  EXPECT_EQ(fwd_kernel(problem(128, 1000, 1000, false, -1, true)), FwdKernel::kHdim128ShortKeysOptimistic);
  EXPECT_EQ(fwd_kernel(problem(128, 1000, 1000, false, 300)), FwdKernel::kHdim128ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(128, 1024, 1024, true)), FwdKernel::kHdim128ShortKeysCausal);
  EXPECT_EQ(fwd_kernel(problem(128, 1024, 1024, true, 500)), FwdKernel::kHdim128ShortKeys);
  // Causal up to 8k keys too, and with a left edge at every length; past 8k keys block_n 144.
  EXPECT_EQ(fwd_kernel(problem(128, 8192, 8192, true)), FwdKernel::kHdim128ShortKeysCausal);
  EXPECT_EQ(fwd_kernel(problem(128, 8192, 8193, true)), FwdKernel::kHdim128LongCausal);
  EXPECT_EQ(fwd_kernel(problem(128, 12288, 12288, true)), FwdKernel::kHdim128LongCausal);
  EXPECT_EQ(fwd_kernel(problem(128, 300, 8300, true)), FwdKernel::kHdim128LongCausal);
  EXPECT_EQ(fwd_kernel(problem(128, 9000, 9100, true, -1, true)), FwdKernel::kHdim128LongCausal);
  EXPECT_EQ(fwd_kernel(problem(128, 8192, 8192, true, 2048)), FwdKernel::kHdim128ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(128, 16384, 16384, true, 4096)), FwdKernel::kHdim128ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(128, 4000, 4000, true, -1, true)), FwdKernel::kHdim128ShortKeysCausal);
  // Windows with a left edge at every length; a right edge alone past 2k keys takes the 3 warpgroups.
  EXPECT_EQ(fwd_kernel(problem(128, 3000, 3000, false, 500)), FwdKernel::kHdim128ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(128, 16384, 16384, false, 4096, true)), FwdKernel::kHdim128ShortKeys);
  fa_params right_only = problem(128, 8192, 8192);
  right_only.window_right = 1024;
  EXPECT_EQ(fwd_kernel(right_only), FwdKernel::kHdim128Serial);
  // Without a mask past 2k queries and keys: block_n 144; fewer queries: the 3 warpgroups, both splitting.
  EXPECT_EQ(fwd_kernel(problem(128, 2049, 2049)), FwdKernel::kHdim128LongNoMask);
  EXPECT_EQ(fwd_kernel(problem(128, 16384, 16384)), FwdKernel::kHdim128LongNoMask);
  EXPECT_EQ(fwd_kernel(problem(128, 2048, 4096)), FwdKernel::kHdim128SerialSplit);
  // varlen tiles differ in length: no split.
  EXPECT_EQ(fwd_kernel(problem(128, 4000, 4000, false, -1, true)), FwdKernel::kHdim128Serial);
}

// Only the short-key kernel without a mask loads a tile's next q after its k, v, and only in tiles of 4-5 key
// blocks (docs/sm90.md, step 66: slower with 3, 6 or 8 blocks and causal); its siblings copy its line, not that.
TEST(Sm90FwdConfig, Hdim128NextQAfterKeysOnlyWithoutAMask) {
  using flashattn::cuda::sm90::fwd_config;
  const auto no_mask = fwd_config(FwdKernel::kHdim128ShortKeysOptimistic);
  EXPECT_EQ(no_mask.q_after_kv_from, 4);
  EXPECT_EQ(no_mask.q_after_kv_to, 5);
  for (FwdKernel k = FwdKernel::kHdim64TwoWarpgroups; k <= flashattn::cuda::sm90::kLastFwdKernel;
       k = FwdKernel(int(k) + 1))
    if (k != FwdKernel::kHdim128ShortKeysOptimistic) EXPECT_EQ(fwd_config(k).q_after_kv_to, 0) << int(k);
}

// launch_template.cuh instantiates a head dim's kernels as one run of the enum and takes fwd_kernel's choice
// from that run: the runs are contiguous, and every choice is of the problem's head dim.
TEST(Sm90FwdConfig, EveryChoiceIsOfTheProblemsHeadDim) {
  using flashattn::cuda::sm90::fwd_config;
  using flashattn::cuda::sm90::kLastFwdKernel;
  for (int k = 0; k < int(kLastFwdKernel); ++k)
    EXPECT_LE(fwd_config(FwdKernel(k)).head_dim, fwd_config(FwdKernel(k + 1)).head_dim) << "kernel " << k;
  EXPECT_EQ(fwd_config(FwdKernel(int(kLastFwdKernel) + 1)).head_dim, 0);
  // A head_dim between the kernels' runs the next one's kernels, zero-padded (fwd_kernel_head_dim).
  for (auto [d, kernel_d] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{192, 192}, std::pair{256, 256},
                             std::pair{8, 64}, std::pair{40, 64}, std::pair{72, 128}, std::pair{96, 128},
                             std::pair{120, 128}, std::pair{136, 192}, std::pair{160, 192}, std::pair{200, 256},
                             std::pair{248, 256}})
    for (int seqlen : {1, 100, 129, 1000, 2048, 2049, 5000, 8192, 8193, 12289, 16384})
      for (bool causal : {false, true})
        for (int window : {-1, 300})
          for (bool varlen : {false, true}) {
            fa_params p = problem(d, seqlen, seqlen + 7, causal, window, varlen);
            EXPECT_EQ(fwd_config(fwd_kernel(p)).head_dim, kernel_d)
                << "head_dim " << d << " seqlen " << seqlen << " causal " << causal << " window " << window;
            // The same kernel as the kernel head dim's problem.
            fa_params same = p;
            same.head_dim = kernel_d;
            EXPECT_EQ(fwd_kernel(p), fwd_kernel(same)) << "head_dim " << d << " seqlen " << seqlen;
          }
}

// The kernel head dims: multiples of 8 up to 256, to the next of 64, 128, 192, 256; none otherwise.
TEST(Sm90FwdConfig, KernelHeadDim) {
  using flashattn::cuda::sm90::fwd_kernel_head_dim;
  for (int d = -8; d <= 300; ++d) {
    const int expected = d <= 0 || d % 8 != 0 || d > 256 ? 0 : d <= 64 ? 64 : d <= 128 ? 128 : d <= 192 ? 192 : 256;
    EXPECT_EQ(fwd_kernel_head_dim(d), expected) << "head_dim " << d;
  }
}

TEST(Sm90FwdConfig, Hdim192) {
  // block_n 64 up to 512 keys, causal up to 1k; block_n 96 up to 4k; block_n 112 past it.
  EXPECT_EQ(fwd_kernel(problem(192, 1, 1)), FwdKernel::kHdim192ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(192, 4096, 512)), FwdKernel::kHdim192ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(192, 513, 513)), FwdKernel::kHdim192);
  EXPECT_EQ(fwd_kernel(problem(192, 1024, 1024, true)), FwdKernel::kHdim192ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(192, 1025, 1025, true)), FwdKernel::kHdim192);
  EXPECT_EQ(fwd_kernel(problem(192, 4096, 4096, true)), FwdKernel::kHdim192);
  EXPECT_EQ(fwd_kernel(problem(192, 128, 4097)), FwdKernel::kHdim192LongKeys);
  EXPECT_EQ(fwd_kernel(problem(192, 16384, 16384, true)), FwdKernel::kHdim192LongKeys);
}

TEST(Sm90FwdConfig, Hdim256) {
  // Up to 1k keys ping-pong, any mask.
  EXPECT_EQ(fwd_kernel(problem(256, 512, 512)), FwdKernel::kHdim256ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(256, 1024, 1024, true)), FwdKernel::kHdim256ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(256, 640, 1000, false, 300, true)), FwdKernel::kHdim256ShortKeys);
  EXPECT_EQ(fwd_kernel(problem(256, 1025, 1025, true)), FwdKernel::kHdim256);
  EXPECT_EQ(fwd_kernel(problem(256, 512, 1025)), FwdKernel::kHdim256);
  EXPECT_EQ(fwd_kernel(problem(256, 512, 8192)), FwdKernel::kHdim256);
  EXPECT_EQ(fwd_kernel(problem(256, 512, 8193)), FwdKernel::kHdim256LongNoMask);
  EXPECT_EQ(fwd_kernel(problem(256, 16384, 16384, true)), FwdKernel::kHdim256);
}

// ALiBi: its head dim's ALiBi kernel at any shape and mask, the only ones with the bias.
TEST(Sm90FwdConfig, AlibiRunsItsOwnKernels) {
  using flashattn::cuda::sm90::fwd_config;
  static const float slopes[1] = {0.5f};
  const FwdKernel alibi[] = {FwdKernel::kHdim64Alibi, FwdKernel::kHdim128Alibi, FwdKernel::kHdim192Alibi,
                             FwdKernel::kHdim256Alibi};
  for (int i = 0; i < 4; ++i)
    for (int seqlen : {1, 129, 2049, 8193, 16384})
      for (bool causal : {false, true}) {
        fa_params p = problem(64 * (i + 1), seqlen, seqlen, causal);
        EXPECT_NE(fwd_kernel(p), alibi[i]);
        p.alibi_slopes = slopes;
        EXPECT_EQ(fwd_kernel(p), alibi[i]) << "head_dim " << 64 * (i + 1) << " seqlen " << seqlen << " causal " << causal;
      }
  for (int k = 0; k <= int(flashattn::cuda::sm90::kLastFwdKernel); ++k) {
    const FwdKernel kernel = FwdKernel(k);
    const bool is_alibi = std::find(std::begin(alibi), std::end(alibi), kernel) != std::end(alibi);
    EXPECT_EQ(fwd_config(kernel).alibi, is_alibi) << "kernel " << k;
  }
}

// Dropout likewise: its head dim's dropout kernel at any shape and mask, the only ones with it, each without
// the optimistic softmax or the last round's split (their static_assert in params.cuh says why).
TEST(Sm90FwdConfig, DropoutRunsItsOwnKernels) {
  using flashattn::cuda::sm90::fwd_config;
  const FwdKernel dropout[] = {FwdKernel::kHdim64Dropout, FwdKernel::kHdim128Dropout, FwdKernel::kHdim192Dropout,
                             FwdKernel::kHdim256Dropout};
  for (int i = 0; i < 4; ++i)
    for (int seqlen : {1, 129, 2049, 8193, 16384})
      for (bool causal : {false, true})
        for (bool varlen : {false, true}) {
          fa_params p = problem(64 * (i + 1), seqlen, seqlen, causal, -1, varlen);
          EXPECT_NE(fwd_kernel(p), dropout[i]);
          p.dropout_p = 0.1f;
          EXPECT_EQ(fwd_kernel(p), dropout[i]) << "head_dim " << 64 * (i + 1) << " seqlen " << seqlen << " causal " << causal;
        }
  for (int k = 0; k <= int(flashattn::cuda::sm90::kLastFwdKernel); ++k) {
    const FwdKernel kernel = FwdKernel(k);
    const bool is_dropout = std::find(std::begin(dropout), std::end(dropout), kernel) != std::end(dropout);
    EXPECT_EQ(fwd_config(kernel).dropout, is_dropout) << "kernel " << k;
    if (is_dropout) EXPECT_FALSE(fwd_config(kernel).optimistic_max || fwd_config(kernel).tail_split) << "kernel " << k;
  }
}

}  // namespace
