// Dropout (fa_params::dropout_p, src/common/dropout.hpp) on the CPU reference (test_forward.cpp and
// test_backward.cpp check the CPU FA2 against it on dropout_cases): the Philox generator
// against Random123's known answers, the 16 x 16 tiles' layout, the keep rate, E[O] over many seeds against O without dropout,
// the lse unchanged, the backward against finite differences of the forward with the same mask, and
// the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/dropout.hpp"
#include "flashattn/flashattn.h"

namespace {

using flashattn::DropoutMask;
using flashattn::Philox4;
using flashattn::philox4x32_10;

TEST(Dropout, PhiloxMatchesRandom123KnownAnswers) {
  struct Kat {
    Philox4 counter;
    uint32_t k0, k1;
    Philox4 expected;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{~0u, ~0u, ~0u, ~0u}, ~0u, ~0u, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const Philox4 r = philox4x32_10(k.counter, k.k0, k.k1);
    EXPECT_EQ(r.x, k.expected.x);
    EXPECT_EQ(r.y, k.expected.y);
    EXPECT_EQ(r.z, k.expected.z);
    EXPECT_EQ(r.w, k.expected.w);
  }
}

// The 16 x 16 tiles' layout: each element of a tile is one number of one lane's call (the 256 (lane, e)
// pairs cover the tile once), and kept(bh, i, j) reads that number.
TEST(Dropout, EachElementOfATileIsOneNumberOfOneLane) {
  const DropoutMask m = DropoutMask::make(0.5f, 99, 4);
  for (int i16 : {0, 3})
    for (int j16 : {0, 7}) {
      std::vector<int> seen(256, 0);
      for (int lane = 0; lane < 32; ++lane) {
        uint16_t r[8];
        m.randoms(5, i16, j16, lane, r);
        for (int e = 0; e < 8; ++e) {
          const int row = DropoutMask::tile_row(lane, e), key = DropoutMask::tile_key(lane, e);
          ASSERT_TRUE(row >= 0 && row < 16 && key >= 0 && key < 16) << lane << " " << e;
          ++seen[size_t(row * 16 + key)];
          EXPECT_EQ(m.kept(5, 16 * i16 + row, 16 * j16 + key), m.kept(r[e])) << lane << " " << e;
        }
      }
      for (int x : seen) EXPECT_EQ(x, 1);
    }
}

// The GPU kernels' keep bits: a lane's own tile as the forward holds it (rows x keys, bit e for number e),
// and the tile transposed as the backward holds S^T (lane 4 g + t: key g + 8 (e / 2), row 8 nt + 2 t + e % 2,
// bit 4 nt + e), each bit against kept(bh, i, j).
TEST(Dropout, KeepBitsOfTheKernelsFragments) {
  const DropoutMask m = DropoutMask::make(0.3f, 0xabcdef0123ull, 0x500000002ull);
  for (int i16 : {0, 5})
    for (int j16 : {0, 2})
      for (int lane = 0; lane < 32; ++lane) {
        const uint32_t bits = m.keep_bits(9, i16, j16, lane);
        for (int e = 0; e < 8; ++e)
          EXPECT_EQ((bits >> e) & 1u, uint32_t(m.kept(9, 16 * i16 + DropoutMask::tile_row(lane, e),
                                                       16 * j16 + DropoutMask::tile_key(lane, e))))
              << lane << " " << e;
        // The backward's exchange as the kernels run it, the shuffle between lanes L and L ^ 4 done here.
        const int g = lane / 4, t = lane % 4, partner = lane ^ 4;
        uint32_t from_partner[2];
        DropoutMask::transposed_send(m.call(9, i16, j16, DropoutMask::transposed_lane(partner / 4, partner % 4)),
                                     partner / 4, from_partner);
        const uint32_t bits_t = m.transposed_keep_bits(m.call(9, i16, j16, DropoutMask::transposed_lane(g, t)), from_partner, g);
        for (int nt = 0; nt < 2; ++nt)
          for (int e = 0; e < 4; ++e)
            EXPECT_EQ((bits_t >> (4 * nt + e)) & 1u,
                      uint32_t(m.kept(9, 16 * i16 + 8 * nt + 2 * t + e % 2, 16 * j16 + g + 8 * (e / 2))))
                << lane << " " << nt << " " << e;
      }
}

// The fraction kept over 2^20 elements is 1 - threshold / 65536 within 5 standard deviations, and the
// masks of two offsets differ.
TEST(Dropout, KeepRateAndScale) {
  for (float p_drop : {0.1f, 0.5f, 0.9f}) {
    fa_params p;
    fa_params_init(&p);
    p.dropout_p = p_drop, p.dropout_seed = 0x1234567890abcdefull, p.dropout_offset = 7;
    const DropoutMask m = DropoutMask::of(p);
    ASSERT_TRUE(m.on());
    const double q = double(m.threshold) / 65536.0;
    EXPECT_NEAR(q, p_drop, 1.0 / 65536);
    EXPECT_FLOAT_EQ(m.scale, float(1.0 / (1.0 - q)));
    p.dropout_offset = 8;
    const DropoutMask other = DropoutMask::of(p);
    int64_t kept = 0, differ = 0, n = 0;
    for (int bh = 0; bh < 4; ++bh)
      for (int i = 0; i < 256; ++i)
        for (int j = 0; j < 1024; ++j, ++n) {
          const bool a = m.kept(bh, i, j);
          kept += a;
          differ += a != other.kept(bh, i, j);
        }
    const double sd = std::sqrt(n * q * (1 - q));
    EXPECT_NEAR(double(kept), n * (1 - q), 5 * sd) << "p " << p_drop;
    EXPECT_NEAR(double(differ), 2.0 * n * q * (1 - q), 5 * std::sqrt(double(n))) << "p " << p_drop;
  }
  fa_params off;
  fa_params_init(&off);
  EXPECT_FALSE(DropoutMask::of(off).on());
}

// An fp32 problem in host memory (batch 2, 2 heads over 1 kv head, causal with seqlen_q < seqlen_k).
struct Problem {
  int b = 2, sq = 5, sk = 13, h = 2, hk = 1, d = 8;
  std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
  fa_params p;

