// The sm80 (mma.sync) backward against the fp64 reference gradient with the anchor rule (3x): the
// standard awkward-shape list in fp16 and bf16, plus shapes specific to this kernel (many k-blocks
// per q-block so dQ really sums over CTAs, GQA groups looped inside one CTA, d split over two CTAs
// at head_dim 192, one q buffer at 256, padded head dims, the element-wise load path); and the deterministic flag
// checked bit-for-bit. Skips without a GPU.
#include <gtest/gtest.h>

#include "support/harness.hpp"

namespace {

using fa_test::Case;
using fa_test::make_case;

std::vector<Case> sm80_backward_cases() {
  std::vector<Case> out;
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    for (const Case& c : fa_test::standard_backward_cases(dt, 256)) out.push_back(c);
    // ALiBi: the main kernels' score-mod instances, 2D (head_dim 64, 128, 256) and 1D (the others, 192 with
    // head_dim split across 2 CTAs).
    for (const Case& c : fa_test::alibi_cases(dt, true)) out.push_back(c);
    for (int d : {192, 256}) {
      Case c = make_case(dt, 2, 150, 211, 4, 2, d);
      c.alibi = 2, c.alibi_max_slope = 0.5f, c.causal = true;
      out.push_back(c);
    }
    // Several k-blocks (128 keys each at head_dim <= 128, 64 above) and q-blocks (64 rows).
    for (int d : {32, 64, 96, 128, 192, 256}) {
      Case c = make_case(dt, 1, 200, 333, 4, 2, d);
      out.push_back(c);
      c.causal = true;
      out.push_back(c);
    }
    Case c = make_case(dt, 2, 300, 77, 4, 4, 128);  // causal with seqlen_q > seqlen_k: fully masked rows
    c.causal = true;
    out.push_back(c);
    c = make_case(dt, 1, 260, 260, 8, 1, 64);  // MQA: one CTA sums dK, dV over 8 query heads
    c.window_left = 70, c.window_right = 0;
    out.push_back(c);
    // Windows wider than a block over many q-blocks: a k-block's unmasked q-blocks lie between
    // masked ones on both sides (found once per CTA by binary search); GQA moves between heads.
    for (int d : {64, 128, 256}) {
      c = make_case(dt, 1, 700, 700, 4, 2, d);
      c.window_left = 300, c.window_right = 200;
      out.push_back(c);
      c.window_right = -1, c.causal = true;
      out.push_back(c);
    }
    // Dropout (the score-mod instances): the shared cases, then every kernel head dim over several k- and
    // q-blocks, causal and not, and the last wave's pieces (d64, d128: their dK, dV meet in fp32, then scaled).
    for (const Case& dc : fa_test::dropout_cases(dt)) out.push_back(dc);
    for (int d : {32, 64, 96, 128, 192, 256}) {
      c = make_case(dt, 1, 200, 333, 4, 2, d);
      c.dropout_p = 0.25f, c.dropout_seed = uint64_t(d) * 1000003u;
      out.push_back(c);
      c.causal = true, c.dropout_p = 0.7f;
      out.push_back(c);
    }
    for (int d : {64, 128, 256}) {
      c = make_case(dt, 1, 700, 1000, 8, 2, d);
      c.dropout_p = 0.1f, c.dropout_seed = 99;
      out.push_back(c);
    }
    for (int d : {32, 64, 96, 128, 192, 256}) {  // softcap: the score-mod instance; blocks masked and not
      c = make_case(dt, 1, 300, 333, 4, 2, d);
      c.softcap = 10.f;
      out.push_back(c);
      c.causal = true;
      out.push_back(c);
    }
    // Unmasked problems run the last wave's tasks in pieces (bwd_launch.cu, tail_split): on an H100 these
    // 16 tasks of 44 (d128) or 24 (d64) q-block iterations run as 8 pieces each, which cross query heads
    // and end in the partial last q-block, and whose dK, dV meet in fp32 in the workspace.
    for (int d : {64, 128, 256}) out.push_back(make_case(dt, 1, 700, 1000, 8, 2, d));
    c = make_case(dt, 1, 1, 1, 2, 2, 128);  // one key: dS = 0 exactly, dq, dk are rounding noise of D
    out.push_back(c);
    c = make_case(dt, 1, 40, 0, 2, 2, 64);  // no keys: dq = 0
    out.push_back(c);
    for (int d : {16, 80, 136, 200}) {  // padded to the next kernel head_dim
      c = make_case(dt, 1, 150, 170, 2, 1, d);
      c.causal = d == 80;
      out.push_back(c);
    }
    for (int d : {64, 256}) {
      c = make_case(dt, 1, 130, 140, 2, 2, d);  // strides not a multiple of 8: element-wise loads and stores
      c.row_padding = 3;
      out.push_back(c);
      c.softcap = 20.f, c.row_padding = 0, c.seqlens_q = {0, 130, 64, 1}, c.seqlens_k = {9, 0, 300, 200};
      c.batch = 4, c.seqlen_q = 130, c.seqlen_k = 300;  // varlen: the longest sequences
      out.push_back(c);
    }
  }
  return out;
}

// Deterministic mode: dQ sums over many k-blocks in a fixed order.
std::vector<Case> sm80_deterministic_cases() {
  std::vector<Case> out;
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    for (int d : {64, 128, 256}) {
      Case c = make_case(dt, 2, 256, 1000, 4, 2, d);
      c.deterministic = true;
      out.push_back(c);
      c.causal = true;
      out.push_back(c);
    }
    Case a = make_case(dt, 2, 256, 700, 4, 2, 128);  // ALiBi through the deterministic dQ path
    a.deterministic = true, a.alibi = 1;
    out.push_back(a);
    a.alibi = 0, a.dropout_p = 0.3f, a.dropout_seed = 4;  // and dropout
    out.push_back(a);
    Case c = make_case(dt, 1, 1, 1, 4, 1, 64);
    c.deterministic = true, c.causal = true, c.window_left = 100;
    c.seqlens_q = {700, 0, 300}, c.seqlens_k = {900, 50, 290};
    c.batch = 3, c.seqlen_q = 700, c.seqlen_k = 900;
    out.push_back(c);
  }
  return out;
}

std::string param_name(const testing::TestParamInfo<Case>& info) { return fa_test::test_name(info.param.name()); }

class Sm80Backward : public testing::TestWithParam<Case> {};

TEST_P(Sm80Backward, MatchesReference) {
  FA_SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(fa_test::check_backward(GetParam(), FA_IMPL_CUDA_SM80, fa_test::Space::Cuda));
}

INSTANTIATE_TEST_SUITE_P(Standard, Sm80Backward, testing::ValuesIn(sm80_backward_cases()), param_name);

class Sm80BackwardDeterministic : public testing::TestWithParam<Case> {};

TEST_P(Sm80BackwardDeterministic, BitIdenticalAndCorrect) {
  FA_SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(fa_test::check_backward_deterministic(GetParam(), FA_IMPL_CUDA_SM80, fa_test::Space::Cuda));
  EXPECT_TRUE(fa_test::check_backward(GetParam(), FA_IMPL_CUDA_SM80, fa_test::Space::Cuda));
}

INSTANTIATE_TEST_SUITE_P(Standard, Sm80BackwardDeterministic, testing::ValuesIn(sm80_deterministic_cases()),
                         param_name);

}  // namespace
