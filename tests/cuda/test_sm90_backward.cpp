// The Hopper (wgmma) backward against the fp64 reference gradient with the anchor rule (3x): the
// standard awkward-shape list in fp16 and bf16 restricted to the head dims it takes (33..256, padded inside
// the kernel to 64, 128, 192 or 256), plus shapes with many k-blocks and q-blocks per CTA
// (dQ really sums over CTAs; block_m 128 at head_dim 64, 64 at 128 and up), GQA groups looped inside one
// CTA, causal with seqlen_q > seqlen_k, element-wise loads, softcap + varlen; and the
// deterministic flag checked bit-for-bit. Skips without an sm_90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "support/harness.hpp"

namespace {

using fa_test::Case;
using fa_test::make_case;

bool hopper_head_dim(int d) { return d > 32 && d <= 256; }

std::vector<Case> sm90_backward_cases() {
  std::vector<Case> out;
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    for (const Case& c : fa_test::standard_backward_cases(dt, 256))
      if (hopper_head_dim(c.head_dim)) out.push_back(c);
    for (int d : {64, 96, 128, 192, 256}) {  // (96: the kernel of 128, zero-padded; 192, 256: the wide kernel)
      Case c = make_case(dt, 1, 300, 333, 4, 2, d);
      out.push_back(c);
      c.causal = true;
      out.push_back(c);
      c = make_case(dt, 2, 1000, 1100, 8, 2, d);  // several q-blocks and k-blocks, GQA 4
      c.causal = true;
      out.push_back(c);
      c.causal = false, c.window_left = 300, c.window_right = 0, c.softcap = 20.f;
      out.push_back(c);
      // Dropout (the kernel's dropout instance): GQA; several q-blocks and k-blocks, causal, most of P dropped;
      // a window with softcap; the last wave's pieces; varlen with element-wise loads (cp.async, dK, dV from
      // registers).
      Case dr = make_case(dt, 1, 300, 333, 4, 2, d);
      dr.dropout_p = 0.25f, dr.dropout_seed = uint64_t(d) * 1000003u;
      out.push_back(dr);
      dr = make_case(dt, 2, 1000, 1100, 8, 2, d);
      dr.causal = true, dr.dropout_p = 0.7f, dr.dropout_seed = 5;
      out.push_back(dr);
      dr.causal = false, dr.window_left = 300, dr.window_right = 0, dr.softcap = 20.f, dr.dropout_p = 0.1f;
      out.push_back(dr);
      dr = make_case(dt, 1, 700, 1000, 8, 2, d);
      dr.dropout_p = 0.2f, dr.dropout_seed = 6;
      out.push_back(dr);
      dr = make_case(dt, 1, 130, 140, 2, 2, d);
      dr.row_padding = 3, dr.dropout_p = 0.3f, dr.dropout_seed = 7, dr.seqlens_q = {0, 130, 64, 1};
      dr.seqlens_k = {9, 0, 300, 200}, dr.batch = 4, dr.seqlen_q = 130, dr.seqlen_k = 300;
      out.push_back(dr);
    }
    // ALiBi on the kernels of 192 and 256 (bwd_wide_kernel; up to 128 ALiBi goes to sm80): the shared cases at
    // those head dims, then one and per-sequence slopes with causal, windows, softcap, GQA, varlen.
    for (Case a : fa_test::alibi_cases(dt, true)) {
      a.head_dim = a.head_dim <= 64 ? 256 : 192;
      out.push_back(a);
    }
    for (int d : {160, 256}) {
      Case a = make_case(dt, 2, 1000, 1100, 8, 2, d);  // several q-blocks and k-blocks, GQA 4, causal
      a.alibi = 2, a.alibi_max_slope = 0.5f, a.causal = true;
      out.push_back(a);
      a = make_case(dt, 1, 700, 1000, 8, 2, d);  // the last wave's pieces
      a.alibi = 1, a.alibi_max_slope = 0.25f;
      out.push_back(a);
      a = make_case(dt, 1, 300, 333, 4, 1, d);
      a.alibi = 1, a.window_left = 100, a.window_right = 30, a.softcap = 5.f, a.alibi_max_slope = 4.f;
      out.push_back(a);
    }
    // The shared dropout cases at the head dims it takes (not with ALiBi: sm90 takes one or the other).
    for (const Case& dc : fa_test::dropout_cases(dt))
      if (hopper_head_dim(dc.head_dim) && dc.alibi == 0) out.push_back(dc);
    // Unmasked problems run the last wave's tasks in pieces (bwd_launch.cu, tail_split): on an H100 these 16
    // tasks run as 8 pieces each, which cross query heads and end in the partial last q-block.
    for (int d : {64, 128, 256}) out.push_back(make_case(dt, 1, 700, 1000, 8, 2, d));
    Case c = make_case(dt, 2, 300, 77, 4, 4, 128);  // causal with seqlen_q > seqlen_k: fully masked rows
    c.causal = true;
    out.push_back(c);
    c = make_case(dt, 1, 260, 260, 8, 1, 64);  // MQA: one CTA sums dK, dV over 8 query heads
    c.window_left = 70, c.window_right = 0;
    out.push_back(c);
    for (int d : {128, 256}) {
      c = make_case(dt, 1, 1, 1, 2, 2, d);  // one key
      out.push_back(c);
    }
    c = make_case(dt, 1, 300, 77, 4, 4, 256);  // causal with seqlen_q > seqlen_k at 256
    c.causal = true;
    out.push_back(c);
    for (auto [sq, sk] : {std::pair{57, 91}, std::pair{91, 57}}) {  // a band on both sides, softcap, at 256
      c = make_case(dt, 1, sq, sk, 2, 2, 256);
      c.window_left = 16, c.window_right = 8, c.softcap = 3.f;
      out.push_back(c);
    }
    c = make_case(dt, 1, 40, 0, 2, 2, 64);  // no keys: dq = 0
    out.push_back(c);
    for (int d : {40, 80, 96, 112, 136, 160, 200, 232}) {  // padded to the kernel head_dim
      c = make_case(dt, 1, 150, 170, 2, 1, d);
      c.causal = d == 40 || d == 160 || d == 200;
      out.push_back(c);
    }
    for (int d : {64, 128, 256}) {  // (the producer warpgroup's cp.async paths; its K, V, dK, dV maps)
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

// ALiBi's backward below head_dim 129 (bwd_ws_kernel): a clear error, not a wrong gradient.
TEST(Sm90BackwardAlibi, RejectedBelowHeadDim129) {
  if (!fa_test::hopper_present()) GTEST_SKIP() << "no sm_90 GPU";
  constexpr int kRows = 16, kDim = 128, kTile = kRows * kDim * 2;
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 8 * kTile + 2 * 256), cudaSuccess);
  char* base = static_cast<char*>(buf);
  fa_params p;
  fa_params_init(&p);
  p.dtype = FA_BFLOAT16, p.batch = 1, p.seqlen_q = kRows, p.seqlen_k = kRows, p.num_heads = 1, p.num_heads_kv = 1;
  p.head_dim = kDim;
  void** tensors[] = {(void**)&p.q, (void**)&p.k, (void**)&p.v, (void**)&p.o, (void**)&p.dout, &p.dq, &p.dk, &p.dv};
  for (int i = 0; i < 8; ++i) *tensors[i] = base + i * kTile;
  for (int64_t* st : {&p.q_row_stride, &p.k_row_stride, &p.v_row_stride, &p.o_row_stride, &p.do_row_stride,
                      &p.dq_row_stride, &p.dk_row_stride, &p.dv_row_stride, &p.q_head_stride, &p.k_head_stride,
                      &p.v_head_stride, &p.o_head_stride, &p.do_head_stride, &p.dq_head_stride, &p.dk_head_stride,
                      &p.dv_head_stride})
    *st = kDim;
  for (int64_t* st : {&p.q_batch_stride, &p.k_batch_stride, &p.v_batch_stride, &p.o_batch_stride, &p.do_batch_stride,
                      &p.dq_batch_stride, &p.dk_batch_stride, &p.dv_batch_stride})
    *st = kRows * kDim;
  p.lse = reinterpret_cast<float*>(base + 8 * kTile);
  const float slope = 0.5f;
  float* slopes = reinterpret_cast<float*>(base + 8 * kTile + 256);
  ASSERT_EQ(cudaMemcpy(slopes, &slope, sizeof(slope), cudaMemcpyHostToDevice), cudaSuccess);
  p.alibi_slopes = slopes;
  EXPECT_EQ(fa_backward(&p, FA_IMPL_CUDA_SM90), FA_ERROR_UNSUPPORTED);
  const std::string message = fa_last_error();
  EXPECT_NE(message.find("from head_dim 129"), std::string::npos) << message;
  cudaFree(buf);
}

// Deterministic mode: dQ sums over many k-blocks in a fixed order.
std::vector<Case> sm90_deterministic_cases() {
  std::vector<Case> out;
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    for (int d : {64, 128, 192, 256}) {
      Case c = make_case(dt, 2, 256, 1000, 4, 2, d);
      c.deterministic = true;
      out.push_back(c);
      c.causal = true;
      out.push_back(c);
      if (d > 128) {  // ALiBi (the wide kernel)
        Case a = c;
        a.alibi = 2;
        out.push_back(a);
      }
      c.dropout_p = 0.2f, c.dropout_seed = 8;  // dropout's instance
      out.push_back(c);
    }
    for (int d : {64, 128, 256}) {
      Case c = make_case(dt, 1, 1, 1, 4, 1, d);
      c.deterministic = true, c.causal = true, c.window_left = 100;
      c.seqlens_q = {700, 0, 300}, c.seqlens_k = {900, 50, 290};
      c.batch = 3, c.seqlen_q = 700, c.seqlen_k = 900;
      out.push_back(c);
    }
  }
  return out;
}

