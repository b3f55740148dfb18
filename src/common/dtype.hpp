// Host-side element access for the three dtypes: fp32 as is, fp16 and bf16 as 16-bit patterns
// converted with round-to-nearest-even. The CPU backend converts whole rows on load, so this is
// off the O(N^2 d) hot path.
#pragma once

#include <cstdint>
#include <cstring>

#include "flashattn/flashattn.h"

namespace flashattn {

inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do { mant <<= 1; ++e; } while (!(mant & 0x400u));
    bits = sign | uint32_t(112 - e) << 23 | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {                                   // below the smallest normal: subnormal
    if (absx < 0x33000000u) return uint16_t(sign);            // < 2^-25 rounds to 0
    uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (112 - e) + ... aligned to 2^-24 units
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = absx - 0x38000000u;  // rebias 127 -> 15
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return uint16_t(sign | (r >> 13));
}

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

inline size_t dtype_size(fa_dtype d) { return d == FA_FLOAT32 ? 4 : 2; }

inline float load_element(const void* base, int64_t index, fa_dtype d) {
  switch (d) {
    case FA_FLOAT32: return static_cast<const float*>(base)[index];
    case FA_FLOAT16: return half_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
}

inline void store_element(void* base, int64_t index, float value, fa_dtype d) {
  switch (d) {
    case FA_FLOAT32: static_cast<float*>(base)[index] = value; break;
    case FA_FLOAT16: static_cast<uint16_t*>(base)[index] = float_to_half(value); break;
    default: static_cast<uint16_t*>(base)[index] = float_to_bf16(value); break;
  }
}

// value rounded to the dtype and back (what a store then a load gives).
inline float round_to(float value, fa_dtype d) {
  switch (d) {
    case FA_FLOAT32: return value;
    case FA_FLOAT16: return half_to_float(float_to_half(value));
    default: return bf16_to_float(float_to_bf16(value));
  }
}

// Row loaders: n contiguous elements to / from fp32.
inline void load_row(const void* base, int64_t offset, int n, fa_dtype d, float* out) {
  for (int i = 0; i < n; ++i) out[i] = load_element(base, offset + i, d);
}
inline void store_row(void* base, int64_t offset, int n, const float* in, fa_dtype d) {
  for (int i = 0; i < n; ++i) store_element(base, offset + i, in[i], d);
}

}  // namespace flashattn
