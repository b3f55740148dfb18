// fp16 / bf16 conversions of src/common/dtype.hpp: exhaustive round trips of every 16-bit
// pattern, and float -> 16-bit rounding against independent oracles (the compiler's _Float16 for
// fp16, nearest-even chosen by explicit distance for bf16) on special values and random floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "common/dtype.hpp"

namespace {

using namespace flashattn;

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

uint16_t half_oracle(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// Nearest bf16 by distance (ties to the even pattern); overflow past the largest finite bf16 by half
// an ulp or more gives inf.
uint16_t bf16_oracle(float f) {
  const uint32_t x = bits(f);
  const uint16_t lo = uint16_t(x >> 16), hi = uint16_t(lo + 1);
  const double dlo = std::fabs(double(f) - double(bf16_to_float(lo)));
  const double dhi = std::fabs(double(bf16_to_float(hi)) - double(f));
  if ((x & 0xffffu) == 0) return lo;
  if ((hi & 0x7f80u) == 0x7f80u && (hi & 0x7fu) == 0) {  // hi is inf: compare with the would-be next value
    const double ulp = std::fabs(double(bf16_to_float(lo))) - std::fabs(double(bf16_to_float(uint16_t(lo - 1))));
    return std::fabs(double(f)) - std::fabs(double(bf16_to_float(lo))) >= ulp / 2 ? hi : lo;
  }
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;
}

TEST(Dtype, EveryHalfPatternSurvivesARoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = uint16_t(b);
    const float f = half_to_float(h);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float_to_half(f), h) << std::hex << b;
    ASSERT_EQ(bits(f), bits(float(static_cast<_Float16>(f)))) << "half_to_float is not exact for " << std::hex << b;
  }
}

TEST(Dtype, EveryBfloat16PatternSurvivesARoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = uint16_t(b);
    const float f = bf16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), h) << std::hex << b;
  }
}

TEST(Dtype, HalfRoundingOfSpecialValues) {
  const float specials[] = {0.f, -0.f, 1.f, 65504.f, 65519.99f, 65520.f, -65520.f, 1e6f,
                            std::ldexp(1.f, -24), std::ldexp(1.f, -25), std::ldexp(1.5f, -25), std::ldexp(1.f, -26),
                            std::ldexp(1.f, -14), std::ldexp(1023.f, -24), std::ldexp(2047.f, -25),
                            1.f + std::ldexp(1.f, -11), 1.f + std::ldexp(3.f, -11), 2049.f, 2051.f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()};
  for (float f : specials) EXPECT_EQ(float_to_half(f), half_oracle(f)) << f;
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Dtype, HalfRoundingMatchesTheCompilerOnRandomFloats) {
  std::mt19937 rng(12345);
  for (int i = 0; i < 2000000; ++i) {
    // Exponents around fp16's range (subnormals to overflow), every mantissa.
    const uint32_t exponent = 97 + rng() % 50, mantissa = rng() & 0x7fffffu, sign = rng() & 1u;
    const float f = from_bits(sign << 31 | exponent << 23 | mantissa);
    ASSERT_EQ(float_to_half(f), half_oracle(f)) << std::hexfloat << f;
  }
}

TEST(Dtype, Bfloat16RoundingIsNearestEven) {
  std::mt19937 rng(777);
  for (int i = 0; i < 2000000; ++i) {
    const float f = from_bits((rng() & 0x7f7fffffu) | (rng() & 1u) << 31);  // finite, every exponent
    ASSERT_EQ(float_to_bf16(f), bf16_oracle(f)) << std::hexfloat << f;
  }
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000u)), 0x3f80u);  // tie, even stays
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000u)), 0x3f82u);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Dtype, StoreThenLoadEqualsRoundTo) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 100.f);
  for (fa_dtype dt : {FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16}) {
    alignas(4) unsigned char buffer[8] = {};
    for (int i = 0; i < 10000; ++i) {
      const float f = normal(rng);
      store_element(buffer, 1, f, dt);
      EXPECT_EQ(bits(load_element(buffer, 1, dt)), bits(round_to(f, dt))) << fa_dtype_name(dt) << " " << f;
    }
    EXPECT_EQ(dtype_size(dt), dt == FA_FLOAT32 ? 4u : 2u);
  }
}

}  // namespace