std::string param_name(const testing::TestParamInfo<Case>& info) { return fa_test::test_name(info.param.name()); }

class Sm90Backward : public testing::TestWithParam<Case> {};

TEST_P(Sm90Backward, MatchesReference) {
  if (!fa_test::hopper_present()) GTEST_SKIP() << "no sm_90 GPU";
  EXPECT_TRUE(fa_test::check_backward(GetParam(), FA_IMPL_CUDA_SM90, fa_test::Space::Cuda));
}

INSTANTIATE_TEST_SUITE_P(Standard, Sm90Backward, testing::ValuesIn(sm90_backward_cases()), param_name);

class Sm90BackwardDeterministic : public testing::TestWithParam<Case> {};

TEST_P(Sm90BackwardDeterministic, BitIdenticalAndCorrect) {
  if (!fa_test::hopper_present()) GTEST_SKIP() << "no sm_90 GPU";
  EXPECT_TRUE(fa_test::check_backward_deterministic(GetParam(), FA_IMPL_CUDA_SM90, fa_test::Space::Cuda));
  EXPECT_TRUE(fa_test::check_backward(GetParam(), FA_IMPL_CUDA_SM90, fa_test::Space::Cuda));
}

INSTANTIATE_TEST_SUITE_P(Standard, Sm90BackwardDeterministic, testing::ValuesIn(sm90_deterministic_cases()),
                         param_name);

}  // namespace
