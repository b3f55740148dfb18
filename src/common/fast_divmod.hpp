// n / d and n % d for a divisor fixed at launch, by a multiply-high and a shift instead of the GPU's
// ~20-instruction integer division (Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994, section 4): with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1,
// n / d = (mulhi(m, n) + n) >> l for every 0 <= n < 2^31. The constants are computed on the host.
#pragma once

#include <cstdint>

#include "common/mask.hpp"  // FA_HOST_DEVICE

namespace flashattn {

struct FastDivmod {
  uint32_t divisor = 1, multiplier = 0, shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(int32_t d) : divisor(uint32_t(d > 0 ? d : 1)) {
    while ((uint64_t(1) << shift) < divisor) ++shift;
    multiplier = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << shift) - divisor) / divisor + 1);
  }

  // n in [0, 2^31).
  FA_HOST_DEVICE int32_t div(int32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(multiplier, uint32_t(n));
#else
    const uint32_t hi = uint32_t((uint64_t(multiplier) * uint32_t(n)) >> 32);
#endif
    return int32_t((hi + uint32_t(n)) >> shift);
  }
  // quotient = n / d, returns n % d.
  FA_HOST_DEVICE int32_t divmod(int32_t n, int32_t& quotient) const {
    quotient = div(n);
    return n - quotient * int32_t(divisor);
  }
};

}  // namespace flashattn
