// The softmax primitives of include/flashattn/softmax.hpp: plain, safe, online, merge.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "flashattn/softmax.hpp"

namespace sm = flashattn::softmax;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_row(int n, float spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, spread);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

// log(sum(exp(x))) in double, the exact value the states are checked against.
double lse_double(const std::vector<float>& x) {
  double m = -INFINITY;
  for (float v : x) m = std::max(m, double(v));
  if (m == -INFINITY) return -INFINITY;
  double s = 0;
  for (float v : x) s += std::exp(double(v) - m);
  return m + std::log(s);
}

sm::State<float> state_of(const float* x, int n) {
  sm::State<float> s;
  for (int j = 0; j < n; ++j) s.update(x[j]);
  return s;
}

}  // namespace

TEST(Softmax, SafeSumsToOneAndMatchesDouble) {
  for (int n : {1, 2, 7, 100, 1000}) {
    auto x = random_row(n, 3.f, 1u + uint32_t(n));
    std::vector<float> y(x.size());
    sm::safe(x.data(), n, y.data());
    const double lse = lse_double(x);
    double sum = 0;
    for (int j = 0; j < n; ++j) {
      sum += y[size_t(j)];
      EXPECT_NEAR(y[size_t(j)], std::exp(double(x[size_t(j)]) - lse), 1e-6) << "n=" << n << " j=" << j;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << "n=" << n;
  }
}

TEST(Softmax, OnlineEqualsSafe) {
  for (int n : {1, 3, 64, 513}) {
    auto x = random_row(n, 5.f, 100u + uint32_t(n));
    std::vector<float> y(x.size());
    sm::safe(x.data(), n, y.data());
    const auto s = state_of(x.data(), n);
    EXPECT_NEAR(s.lse(), lse_double(x), 1e-5 * std::max(1.0, std::fabs(lse_double(x)))) << "n=" << n;
    for (int j = 0; j < n; ++j) EXPECT_NEAR(s.prob(x[size_t(j)]), y[size_t(j)], 1e-6) << "n=" << n << " j=" << j;
  }
}

TEST(Softmax, MergeOfEverySplitEqualsWhole) {
  const int n = 40, d = 5;
  auto x = random_row(n, 4.f, 7u);
  auto v = random_row(n * d, 1.f, 8u);
  const auto whole = state_of(x.data(), n);
  // Unnormalized output of x[a, b): sum_j e^{x_j - m} v_j.
  auto partial_o = [&](int a, int b, float m) {
    std::vector<float> o(size_t(d), 0.f);
    for (int j = a; j < b; ++j)
      for (int c = 0; c < d; ++c) o[size_t(c)] += sm::exp_diff(x[size_t(j)], m) * v[size_t(j * d + c)];
    return o;
  };
  const auto o_whole = partial_o(0, n, whole.m);
  for (int split = 0; split <= n; ++split) {
    const auto a = state_of(x.data(), split), b = state_of(x.data() + split, n - split);
    auto o_a = partial_o(0, split, a.m);
    const auto o_b = partial_o(split, n, b.m);
    const auto merged = sm::merge(a, o_a.data(), b, o_b.data(), d);
    EXPECT_EQ(merged.m, whole.m) << "split " << split;
    EXPECT_NEAR(merged.l, whole.l, 1e-5f * whole.l) << "split " << split;
    for (int c = 0; c < d; ++c)
      EXPECT_NEAR(o_a[size_t(c)] / merged.l, o_whole[size_t(c)] / whole.l, 1e-5) << "split " << split << " c " << c;
  }
  // Merge is symmetric.
  const auto a = state_of(x.data(), 13), b = state_of(x.data() + 13, n - 13);
  EXPECT_EQ(sm::merge(a, b).m, sm::merge(b, a).m);
  EXPECT_NEAR(sm::merge(a, b).l, sm::merge(b, a).l, 1e-6f * whole.l);
}

TEST(Softmax, PlainOverflowsWhereSafeDoesNot) {
  // e^100 overflows fp32 (max ~3.4e38 = e^88.7): plain gives inf / inf = NaN, safe stays exact.
  const std::vector<float> x = {100.f, 100.5f, 90.f};
  std::vector<float> plain(3), safe(3);
  sm::plain(x.data(), 3, plain.data());
  sm::safe(x.data(), 3, safe.data());
  EXPECT_FALSE(std::isfinite(plain[0]));
  const double lse = lse_double(x);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(safe[size_t(j)], std::exp(double(x[size_t(j)]) - lse), 1e-6);
  const auto s = state_of(x.data(), 3);
  EXPECT_NEAR(s.lse(), lse, 1e-5);
  // Small inputs: plain and safe agree.
  const std::vector<float> small = {0.5f, -1.f, 2.f};
  sm::plain(small.data(), 3, plain.data());
  sm::safe(small.data(), 3, safe.data());
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(plain[size_t(j)], safe[size_t(j)], 1e-7);
}

TEST(Softmax, AllMaskedRowIsEmptyAndMergesAsIdentity) {
  const std::vector<float> x = {-kInf, -kInf, -kInf};
  std::vector<float> y(3, 1.f);
  sm::safe(x.data(), 3, y.data());
  for (float v : y) EXPECT_EQ(v, 0.f);
  const auto empty = state_of(x.data(), 3);
  EXPECT_EQ(empty.m, -kInf);
  EXPECT_EQ(empty.l, 0.f);
  EXPECT_EQ(empty.lse(), -kInf);
  EXPECT_EQ(empty.prob(-kInf), 0.f);

  const auto both = sm::merge(empty, empty);
  EXPECT_EQ(both.m, -kInf);
  EXPECT_EQ(both.l, 0.f);
  EXPECT_FALSE(std::isnan(both.lse()));

  const std::vector<float> z = {1.f, -kInf, 3.f};
  const auto s = state_of(z.data(), 3);
  for (const auto& merged : {sm::merge(empty, s), sm::merge(s, empty)}) {
    EXPECT_EQ(merged.m, s.m);
    EXPECT_EQ(merged.l, s.l);
  }
  // Unnormalized outputs: the empty side contributes nothing.
  float o_empty[2] = {0.f, 0.f}, o_s[2] = {1.f, 2.f};
  const auto r = sm::merge(empty, o_empty, s, o_s, 2);
  EXPECT_EQ(r.l, s.l);
  EXPECT_EQ(o_empty[0], 1.f);
  EXPECT_EQ(o_empty[1], 2.f);
  EXPECT_EQ(s.prob(-kInf), 0.f);
}

TEST(Softmax, DoublePrecision) {
  const std::vector<double> x = {800.0, 799.0, -kInf};
  std::vector<double> y(3);
  sm::safe(x.data(), 3, y.data());
  EXPECT_NEAR(y[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_EQ(y[2], 0.0);
  sm::State<double> s;
  for (double v : x) s.update(v);
  EXPECT_NEAR(s.lse(), 800.0 + std::log1p(std::exp(-1.0)), 1e-12);
}
