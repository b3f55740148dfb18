// fp16 / bf16 host buffers for the CLI: the library's own conversions (src/common/dtype.hpp,
// header-only, round to nearest even) applied to whole arrays.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/dtype.hpp"

namespace fa_cli {

using flashattn::round_to;
inline size_t dtype_bytes(fa_dtype d) { return flashattn::dtype_size(d); }

// n fp32 values to the dtype's bytes and back.
inline void encode(const float* in, int64_t n, fa_dtype d, void* out) {
  if (d == FA_FLOAT32) {
    std::memcpy(out, in, size_t(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) flashattn::store_element(out, i, in[i], d);
}
inline void decode(const void* in, int64_t n, fa_dtype d, float* out) {
  if (d == FA_FLOAT32) {
    std::memcpy(out, in, size_t(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = flashattn::load_element(in, i, d);
}

}  // namespace fa_cli