  explicit Problem(float dropout_p, uint64_t seed = 42, uint64_t offset = 0) {
    std::mt19937 gen(3);
    std::normal_distribution<float> normal;
    auto fill = [&](std::vector<float>& t, size_t n) {
      t.resize(n);
      for (float& x : t) x = normal(gen);
    };
    fill(q, size_t(b) * sq * h * d), fill(k, size_t(b) * sk * hk * d), fill(v, size_t(b) * sk * hk * d);
    fill(dout, q.size());
    o.assign(q.size(), NAN), dq.assign(q.size(), NAN), dk.assign(k.size(), NAN), dv.assign(v.size(), NAN);
    lse.assign(size_t(b) * h * sq, NAN);
    fa_params_init(&p);
    p.batch = b, p.seqlen_q = sq, p.seqlen_k = sk, p.num_heads = h, p.num_heads_kv = hk, p.head_dim = d;
    p.dtype = FA_FLOAT32, p.causal = 1;
    fa_params_set_contiguous_strides(&p);
    p.dropout_p = dropout_p, p.dropout_seed = seed, p.dropout_offset = offset;
    bind();
  }
  void bind() {
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.o = o.data(), p.lse = lse.data();
    p.dout = dout.data(), p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  }
  void forward() { ASSERT_EQ(fa_forward(&p, FA_IMPL_CPU_REFERENCE), FA_OK) << fa_last_error(); }
  void backward() { ASSERT_EQ(fa_backward(&p, FA_IMPL_CPU_REFERENCE), FA_OK) << fa_last_error(); }
  double loss() {  // sum(dout * O): its gradient is the backward of dout
    forward();
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += double(dout[i]) * o[i];
    return l;
  }
};

// Averaged over 400 seeds, O with dropout is O without it (the kept probabilities scaled by 1 / (1 - p)),
// within 5 standard errors of each element's mean; the lse is the one without dropout.
TEST(Dropout, ExpectedOutputIsTheOutputWithoutDropout) {
  Problem plain(0.f);
  plain.forward();
  const int seeds = 400;
  std::vector<double> sum(plain.o.size(), 0.0), sum2(plain.o.size(), 0.0);
  for (int s = 0; s < seeds; ++s) {
    Problem dropped(0.3f, 1000 + s, 5);
    dropped.forward();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += dropped.o[i], sum2[i] += double(dropped.o[i]) * dropped.o[i];
    if (s == 0)
      for (size_t i = 0; i < plain.lse.size(); ++i) EXPECT_FLOAT_EQ(dropped.lse[i], plain.lse[i]) << i;
  }
  for (size_t i = 0; i < sum.size(); ++i) {
    const double mean = sum[i] / seeds, var = std::max(sum2[i] / seeds - mean * mean, 1e-12);
    EXPECT_NEAR(mean, plain.o[i], 5 * std::sqrt(var / seeds) + 1e-6) << "element " << i;
  }
}

// The gradients of sum(dout * O) for one mask (seed and offset fixed) against central differences of
// the forward along random directions, for q, k and v.
TEST(Dropout, BackwardMatchesFiniteDifferencesOfTheSameMask) {
  Problem pr(0.25f, 77, 3);
  pr.forward();
  pr.backward();
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  struct Input {
    std::vector<float>* x;
    const std::vector<float>* grad;
    const char* name;
  };
  for (Input in : {Input{&pr.q, &pr.dq, "q"}, Input{&pr.k, &pr.dk, "k"}, Input{&pr.v, &pr.dv, "v"}}) {
    const std::vector<float> grad = *in.grad, x0 = *in.x;
    std::vector<float> dir(x0.size());
    for (float& e : dir) e = normal(gen);
    double analytic = 0;
    for (size_t i = 0; i < dir.size(); ++i) analytic += double(grad[i]) * dir[i];
    const float eps = 1e-2f;
    auto loss_at = [&](float t) {
      for (size_t i = 0; i < x0.size(); ++i) (*in.x)[i] = x0[i] + t * dir[i];
      return pr.loss();
    };
    const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    *in.x = x0;
    EXPECT_NEAR(analytic, numeric, 2e-3 * (1 + std::abs(numeric))) << in.name;
  }
}

TEST(Dropout, InvalidProbabilityOrImplementationIsAnErrorNamingIt) {
  for (float bad : {1.f, -0.1f, NAN, 2.f}) {
    Problem pr(bad);
    EXPECT_EQ(fa_forward(&pr.p, FA_IMPL_CPU_REFERENCE), FA_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(fa_last_error()).find("dropout_p"), std::string::npos) << fa_last_error();
  }
  // cuda-standard does not take dropout, sm90 not with ALiBi (the CPU backends and sm80 take both).
  const float slopes[2] = {0.5f, 0.25f};
  for (fa_impl impl : {FA_IMPL_CUDA_STANDARD, FA_IMPL_CUDA_SM90}) {
    Problem pr(0.1f);  // arguments come before the device: the same error on any machine
    if (impl == FA_IMPL_CUDA_SM90) pr.p.dtype = FA_FLOAT16, pr.p.alibi_slopes = slopes;
    EXPECT_EQ(fa_forward(&pr.p, impl), FA_ERROR_UNSUPPORTED) << fa_impl_name(impl);
    EXPECT_NE(std::string(fa_last_error()).find("dropout_p"), std::string::npos) << fa_last_error();
    if (impl != FA_IMPL_CUDA_SM90) continue;
    EXPECT_NE(std::string(fa_last_error()).find("alibi_slopes"), std::string::npos) << fa_last_error();
    EXPECT_EQ(fa_backward(&pr.p, impl), FA_ERROR_UNSUPPORTED);  // (its backward does not take ALiBi at all)
    EXPECT_NE(std::string(fa_last_error()).find("alibi_slopes"), std::string::npos) << fa_last_error();
  }
  Problem pr(0.1f);  // AUTO on host memory: the CPU FA2
  EXPECT_EQ(fa_forward(&pr.p, FA_IMPL_AUTO), FA_OK) << fa_last_error();
  EXPECT_EQ(fa_backward(&pr.p, FA_IMPL_AUTO), FA_OK) << fa_last_error();
}

}  // namespace
