// The sm80 (mma.sync) forward against the fp64 reference with the anchor rule: the standard
// awkward-shape list in fp16 and bf16, plus the split-KV path (forced and heuristic), the decode
// configs (query rows that fit a 16-row tile) and the element-wise load path (strides not a multiple
// of 8 elements). Skips without a GPU.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "cuda/common.cuh"
#include "support/harness.hpp"

namespace {

using fa_test::Case;

std::vector<Case> sm80_forward_cases() {
  std::vector<Case> out;
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    for (const Case& c : fa_test::standard_forward_cases(dt, 256)) out.push_back(c);
    for (const Case& c : fa_test::kv_cache_cases(dt)) out.push_back(c);    // seqused_k
    for (const Case& c : fa_test::leftpad_kv_cases(dt)) out.push_back(c);  // leftpad_k
    // ALiBi: the general instance (up to 16 query rows, or with a KV cache) and the ALiBi instance of
    // the table's tiles; the latter over several q- and k-blocks, causal, windowed, softcapped, varlen.
    for (const Case& c : fa_test::alibi_cases(dt, false)) out.push_back(c);
    for (int d : {32, 64, 128, 256}) {
      Case a = fa_test::make_case(dt, 2, 300, 333, 4, 2, d);
      a.alibi = 2, a.alibi_max_slope = 0.5f;
      out.push_back(a);
      a.causal = true;
      out.push_back(a);
    }
    Case a = fa_test::varlen(fa_test::make_case(dt, 1, 1, 1, 4, 4, 96), {200, 17, 0, 130}, {180, 300, 40, 1});
    a.alibi = 1, a.alibi_max_slope = 1.f, a.softcap = 5.f, a.window_left = 100, a.window_right = 20;
    out.push_back(a);
    // Dropout (the table's tiles at any number of rows, FwdVariant::kDropout): the shared cases, then several q-
    // and k-blocks at every kernel head dim, forced splits, a decode step with GQA (not the GQA decode
    // view, whose rows are heads).
    for (const Case& c : fa_test::dropout_cases(dt)) out.push_back(c);
    for (int d : {32, 64, 96, 128, 192, 256}) {
      Case c = fa_test::make_case(dt, 2, 300, 333, 4, 2, d);
      c.dropout_p = 0.15f, c.dropout_seed = uint64_t(d) << 40 | 77;
      out.push_back(c);
      c.causal = true, c.dropout_p = 0.6f;
      if (d == 64 || d == 128 || d == 256) out.push_back(c);
    }
    Case ds = fa_test::make_case(dt, 2, 70, 1000, 4, 2, 128);
    ds.dropout_p = 0.2f, ds.dropout_seed = 5, ds.num_splits = 3, ds.causal = true;
    out.push_back(ds);
    ds = fa_test::make_case(dt, 2, 1, 3000, 8, 2, 64);
    ds.dropout_p = 0.1f, ds.dropout_seed = 6;
    out.push_back(ds);
    // block_table: pages holding whole key blocks (256; 64 at head_dim <= 128 but 64's block_n 128),
    // pages looked up a row at a time (16, 7), and pages of both kinds of block (100: a block inside a
    // page takes one lookup, one across two a lookup per row).
    for (const Case& c : fa_test::paged_kv_cases(dt, {256, 64, 16, 7, 100})) out.push_back(c);
    // Split-KV: forced splits over a few key blocks each, causal and windowed; then the heuristic's
    // own choice on a decode-like problem (one q-block per head, long keys, GQA).
    Case s;
    s.dtype = dt, s.batch = 2, s.seqlen_q = 70, s.seqlen_k = 1000, s.num_heads = 4, s.num_heads_kv = 2, s.head_dim = 128;
    for (int splits : {2, 3, 7}) {
      s.num_splits = splits;
      s.causal = false;
      out.push_back(s);
      s.causal = true;
      out.push_back(s);
    }
    s.causal = false, s.window_left = 100, s.window_right = 50, s.num_splits = 5;
    out.push_back(s);
    Case decode;
    decode.dtype = dt, decode.batch = 1, decode.seqlen_q = 1, decode.seqlen_k = 4000, decode.num_heads = 8;
    decode.num_heads_kv = 2, decode.head_dim = 64;
    out.push_back(decode);
    decode.seqlens_q = {1, 0, 3}, decode.seqlens_k = {3000, 10, 0};  // varlen decode with empty sequences
    out.push_back(decode);
    // The decode configs (16-row tiles whose warps split the keys, then 64-row tiles; head dims up
    // to 128): query rows at and past their tiles, causal, split or not; a padded head dim (80 runs
    // the 96 kernel).
    for (int rows : {16, 17, 65}) {
      Case r;
      r.dtype = dt, r.batch = 2, r.seqlen_q = rows, r.seqlen_k = 3000, r.num_heads = 4, r.num_heads_kv = 2;
      r.head_dim = 128, r.causal = true;
      out.push_back(r);
    }
    // The 16-row tiles with a sliding window (its left edge moves a key a row, across the warps' key
    // slices), then with softcap and forced splits too.
    for (int d : {64, 128}) {
      Case w = fa_test::make_case(dt, 2, 9, 3000, 4, 4, d);
      w.window_left = 700, w.window_right = 0;
      out.push_back(w);
      w.softcap = 5.f, w.softmax_scale = 0.3f, w.num_splits = 3;
      out.push_back(w);
    }
    for (int d : {32, 80, 128}) {
      Case r;
      r.dtype = dt, r.batch = 3, r.seqlen_q = 1, r.seqlen_k = d == 128 ? 5001 : 2500, r.num_heads = 16, r.num_heads_kv = 2, r.head_dim = d;
      out.push_back(r);
    }
    // Scores of a few units and more (scale 0.6 on unit-normal q, k): a row's max keeps rising by
    // more than 2^8 in p over several key blocks, so o is rescaled past the first block (the kernel
    // keeps a stale max below that, and with the default scale that rescale would hardly run).
    for (int d : {64, 128}) {
      Case c = fa_test::make_case(dt, 1, 200, 900, 2, 1, d);
      c.softmax_scale = 0.6f;
      out.push_back(c);
      c.causal = true;
      out.push_back(c);
    }
    // Head dims that are padded to the next kernel (zero-filled columns, masked stores).
    for (int d : {16, 80, 136, 200}) {
      Case c;
      c.dtype = dt, c.batch = 2, c.seqlen_q = 130, c.seqlen_k = 70, c.num_heads = 2, c.num_heads_kv = 1, c.head_dim = d;
      c.causal = true;
      out.push_back(c);
    }
  }
  return out;
}

