// fp16 / bf16 bit patterns from and to fp32 (round to nearest even), for the CLI's host buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashattn/flashattn.h"

namespace fa_cli {

inline uint32_t bits_of(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float float_of(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline uint16_t to_half(float f) {
  uint32_t x = bits_of(f), sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  if (x < 0x38800000u)  // below the smallest normal: a multiple of 2^-24, rounded to even
    return uint16_t(sign | uint32_t(std::nearbyint(float_of(x) * 16777216.0f)));
  x += 0xc8000fffu + ((x >> 13) & 1u);  // rebias 127 -> 15 and round the 13 dropped bits
  return uint16_t(sign | (x >> 13));
}

inline float from_half(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(float(m), -24);
  if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t to_bf16(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

inline float from_bf16(uint16_t h) { return float_of(uint32_t(h) << 16); }

inline size_t dtype_bytes(fa_dtype d) { return d == FA_FLOAT32 ? 4 : 2; }

inline float round_to(float v, fa_dtype d) {
  if (d == FA_FLOAT16) return from_half(to_half(v));
  if (d == FA_BFLOAT16) return from_bf16(to_bf16(v));
  return v;
}

// n fp32 values to the dtype's bytes and back.
inline void encode(const float* in, int64_t n, fa_dtype d, void* out) {
  if (d == FA_FLOAT32) {
    std::memcpy(out, in, size_t(n) * 4);
    return;
  }
  auto* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = d == FA_FLOAT16 ? to_half(in[i]) : to_bf16(in[i]);
}
inline void decode(const void* in, int64_t n, fa_dtype d, float* out) {
  if (d == FA_FLOAT32) {
    std::memcpy(out, in, size_t(n) * 4);
    return;
  }
  auto* x = static_cast<const uint16_t*>(in);
  for (int64_t i = 0; i < n; ++i) out[i] = d == FA_FLOAT16 ? from_half(x[i]) : from_bf16(x[i]);
}

}  // namespace fa_cli
