// One 64 x 128 block's softmax as the head_dim 64 kernels run it, for the dev microbenchmarks (pipe_rates.cu,
// inflight_rates.cu): 64 scores a thread (rows r and r + 8, 32 columns each), the row max over the quad by two
// shuffles (kMax), exp2(s * scale - max) in place by FFMA and MUFU (every kPolyEvery-th column group by a
// polynomial on the FMA pipe instead), the row sums in 4 chains (kSums).
#pragma once

#include <cstdint>

// 2^x for x <= 0 on the FMA pipe: x = j + f, j = rint(x), f in [-1/2, 1/2]; 2^f by a degree-4 polynomial
// (relative error ~4e-6), j added to the exponent bits; x < -126 gives 0.
__device__ __forceinline__ float exp2_poly(float x) {
  x = fmaxf(x, -127.f);
  const float j = __fadd_rn(x, 12582912.f);  // 1.5 * 2^23: rint(x) in the low bits
  const float r = __fsub_rn(j, 12582912.f);
  const float f = x - r;
  float p = fmaf(f, 1.3333558e-3f, 9.6181291e-3f);
  p = fmaf(p, f, 5.5504109e-2f);
  p = fmaf(p, f, 2.4022651e-1f);
  p = fmaf(p, f, 6.9314718e-1f);
  p = fmaf(p, f, 1.f);
  const int bits = __float_as_int(p) + (__float_as_int(j) << 23);
  return x <= -127.f ? 0.f : __int_as_float(bits);
}

// Without kMax the subtrahend is `scale` (the optimistic softmax: a running max that stands).
template <int kPolyEvery, bool kMax, bool kSums = true>
__device__ __forceinline__ void block_softmax(float (&s)[64], float scale, float (&row_sum)[2]) {
  float m[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float part[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) part[c] = fmaxf(s[4 * c + 2 * i], s[4 * c + 2 * i + 1]);
#pragma unroll
    for (int n = 4; n < 16; ++n) part[n % 4] = fmaxf(part[n % 4], fmaxf(s[4 * n + 2 * i], s[4 * n + 2 * i + 1]));
    float x = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    m[i] = kMax ? x * scale : scale;
  }
  float sum[2][4] = {};
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float e;
        if (kPolyEvery > 0 && n % kPolyEvery == kPolyEvery - 1) {
          e = exp2_poly(fmaf(s[4 * n + 2 * i + j], scale, -m[i]));
        } else {
          asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fmaf(s[4 * n + 2 * i + j], scale, -m[i])));
        }
        s[4 * n + 2 * i + j] = e;
        if (kSums) sum[i][n % 4] += e;
      }
#pragma unroll
  for (int i = 0; i < 2; ++i) row_sum[i] += (sum[i][0] + sum[i][1]) + (sum[i][2] + sum[i][3]);
}