std::string param_name(const testing::TestParamInfo<Case>& info) { return fa_test::test_name(info.param.name()); }

class Sm80Forward : public testing::TestWithParam<Case> {};

TEST_P(Sm80Forward, MatchesReference) {
  FA_SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(fa_test::check_forward(GetParam(), FA_IMPL_CUDA_SM80, fa_test::Space::Cuda));
}

INSTANTIATE_TEST_SUITE_P(Standard, Sm80Forward, testing::ValuesIn(sm80_forward_cases()), param_name);

// Dropout through FA_IMPL_AUTO: the dispatcher picks kernels that take it (on Hopper the sm90 ones, but for
// dropout with ALiBi and head dims without a Hopper kernel, which go to sm80), forward and backward.
TEST(Sm80Dropout, AutoPicksKernelsThatTakeIt) {
  FA_SKIP_WITHOUT_CUDA();
  for (int d : {128, 96}) {
    Case c = fa_test::make_case(FA_BFLOAT16, 2, 500, 500, 4, 2, d);
    c.dropout_p = 0.1f, c.dropout_seed = 3, c.causal = true;
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_AUTO, fa_test::Space::Cuda));
    EXPECT_TRUE(fa_test::check_backward(c, FA_IMPL_AUTO, fa_test::Space::Cuda));
    c.alibi = 1, c.alibi_max_slope = 0.5f;
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_AUTO, fa_test::Space::Cuda));
    EXPECT_TRUE(fa_test::check_backward(c, FA_IMPL_AUTO, fa_test::Space::Cuda));
  }
}

