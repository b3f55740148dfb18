// FastDivmod (the CUDA kernels' division by a divisor fixed at launch) against the / and % operators:
// every divisor up to 4096 and powers of two and their neighbours up to 2^30, each on small
// numerators, numerators around multiples of the divisor and near 2^31, and random ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/fast_divmod.hpp"

namespace {

using flashattn::FastDivmod;

::testing::AssertionResult matches(int32_t d, int32_t n) {
  const FastDivmod f(d);
  int32_t q = -1;
  const int32_t r = f.divmod(n, q);
  if (q == n / d && r == n % d && f.div(n) == n / d) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << n << " / " << d << ": got " << q << " rem " << r << ", want " << n / d
                                       << " rem " << n % d;
}

TEST(FastDivmod, MatchesIntegerDivision) {
  std::vector<int32_t> divisors;
  for (int32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int s = 12; s <= 30; ++s)
    for (int32_t e : {-1, 0, 1}) divisors.push_back((int32_t(1) << s) + e);
  divisors.push_back(INT32_MAX);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any(0, INT32_MAX);
  for (int32_t d : divisors) {
    std::vector<int32_t> ns = {0, 1, 2, d - 1, d, INT32_MAX, INT32_MAX - 1, INT32_MAX - d + 1};
    for (int64_t k : {int64_t(2), int64_t(3), int64_t(1000), int64_t(INT32_MAX) / d})
      for (int64_t e : {-1, 0, 1})
        if (k * d + e >= 0 && k * d + e <= INT32_MAX) ns.push_back(int32_t(k * d + e));
    for (int i = 0; i < 16; ++i) ns.push_back(any(rng));
    for (int32_t n : ns) {
      if (n >= 0) {
        ASSERT_TRUE(matches(d, n));
      }
    }
  }
}

TEST(FastDivmod, NonPositiveDivisorIsOne) {  // never used so; defined rather than a division by zero
  EXPECT_EQ(FastDivmod(0).div(12345), 12345);
  EXPECT_EQ(FastDivmod(-3).div(7), 7);
}

}  // namespace
