// Every CPU forward implementation against the fp64 reference with the anchor rule, on the
// standard awkward-shape list (head dims, seqlens, masks, GQA/MQA, varlen, strided views) in
// fp32, fp16 and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>

#include "support/harness.hpp"

namespace {

using fa_test::Case;

struct ForwardParam {
  fa_impl impl;
  Case c;
  friend void PrintTo(const ForwardParam& p, std::ostream* os) { *os << fa_impl_name(p.impl) << " [" << p.c.name() << "]"; }
};

// max_seqlen: the reference checks itself on the short cases only (the long ones run the same code
// on more rows, at the cost of the suite's time).
std::vector<ForwardParam> forward_params(fa_impl impl, int max_seqlen = 1 << 30) {
  std::vector<ForwardParam> out;
  for (fa_dtype dt : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
    for (const Case& c : fa_test::standard_forward_cases(dt, 1024))
      if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  for (fa_dtype dt : {FA_FLOAT32, FA_BFLOAT16}) {
    for (const Case& c : fa_test::kv_cache_cases(dt))
      if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
    for (const Case& c : fa_test::leftpad_kv_cases(dt))
      if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  }
  for (fa_dtype dt : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16})
    for (const Case& c : fa_test::alibi_cases(dt, false))
      if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  for (fa_dtype dt : {FA_FLOAT32, FA_BFLOAT16})  // dropout
      for (const Case& c : fa_test::dropout_cases(dt))
        if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  // GQA with few query rows, where FA2 puts a kv head's query heads in one block (its lanes: query row r % rows of
  // head h + r / rows): decode, a few rows causal past the diagonal, a window with softcap, MQA, varlen with an
  // empty sequence, fp16.
  {
    auto with = [](Case c, auto&& f) {
      f(c);
      return c;
    };
    const std::vector<Case> grouped = {
        fa_test::make_case(FA_FLOAT32, 2, 1, 1000, 8, 2, 64),
        with(fa_test::make_case(FA_FLOAT32, 1, 3, 700, 16, 4, 128), [](Case& c) { c.causal = true; }),
        with(fa_test::make_case(FA_BFLOAT16, 2, 2, 517, 6, 2, 96),
             [](Case& c) { c.window_left = 100, c.window_right = 0, c.softcap = 5.f; }),
        fa_test::make_case(FA_FLOAT16, 1, 2, 333, 16, 1, 32),
        fa_test::varlen(fa_test::make_case(FA_FLOAT32, 1, 1, 1, 8, 2, 64), {1, 0, 3}, {300, 17, 129}),
    };
    for (const Case& c : grouped)
      if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  }
  // Paged: one row a page, a prime, 16 (as vLLM's), one the GPU takes.
  for (const Case& c : fa_test::paged_kv_cases(FA_BFLOAT16, {1, 7, 16, 128}))
    if (std::max(c.seqlen_q, c.seqlen_k) <= max_seqlen) out.push_back({impl, c});
  return out;
}

std::string param_name(const testing::TestParamInfo<ForwardParam>& info) { return fa_test::test_name(info.param.c.name()); }

class Fa2Forward : public testing::TestWithParam<ForwardParam> {};
TEST_P(Fa2Forward, MatchesReference) { EXPECT_TRUE(fa_test::check_forward(GetParam().c, GetParam().impl, fa_test::Space::Host)); }
INSTANTIATE_TEST_SUITE_P(Standard, Fa2Forward, testing::ValuesIn(forward_params(FA_IMPL_CPU_FA2)), param_name);

class Fa1Forward : public testing::TestWithParam<ForwardParam> {};
TEST_P(Fa1Forward, MatchesReference) { EXPECT_TRUE(fa_test::check_forward(GetParam().c, GetParam().impl, fa_test::Space::Host)); }
INSTANTIATE_TEST_SUITE_P(Standard, Fa1Forward, testing::ValuesIn(forward_params(FA_IMPL_CPU_FA1)), param_name);

// The reference in the input dtype, on strided / packed memory, against itself on contiguous fp32
// copies: checks its addressing of every layout and its rounding of the output.
class ReferenceForward : public testing::TestWithParam<ForwardParam> {};
TEST_P(ReferenceForward, InDtypeMatchesFp32Copy) {
  EXPECT_TRUE(fa_test::check_forward(GetParam().c, GetParam().impl, fa_test::Space::Host));
}
INSTANTIATE_TEST_SUITE_P(Standard, ReferenceForward, testing::ValuesIn(forward_params(FA_IMPL_CPU_REFERENCE, 300)), param_name);

}  // namespace
