// 64-bit offsets: tensors whose second batch starts 2^31 + 64 elements after the first. Each lives
// in its own reserved (MAP_NORESERVE) mapping of ~4 GiB of which only the touched pages get memory.
// A 32-bit offset anywhere would read or write the wrong place (or fault); the results must equal
// those of the same problem in contiguous memory.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/dtype.hpp"

namespace {

constexpr int64_t kBatchStride = (int64_t(1) << 31) + 64;  // elements
constexpr int kBatch = 2, kSeqlenQ = 5, kSeqlenK = 6, kHeads = 2, kHeadDim = 16;

// A fp16 (batch, rows, heads, head_dim) tensor with batch stride kBatchStride in a sparse mapping.
struct SparseTensor {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  int rows = 0;
  explicit SparseTensor(int r) : rows(r) {
    bytes = size_t(kBatchStride + int64_t(r) * kHeads * kHeadDim) * 2;
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  ~SparseTensor() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
  uint16_t* data() { return static_cast<uint16_t*>(base); }
  int64_t offset(int b, int r, int h) const { return b * kBatchStride + (int64_t(r) * kHeads + h) * kHeadDim; }
  void fill(const std::vector<uint16_t>& contiguous) {  // from (batch, rows, heads, head_dim) contiguous
    size_t i = 0;
    for (int b = 0; b < kBatch; ++b)
      for (int r = 0; r < rows; ++r)
        for (int h = 0; h < kHeads; ++h)
          for (int c = 0; c < kHeadDim; ++c) data()[offset(b, r, h) + c] = contiguous[i++];
  }
  std::vector<uint16_t> gather() {
    std::vector<uint16_t> out;
    for (int b = 0; b < kBatch; ++b)
      for (int r = 0; r < rows; ++r)
        for (int h = 0; h < kHeads; ++h)
          for (int c = 0; c < kHeadDim; ++c) out.push_back(data()[offset(b, r, h) + c]);
    return out;
  }
};

void set_strides(int64_t& bs, int64_t& rs, int64_t& hs) {
  bs = kBatchStride;
  rs = kHeads * kHeadDim;
  hs = kHeadDim;
}

std::vector<uint16_t> values(int rows, int seed) {
  std::vector<uint16_t> v(size_t(kBatch) * rows * kHeads * kHeadDim);
  for (size_t i = 0; i < v.size(); ++i) v[i] = flashattn::float_to_half(std::sin(0.37f * float(i) + float(seed)));
  return v;
}

TEST(Offsets64Bit, BatchStrideBeyondInt32GivesTheContiguousResult) {
  SparseTensor q(kSeqlenQ), k(kSeqlenK), v(kSeqlenK), o(kSeqlenQ), dout(kSeqlenQ), dq(kSeqlenQ), dk(kSeqlenK), dv(kSeqlenK);
  for (SparseTensor* t : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) ASSERT_NE(t->base, MAP_FAILED) << "mmap of " << t->bytes << " bytes";
  const auto qv = values(kSeqlenQ, 1), kv = values(kSeqlenK, 2), vv = values(kSeqlenK, 3), dov = values(kSeqlenQ, 4);
  q.fill(qv);
  k.fill(kv);
  v.fill(vv);
  dout.fill(dov);

  // The same problem, contiguous.
  std::vector<uint16_t> cq = qv, ck = kv, cv = vv, cdo = dov, co(qv.size()), cdq(qv.size()), cdk(kv.size()), cdv(kv.size());
  std::vector<float> clse(kBatch * kHeads * kSeqlenQ), lse(clse.size());
  fa_params c;
  fa_params_init(&c);
  c.batch = kBatch;
  c.seqlen_q = kSeqlenQ;
  c.seqlen_k = kSeqlenK;
  c.num_heads = c.num_heads_kv = kHeads;
  c.head_dim = kHeadDim;
  c.causal = 1;
  fa_params_set_contiguous_strides(&c);
  fa_params p = c;
  c.q = cq.data();
  c.k = ck.data();
  c.v = cv.data();
  c.o = co.data();
  c.dout = cdo.data();
  c.dq = cdq.data();
  c.dk = cdk.data();
  c.dv = cdv.data();
  c.lse = clse.data();

  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.o = o.data();
  p.dout = dout.data();
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  p.lse = lse.data();
  set_strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  set_strides(p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  set_strides(p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  set_strides(p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  set_strides(p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  set_strides(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  set_strides(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  set_strides(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);

  for (fa_impl impl : {FA_IMPL_CPU_REFERENCE, FA_IMPL_CPU_FA1, FA_IMPL_CPU_FA2}) {
    ASSERT_EQ(fa_forward(&c, impl), FA_OK) << fa_last_error();
    ASSERT_EQ(fa_forward(&p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
    EXPECT_EQ(o.gather(), co) << fa_impl_name(impl);
    EXPECT_EQ(lse, clse) << fa_impl_name(impl);
    if (impl == FA_IMPL_CPU_FA1) continue;
    ASSERT_EQ(fa_backward(&c, impl), FA_OK) << fa_last_error();
    ASSERT_EQ(fa_backward(&p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
    EXPECT_EQ(dq.gather(), cdq) << fa_impl_name(impl);
    EXPECT_EQ(dk.gather(), cdk) << fa_impl_name(impl);
    EXPECT_EQ(dv.gather(), cdv) << fa_impl_name(impl);
  }
}

}  // namespace
