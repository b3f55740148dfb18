// Edge cases every CPU implementation must get right: no keys (o = 0, lse = -inf), rows whose
// window excludes every key, empty batches and sequences, and scores of ~1e4 (the softmax must
// subtract the row max).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "support/harness.hpp"
#include "support/problem.hpp"

namespace {

using namespace fa_test;

const fa_impl kForwardImpls[] = {FA_IMPL_CPU_REFERENCE, FA_IMPL_CPU_FA1, FA_IMPL_CPU_FA2};
const fa_impl kBackwardImpls[] = {FA_IMPL_CPU_REFERENCE, FA_IMPL_CPU_FA2};

bool all_zero(const std::vector<float>& x) {
  for (float v : x)
    if (v != 0.f) return false;
  return true;
}

TEST(EdgeCases, NoKeysGiveZeroOutputAndMinusInfinityLse) {
  for (fa_impl impl : kForwardImpls)
    for (fa_dtype dt : {FA_FLOAT32, FA_BFLOAT16}) {
      Problem pr = make_problem(make_case(dt, 2, 9, 0, 2, 1, 64), 0);
      ASSERT_EQ(run_impl(pr, impl, Space::Host, false), "") << fa_impl_name(impl);
      EXPECT_TRUE(all_zero(pr.o.get())) << fa_impl_name(impl);
      for (float x : pr.lse) ASSERT_TRUE(std::isinf(x) && x < 0) << fa_impl_name(impl) << " lse " << x;
    }
}

TEST(EdgeCases, NoKeysGiveZeroQueryGradient) {
  for (fa_impl impl : kBackwardImpls) {
    Problem pr = make_problem(make_case(FA_FLOAT16, 2, 9, 0, 2, 1, 64), 0);
    ASSERT_EQ(run_impl(pr, impl, Space::Host, false), "");
    ASSERT_EQ(run_impl(pr, impl, Space::Host, true), "") << fa_impl_name(impl);
    EXPECT_TRUE(all_zero(pr.dq.get())) << fa_impl_name(impl);
  }
}

// A window (0, 0) with seqlen_q > seqlen_k: rows above the shifted diagonal see no key at all.
Case window_excludes_everything(fa_dtype dt) {
  Case c = make_case(dt, 2, 40, 11, 2, 2, 32);
  c.window_left = 0;
  c.window_right = 0;
  return c;
}

TEST(EdgeCases, RowsWhoseWindowExcludesEveryKeyForward) {
  for (fa_impl impl : kForwardImpls)
    for (fa_dtype dt : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
      EXPECT_TRUE(check_forward(window_excludes_everything(dt), impl, Space::Host)) << fa_impl_name(impl);
}

TEST(EdgeCases, RowsWhoseWindowExcludesEveryKeyGetZeroGradients) {
  for (fa_impl impl : kBackwardImpls) {
    Case c = window_excludes_everything(FA_FLOAT16);
    EXPECT_TRUE(check_backward(c, impl, Space::Host));
    Problem pr = make_problem(c, 0);
    ASSERT_EQ(run_impl(pr, impl, Space::Host, false), "");
    ASSERT_EQ(run_impl(pr, impl, Space::Host, true), "");
    // Rows 0..28 (diagonal i - 29 < 0) see nothing: their dq is exactly 0.
    std::vector<float> dq = pr.dq.get();
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 29; ++i)
        for (int h = 0; h < 2; ++h)
          for (int x = 0; x < 32; ++x)
            ASSERT_EQ(dq[size_t(((b * 40 + i) * 2 + h) * 32 + x)], 0.f) << fa_impl_name(impl) << " row " << i;
  }
}

TEST(EdgeCases, CausalWithMoreQueriesThanKeysMasksTheTopRows) {
  for (fa_impl impl : kForwardImpls) {
    Case c = make_case(FA_BFLOAT16, 1, 50, 7, 3, 1, 64);
    c.causal = true;
    EXPECT_TRUE(check_forward(c, impl, Space::Host)) << fa_impl_name(impl);
  }
}

// Nothing to compute: the call succeeds and writes nothing (null pointers are allowed for tensors
// without elements).
void expect_empty_call_succeeds(fa_params p, const char* what) {
  for (fa_impl impl : kForwardImpls) EXPECT_EQ(fa_forward(&p, impl), FA_OK) << what << " " << fa_impl_name(impl) << ": " << fa_last_error();
  for (fa_impl impl : kBackwardImpls) EXPECT_EQ(fa_backward(&p, impl), FA_OK) << what << " " << fa_impl_name(impl) << ": " << fa_last_error();
}

fa_params sized(int batch, int sq, int sk) {
  fa_params p;
  fa_params_init(&p);
  p.batch = batch;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.num_heads = 2;
  p.num_heads_kv = 2;
  p.head_dim = 64;
  fa_params_set_contiguous_strides(&p);
  return p;
}

TEST(EdgeCases, EmptyBatchIsANoOp) { expect_empty_call_succeeds(sized(0, 16, 16), "batch 0"); }

TEST(EdgeCases, EmptyQuerySequenceIsANoOp) {
  fa_params p = sized(3, 0, 16);
  std::vector<uint16_t> k(3 * 16 * 2 * 64, 0x3c00), v(k), dk(k.size()), dv(k.size());  // k, v have elements
  p.k = k.data();
  p.v = v.data();
  p.dk = dk.data();
  p.dv = dv.data();
  expect_empty_call_succeeds(p, "seqlen_q 0");
}

TEST(EdgeCases, EmptyQueryAndKeySequencesAreANoOp) { expect_empty_call_succeeds(sized(3, 0, 0), "seqlen_q 0, seqlen_k 0"); }

TEST(EdgeCases, VarlenBatchOfEmptySequencesIsANoOp) {
  fa_params p = sized(3, 0, 0);
  const int32_t cu[] = {0, 0, 0, 0};
  p.cu_seqlens_q = cu;
  p.cu_seqlens_k = cu;
  expect_empty_call_succeeds(p, "varlen, every sequence empty");
}

TEST(EdgeCases, EmptyQueryRowsLeaveOutputUntouched) {
  for (fa_impl impl : kForwardImpls) {
    Case c = make_case(FA_FLOAT16, 1, 1, 1, 2, 2, 64);
    c.seqlens_q = {0, 0};
    c.seqlens_k = {5, 3};
    c.seqlen_q = 0;
    c.seqlen_k = 5;
    c.batch = 2;
    Problem pr = make_problem(c, 0);
    EXPECT_EQ(run_impl(pr, impl, Space::Host, false), "") << fa_impl_name(impl);
  }
}

// Scores ~1e4: |q.k| ~ 8 at head_dim 64, times a scale of 1200.
TEST(EdgeCases, LargeScoresDoNotOverflowForward) {
  for (fa_impl impl : kForwardImpls)
    for (fa_dtype dt : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16}) {
      Case c = make_case(dt, 1, 33, 70, 2, 2, 64);
      c.softmax_scale = 1200.f;
      c.cpu_cache_bytes = 16384;
      EXPECT_TRUE(check_forward(c, impl, Space::Host)) << fa_impl_name(impl);
      c.causal = true;
      EXPECT_TRUE(check_forward(c, impl, Space::Host)) << fa_impl_name(impl);
    }
}

