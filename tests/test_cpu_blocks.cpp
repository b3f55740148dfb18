// The CPU backend's block-size rule and cache query, and properties of FA2 that the reference
// comparison does not cover (block-size independence, thread-count independence).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/kernels.hpp"
#include "support/harness.hpp"

using flashattn::cpu::block_sizes;
using flashattn::cpu::BlockSizes;

TEST(CpuBlocks, PaperRuleInFp32Elements) {
  // B_c = ceil(M / (4 d sizeof(float))), B_r = min(B_c, d).
  auto eq = [](BlockSizes b, int r, int c) { return b.block_r == r && b.block_c == c; };
  EXPECT_TRUE(eq(block_sizes(512 << 10, 64), 64, 512));
  EXPECT_TRUE(eq(block_sizes(512 << 10, 128), 128, 256));
  EXPECT_TRUE(eq(block_sizes(512 << 10, 256), 128, 128));
  EXPECT_TRUE(eq(block_sizes(512 << 10, 1024), 32, 32));
  EXPECT_TRUE(eq(block_sizes(1 << 20, 64), 64, 1024));
  EXPECT_TRUE(eq(block_sizes(100000, 40), 40, 157));  // 25000 / 160 = 156.25, rounded up
  EXPECT_TRUE(eq(block_sizes(4096, 8), 8, 32));
}

TEST(CpuBlocks, ClampedToOne) {
  auto b = block_sizes(0, 64);
  EXPECT_EQ(b.block_r, 1);
  EXPECT_EQ(b.block_c, 1);
  b = block_sizes(1000, 64);  // 250 elements < 4 d: one key per block
  EXPECT_EQ(b.block_c, 1);
  EXPECT_EQ(b.block_r, 1);
  b = block_sizes(64, 1);
  EXPECT_EQ(b.block_c, 4);
  EXPECT_EQ(b.block_r, 1);
}

TEST(CpuBlocks, TilesFitTheBudget) {
  // Q_i, K_j, V_j, O_i: 4 tiles of at most B_c x d fp32 fill M, up to the rounding of B_c.
  for (int64_t m : {int64_t(32) << 10, int64_t(512) << 10, int64_t(1) << 20, int64_t(3) << 20})
    for (int d : {8, 32, 40, 64, 96, 128, 256, 1024}) {
      const auto b = block_sizes(m, d);
      EXPECT_LE(b.block_r, d);
      EXPECT_LE(b.block_r, b.block_c);
      EXPECT_LE(int64_t(4) * (b.block_c - 1) * d * 4, m) << "M " << m << " d " << d;
      EXPECT_GE(int64_t(4) * b.block_c * d * 4, m) << "M " << m << " d " << d;
    }
}

TEST(CpuBlocks, L2SizeIsPlausible) {
  const int64_t l2 = flashattn::cpu::l2_cache_bytes();
  EXPECT_GE(l2, int64_t(64) << 10);
  EXPECT_LE(l2, int64_t(1) << 30);
  EXPECT_EQ(l2 % 1024, 0);
}

// Tiny budgets force many blocks (and blocks of one key); every one must still match the reference.
TEST(CpuBlocks, Fa2MatchesReferenceForAnyBudget) {
  for (int64_t m : {int64_t(1), int64_t(700), int64_t(4096), int64_t(50000)}) {
    fa_test::Case c;
    c.batch = 2;
    c.seqlen_q = 77;
    c.seqlen_k = 131;
    c.num_heads = 4;
    c.num_heads_kv = 2;
    c.head_dim = 40;
    c.dtype = FA_FLOAT32;
    c.causal = true;
    c.cpu_cache_bytes = m;
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_CPU_FA2, fa_test::Space::Host)) << "M " << m;
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_CPU_FA1, fa_test::Space::Host)) << "M " << m;
    c.window_left = 9;
    c.causal = false;
    c.window_right = 4;
    EXPECT_TRUE(fa_test::check_backward(c, FA_IMPL_CPU_FA2, fa_test::Space::Host)) << "M " << m;
  }
}

TEST(CpuBlocks, Fa2BackwardDeterministicMode) {
  fa_test::Case c;
  c.batch = 2;
  c.seqlen_q = c.seqlen_k = 300;
  c.num_heads = 4;
  c.num_heads_kv = 1;
  c.head_dim = 64;
  c.dtype = FA_FLOAT32;
  c.causal = true;
  c.deterministic = true;
  c.cpu_cache_bytes = 16 << 10;
  EXPECT_TRUE(fa_test::check_backward(c, FA_IMPL_CPU_FA2, fa_test::Space::Host));
  EXPECT_TRUE(fa_test::check_backward_deterministic(c, FA_IMPL_CPU_FA2, fa_test::Space::Host));
}

