// The CPU backward passes against the fp64 reference gradient with the anchor rule (3x the plain
// same-precision error), on the standard backward list in fp32, fp16 and bf16; and the
// deterministic flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>

#include "support/harness.hpp"

namespace {

using fa_test::Case;

struct BackwardParam {
  fa_impl impl;
  Case c;
  friend void PrintTo(const BackwardParam& p, std::ostream* os) { *os << fa_impl_name(p.impl) << " [" << p.c.name() << "]"; }
};

// max_seqlen: the reference checks itself on the short cases only.
std::vector<BackwardParam> backward_params(fa_impl impl, int max_seqlen = 1 << 30) {
  std::vector<BackwardParam> out;
  for (fa_dtype dt : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
    for (const Case& c : fa_test::standard_backward_cases(dt, 1024))
      if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  for (fa_dtype dt : {FA_FLOAT32, FA_BFLOAT16})
    for (const Case& c : fa_test::alibi_cases(dt, true))
      if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  for (fa_dtype dt : {FA_FLOAT32, FA_FLOAT16})
    for (const Case& c : fa_test::dropout_cases(dt))
      if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  return out;
}

std::string param_name(const testing::TestParamInfo<BackwardParam>& info) { return fa_test::test_name(info.param.c.name()); }

class Fa2Backward : public testing::TestWithParam<BackwardParam> {};
TEST_P(Fa2Backward, GradientsMatchReference) {
  EXPECT_TRUE(fa_test::check_backward(GetParam().c, GetParam().impl, fa_test::Space::Host));
}
INSTANTIATE_TEST_SUITE_P(Standard, Fa2Backward, testing::ValuesIn(backward_params(FA_IMPL_CPU_FA2)), param_name);

// The reference backward in the input dtype on strided / packed memory against itself on fp32 copies.
class ReferenceBackward : public testing::TestWithParam<BackwardParam> {};
TEST_P(ReferenceBackward, InDtypeMatchesFp32Copy) {
  EXPECT_TRUE(fa_test::check_backward(GetParam().c, GetParam().impl, fa_test::Space::Host));
}
INSTANTIATE_TEST_SUITE_P(Standard, ReferenceBackward, testing::ValuesIn(backward_params(FA_IMPL_CPU_REFERENCE, 300)), param_name);

// deterministic = 1: two runs give bit-identical dq, dk, dv, also with several threads sharing
// key blocks (GQA, long sequences).
Case deterministic_case(fa_dtype dt, int sq, int sk, int h, int hk, bool causal) {
  Case c;
  c.dtype = dt;
  c.batch = 2;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.num_heads = h;
  c.num_heads_kv = hk;
  c.head_dim = 64;
  c.causal = causal;
  c.deterministic = true;
  c.cpu_cache_bytes = 16384;
  c.num_threads = 2;
  return c;
}

TEST(Fa2Backward, DeterministicFlagGivesBitIdenticalGradients) {
  for (fa_dtype dt : {FA_FLOAT32, FA_BFLOAT16}) {
    EXPECT_TRUE(fa_test::check_backward_deterministic(deterministic_case(dt, 200, 150, 4, 1, true), FA_IMPL_CPU_FA2,
                                                      fa_test::Space::Host));
    EXPECT_TRUE(fa_test::check_backward_deterministic(deterministic_case(dt, 129, 129, 8, 2, false), FA_IMPL_CPU_FA2,
                                                      fa_test::Space::Host));
  }
}

TEST(Fa2Backward, DeterministicGradientsAreAlsoCorrect) {
  EXPECT_TRUE(fa_test::check_backward(deterministic_case(FA_FLOAT16, 200, 150, 4, 1, true), FA_IMPL_CPU_FA2,
                                      fa_test::Space::Host));
}

}  // namespace