// Dropout with a paged or left-padded KV cache: a clear error naming both (dropout is for training).
TEST(Sm80Dropout, AKvCacheIsAClearError) {
  FA_SKIP_WITHOUT_CUDA();
  constexpr int kRows = 16, kDim = 64;
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 4 * kRows * kDim * 2 + 256), cudaSuccess);
  char* base = static_cast<char*>(buf);
  const int32_t table_host[1] = {0};
  int32_t* table = reinterpret_cast<int32_t*>(base + 4 * kRows * kDim * 2);
  ASSERT_EQ(cudaMemcpy(table, table_host, sizeof(table_host), cudaMemcpyHostToDevice), cudaSuccess);
  fa_params p;
  fa_params_init(&p);
  p.dtype = FA_FLOAT16, p.batch = 1, p.seqlen_q = kRows, p.seqlen_k = kRows, p.num_heads = 1, p.num_heads_kv = 1;
  p.head_dim = kDim;
  p.q = base, p.k = base + kRows * kDim * 2, p.v = base + 2 * kRows * kDim * 2, p.o = base + 3 * kRows * kDim * 2;
  for (int64_t* s : {&p.q_row_stride, &p.k_row_stride, &p.v_row_stride, &p.o_row_stride}) *s = kDim;
  for (int64_t* s : {&p.q_batch_stride, &p.k_batch_stride, &p.v_batch_stride, &p.o_batch_stride}) *s = kRows * kDim;
  for (int64_t* s : {&p.q_head_stride, &p.k_head_stride, &p.v_head_stride, &p.o_head_stride}) *s = kDim;
  p.dropout_p = 0.1f;
  p.block_table = table, p.block_table_batch_stride = 1, p.page_block_size = kRows, p.num_pages = 1;
  EXPECT_EQ(fa_forward(&p, FA_IMPL_CUDA_SM80), FA_ERROR_UNSUPPORTED);
  const std::string message = fa_last_error();
  EXPECT_NE(message.find("dropout_p"), std::string::npos) << message;
  EXPECT_NE(message.find("block_table"), std::string::npos) << message;
  p.block_table = nullptr, p.page_block_size = 0, p.num_pages = 0;
  EXPECT_EQ(fa_forward(&p, FA_IMPL_CUDA_SM80), FA_OK) << fa_last_error();
  cudaFree(buf);
}

// The sm80 launchers check a kernel's shared memory against the GPU's per-block limit (the tables
// are sized for the A100; sm_86 / sm_89 cards allow 99 KB): beyond it, an error that names the
// kernel and both sizes. Every table entry fits the lent H100, so the helper is tested directly.
TEST(Sm80SharedMemory, MoreThanTheGpuAllowsIsAClearError) {
  FA_SKIP_WITHOUT_CUDA();
  flashattn::cuda::DeviceInfo dev;
  ASSERT_TRUE(flashattn::cuda::device_info(&dev).ok());
  EXPECT_TRUE(flashattn::cuda::require_shared_memory(dev, 48 * 1024, "flashattn-sm80", "forward", 64).ok());
  const flashattn::Status s = flashattn::cuda::require_shared_memory(dev, 1 << 30, "flashattn-sm80", "backward", 128);
  EXPECT_EQ(s.code, FA_ERROR_UNSUPPORTED);
  const char* expected = "backward kernel for head_dim 128 needs 1073741824 bytes of shared memory";
  EXPECT_NE(s.message.find(expected), std::string::npos) << s.message;
}

}  // namespace