// Every FA2 forward task is independent: the result is bit-identical for any thread count.
TEST(CpuBlocks, Fa2ForwardIndependentOfThreadCount) {
  const int s = 300, h = 3, d = 72;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(size_t(s) * h * d), k(q.size()), v(q.size());
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = nd(rng);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3}) {
    fa_params p;
    fa_params_init(&p);
    p.batch = 1;
    p.seqlen_q = p.seqlen_k = s;
    p.num_heads = p.num_heads_kv = h;
    p.head_dim = d;
    p.dtype = FA_FLOAT32;
    p.causal = 1;
    p.num_threads = threads;
    p.cpu_cache_bytes = 20000;
    std::vector<float> o(q.size(), -1.f), lse(size_t(h) * s, -1.f);
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.o = o.data();
    p.lse = lse.data();
    fa_params_set_contiguous_strides(&p);
    ASSERT_EQ(fa_forward(&p, FA_IMPL_CPU_FA2), FA_OK) << fa_last_error();
    o.insert(o.end(), lse.begin(), lse.end());
    outs.push_back(o);
  }
  for (size_t t = 1; t < outs.size(); ++t)
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[t].data(), outs[0].size() * sizeof(float)), 0) << "threads run " << t;
}

// The vector tanh of the FA2 softcap (kernels.hpp) against tanh in double: within 4 units in the last place of
// the float result over [-50, 50] (every lane a different x, across the polynomial's edge at 0.625), odd,
// saturating to +-1, and NaN for NaN.
TEST(CpuKernels, TanhWithinFourUlp) {
  using flashattn::cpu::kLanes;
  using flashattn::cpu::tanhv;
  using flashattn::cpu::vfloat;
  auto ulp_error = [](float got, double want) {
    const double ulp = std::ldexp(1.0, std::ilogb(std::fabs(want) > 1e-30 ? want : 1e-30) - 23);
    return std::fabs(double(got) - want) / ulp;
  };
  double worst = 0;
  float worst_x = 0;
  for (double x0 = -50; x0 <= 50; x0 += 1e-4 * kLanes) {
    vfloat x;
    for (int i = 0; i < kLanes; ++i) x[i] = float(x0 + 1e-4 * i);
    const vfloat t = tanhv(x), neg = tanhv(-x);
    for (int i = 0; i < kLanes; ++i) {
      const double e = ulp_error(t[i], std::tanh(double(x[i])));
      if (e > worst) worst = e, worst_x = x[i];
      ASSERT_EQ(neg[i], -t[i]) << "x " << x[i];
    }
  }
  EXPECT_LE(worst, 4.0) << "at x = " << worst_x;
  for (float x : {0.624f, 0.625f, 0.626f, 1e-30f, 1e-6f, 9.f, 20.f}) {
    vfloat v{};
    v[0] = x;
    EXPECT_LE(ulp_error(tanhv(v)[0], std::tanh(double(x))), 4.0) << "x " << x;
  }
  vfloat special{};
  special[0] = std::numeric_limits<float>::infinity(), special[1] = -special[0];
  special[2] = std::numeric_limits<float>::quiet_NaN(), special[3] = -0.f;
  const vfloat t = tanhv(special);
  EXPECT_EQ(t[0], 1.f);
  EXPECT_EQ(t[1], -1.f);
  EXPECT_TRUE(std::isnan(t[2]));
  EXPECT_EQ(t[3], 0.f);
}

// Dropout's factors of a transposed block (kernels.hpp: the 32 Philox calls of a tile at once, 8 numbers at a
// time) against the mask element by element (DropoutMask::kept, one scalar call each), on blocks that start
// inside a tile, end inside one, and have fewer rows than lanes; lanes past the rows are 0.
TEST(CpuKernels, DropoutFactorsMatchTheMask) {
  const flashattn::DropoutMask mask = flashattn::DropoutMask::make(0.3f, 0x1234567890abcdefull, 0x55ull << 32 | 7);
  struct Block {
    int64_t m0;
    int rows;
    int64_t n0;
    int nv;
  };
  for (const Block b : {Block{0, 64, 0, 128}, Block{16, 32, 48, 64}, Block{5, 23, 37, 41}, Block{130, 1, 7, 1},
                        Block{31, 17, 15, 2}}) {
    const int64_t m_pad = (b.rows + 15) / 16 * 16 + 16;
    std::vector<float> z(size_t(b.nv) * size_t(m_pad), -1.f);
    const int32_t bh = 9;
    flashattn::cpu::dropout_factors_t(z.data(), b.nv, b.rows, m_pad, b.n0, b.m0, mask, bh);
    for (int j = 0; j < b.nv; ++j)
      for (int64_t i = 0; i < m_pad; ++i) {
        const float want = i >= b.rows ? 0.f
                           : mask.kept(bh, int32_t(b.m0 + i), int32_t(b.n0 + j)) ? mask.scale
                                                                                  : 0.f;
        ASSERT_EQ(z[size_t(j) * size_t(m_pad) + size_t(i)], want)
            << "block m0 " << b.m0 << " n0 " << b.n0 << ": row " << b.m0 + i << " key " << b.n0 + j;
      }
  }
}