// Backward with scores of ~1e4. q and k hold multiples of 1/2 below 8 in magnitude, so every dot
// product is exact in fp32 whatever its order: a backward that recomputes P = exp(s - lse) then sees
// the very scores its forward saw (with random fp32 inputs the rounding of s, ~sqrt(d) u scale
// sum|q k| ~ 1e-2 at this scale, would move P by percents, which no plain implementation shows).
TEST(EdgeCases, LargeScoresDoNotOverflowBackward) {
  for (fa_impl impl : kBackwardImpls)
    for (fa_dtype dt : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16}) {
      Case c = make_case(dt, 1, 33, 70, 2, 2, 64);
      c.softmax_scale = 150.f;  // |q.k| ~ 64 * 0.5^2 * ... ~ 60: scores ~ 1e4
      c.causal = true;
      c.cpu_cache_bytes = 16384;
      Problem pr = make_problem(c, 0);
      for (float& x : pr.qf) x = std::clamp(std::round(2 * x) / 2, -7.5f, 7.5f);
      for (float& x : pr.kf) x = std::clamp(std::round(2 * x) / 2, -7.5f, 7.5f);
      pr.q.set(pr.qf);
      pr.k.set(pr.kf);
      Outputs ref = reference_backward(pr), plain = plain_backward(pr);
      ASSERT_EQ(run_impl(pr, impl, Space::Host, false), "");
      ASSERT_EQ(run_impl(pr, impl, Space::Host, true), "");
      EXPECT_EQ(join_errors(judge_backward(pr, ref, plain)), "")
          << fa_impl_name(impl) << " [" << c.name() << "] seed " << pr.seed;
    }
}

// A softcap turns scores of ~1e4 into ~cap: the same inputs stay finite and correct.
TEST(EdgeCases, SoftcapTamesLargeScores) {
  for (fa_impl impl : kForwardImpls) {
    Case c = make_case(FA_FLOAT32, 1, 20, 45, 2, 1, 64);
    c.softmax_scale = 1200.f;
    c.softcap = 30.f;
    EXPECT_TRUE(check_forward(c, impl, Space::Host)) << fa_impl_name(impl);
  }
}

// The same problem gives the same answer with one thread and with several, and whatever the
// cache budget (block sizes) is.
TEST(EdgeCases, ThreadCountAndBlockSizesDoNotChangeCorrectness) {
  for (int threads : {1, 2, 3})
    for (int64_t cache : {int64_t(1), int64_t(4096), int64_t(1) << 20}) {
      Case c = make_case(FA_FLOAT16, 2, 131, 77, 4, 2, 64);
      c.causal = true;
      c.num_threads = threads;
      c.cpu_cache_bytes = cache;
      EXPECT_TRUE(check_forward(c, FA_IMPL_CPU_FA2, Space::Host));
      EXPECT_TRUE(check_forward(c, FA_IMPL_CPU_FA1, Space::Host));
      EXPECT_TRUE(check_backward(c, FA_IMPL_CPU_FA2, Space::Host));
    }
}

}  // namespace
