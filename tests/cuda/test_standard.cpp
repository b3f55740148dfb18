// The CUDA standard attention (cuBLAS QK^T, softmax kernel, cuBLAS PV) against the fp64 reference
// with the anchor rule, on the standard awkward-shape list in fp16, bf16 and fp32. Varlen is not
// part of this implementation (it exists for the seeds' comparison): it must say so.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "support/harness.hpp"

namespace {

using fa_test::Case;

struct StandardParam {
  Case c;
  friend void PrintTo(const StandardParam& p, std::ostream* os) { *os << p.c.name(); }
};

std::vector<StandardParam> standard_params() {
  std::vector<StandardParam> out;
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16, FA_FLOAT32})
    for (const Case& c : fa_test::standard_forward_cases(dt, 256))
      if (c.seqlens_q.empty()) out.push_back({c});
  return out;
}

std::string param_name(const testing::TestParamInfo<StandardParam>& info) { return fa_test::test_name(info.param.c.name()); }

class CudaStandardForward : public testing::TestWithParam<StandardParam> {};
TEST_P(CudaStandardForward, MatchesReference) {
  FA_SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(fa_test::check_forward(GetParam().c, FA_IMPL_CUDA_STANDARD, fa_test::Space::Cuda));
}
INSTANTIATE_TEST_SUITE_P(Standard, CudaStandardForward, testing::ValuesIn(standard_params()), param_name);

// The seeds' classic problem at a smaller batch: 16 heads, seqlen 512, head_dim 64, causal.
TEST(CudaStandard, ClassicProblemCausal) {
  FA_SKIP_WITHOUT_CUDA();
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    Case c;
    c.batch = 2;
    c.seqlen_q = c.seqlen_k = 512;
    c.num_heads = c.num_heads_kv = 16;
    c.head_dim = 64;
    c.causal = true;
    c.dtype = dt;
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_CUDA_STANDARD, fa_test::Space::Cuda));
  }
}

// GQA with more kv heads than group members and MQA take the two batching orders of the GEMMs.
TEST(CudaStandard, GroupedHeadsBothOrders) {
  FA_SKIP_WITHOUT_CUDA();
  for (int kv : {4, 1}) {
    Case c;
    c.batch = 3;
    c.seqlen_q = 37;
    c.seqlen_k = 70;
    c.num_heads = 8;
    c.num_heads_kv = kv;
    c.head_dim = 32;
    c.causal = kv == 1;
    c.bhsd = kv == 4;
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_CUDA_STANDARD, fa_test::Space::Cuda));
  }
}

// seqlen_k = 0: every row is fully masked (o = 0, lse = -inf), without any GEMM.
TEST(CudaStandard, NoKeys) {
  FA_SKIP_WITHOUT_CUDA();
  Case c;
  c.batch = 2;
  c.seqlen_q = 5;
  c.seqlen_k = 0;
  c.num_heads = 2;
  c.num_heads_kv = 2;
  c.head_dim = 64;
  EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_CUDA_STANDARD, fa_test::Space::Cuda));
}

// Device buffers for the API-level checks below (freed on scope exit).
struct DeviceMemory {
  void* ptr = nullptr;
  explicit DeviceMemory(size_t n) { EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess); }
  ~DeviceMemory() { cudaFree(ptr); }
};

fa_params small_params(void* q, void* k, void* v, void* o) {
  fa_params p;
  fa_params_init(&p);
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = 16;
  p.num_heads = p.num_heads_kv = 1;
  p.head_dim = 64;
  p.dtype = FA_FLOAT16;
  fa_params_set_contiguous_strides(&p);
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  return p;
}

TEST(CudaStandard, VarlenIsUnsupportedWithAMessage) {
  FA_SKIP_WITHOUT_CUDA();
  DeviceMemory q(16 * 64 * 2), k(16 * 64 * 2), v(16 * 64 * 2), o(16 * 64 * 2), cu(2 * sizeof(int32_t));
  const int32_t cu_host[2] = {0, 16};
  ASSERT_EQ(cudaMemcpy(cu.ptr, cu_host, sizeof cu_host, cudaMemcpyHostToDevice), cudaSuccess);
  fa_params p = small_params(q.ptr, k.ptr, v.ptr, o.ptr);
  p.cu_seqlens_q = p.cu_seqlens_k = static_cast<const int32_t*>(cu.ptr);
  p.total_q = p.total_k = 16;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;
  EXPECT_EQ(fa_forward(&p, FA_IMPL_CUDA_STANDARD), FA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fa_last_error()).find("varlen"), std::string::npos) << fa_last_error();
}

TEST(CudaStandard, MissingWorkspaceIsAnError) {
  FA_SKIP_WITHOUT_CUDA();
  DeviceMemory q(16 * 64 * 2), k(16 * 64 * 2), v(16 * 64 * 2), o(16 * 64 * 2);
  fa_params p = small_params(q.ptr, k.ptr, v.ptr, o.ptr);
  size_t ws = 0;
  ASSERT_EQ(fa_workspace_size(&p, FA_IMPL_CUDA_STANDARD, 0, &ws), FA_OK);
  EXPECT_GE(ws, size_t(16 * 16 * (4 + 2)));  // S fp32 and P fp16
  EXPECT_EQ(fa_forward(&p, FA_IMPL_CUDA_STANDARD), FA_ERROR_WORKSPACE);
  EXPECT_NE(std::string(fa_last_error()).find("workspace"), std::string::npos) << fa_last_error();
}

}  // namespace
