// Does a wgmma in flight slow the softmax beside it? (docs/sm90.md, step 67: an unused S in flight during a
// tile's first softmax cost the head_dim 64 causal 512 cell 2-3%, the next block's S issued ahead of the
// softmax 5-9%.) One CTA, 1 or 2 warpgroups, each running `reps` head_dim 64 blocks (64 x 128 scores a
// warpgroup, as the 2-warpgroup kernels): block_softmax.cuh's softmax (with or without the row max), P packed to
// bf16x2, and, by mode, the block's GEMMs around it:
//   0 softmax alone
//   1 S = q k^T issued and waited for, then the softmax (a tile's first step)
//   2 the next block's S in flight during the softmax (the lookahead of step 67)
//   3 S waited for, then the softmax with O += P v of the block before in flight (the steady step)
//   4 as 1, plus an unused S in flight during the softmax (step 67's diagnostic)
//   5 O += P v of the block before issued and waited for, then as 1 (the serial GEMMs, Traits::kSerial)
//   6 S waited for, then O += P v of the block before issued and in flight during the softmax
// Clocks a block, the slowest warp. q, k, v sit in shared memory in the kernels' 128-byte swizzle, filled
// with small values (timing only; the result goes to `out` so that no wgmma is dead).
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++20 -Isrc -Iinclude -o inflight_rates \
//     dev/sm90/inflight_rates.cu && ./inflight_rates
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "block_softmax.cuh"
#include "cuda/sm90/primitives.cuh"
#include "cuda/sm90/wgmma.cuh"

using namespace flashattn::cuda::sm90;

constexpr int kQBytes = 64 * 64 * 2, kKVBytes = 128 * 64 * 2;  // per warpgroup q (64 rows), k and v (128 rows)

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ void to_a(const float (&s)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

template <int kMode, bool kMax>
__global__ void __launch_bounds__(256, 1) inflight_kernel(long long* clocks, float* out, int reps) {
  extern __shared__ uint8_t raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  uint8_t* q = base;                 // [2][kQBytes]
  uint8_t* k = base + 2 * kQBytes;   // [kKVBytes]
  uint8_t* v = k + kKVBytes;         // [kKVBytes]
  const int total = 2 * kQBytes + 2 * kKVBytes;
  for (int i = threadIdx.x; i < total / 2; i += blockDim.x) {
    const float x = 0.05f * float((i * 37) % 29 - 14) / 14.f;  // |x| <= 0.05: bounded scores
    reinterpret_cast<uint16_t*>(base)[i] = uint16_t(pack_bf16(x, x) & 0xffffu);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the generic writes, seen by wgmma
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const SmemDesc dq = kmajor_desc(smem_addr(q + wg * kQBytes)), dk = kmajor_desc(smem_addr(k));
  const SmemDesc dv = mnmajor_desc(smem_addr(v), kKVBytes);
  float s[64], acc[64], extra[64], o[32], row_sum[2] = {0.f, 0.f};
  uint32_t pa[8][4];
#pragma unroll
  for (int e = 0; e < 64; ++e) s[e] = acc[e] = extra[e] = 0.f;
#pragma unroll
  for (int e = 0; e < 32; ++e) o[e] = 0.f;
  to_a(s, pa);
  auto issue_s = [&](float(&d)[64]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) Wgmma<128, true>::ss<0>(d, dq.at(kk * 32), dk.at(kk * 32), kk > 0);
    wgmma_commit();
  };
  auto issue_pv = [&]() {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) Wgmma<64, true>::rs<1>(o, pa[kk], dv.at(kk * 16 * 128), 1);
    wgmma_commit();
  };
  const float scale = 1.4f;
  if constexpr (kMode == 2) {  // the first block's S, so that each step finds its own done
    wgmma_fence();
    issue_s(acc);
    wgmma_wait<0>();
    fence_registers(acc);
  }
  __syncwarp();
  const long long t0 = clock64();
  for (int r = 0; r < reps; ++r) {
    if constexpr (kMode == 0) {
      block_softmax<0, kMax>(s, scale, row_sum);
#pragma unroll
      for (int e = 0; e < 64; ++e) s[e] = s[e] * 0.01f - 0.005f;  // the next block's scores from this one
    } else if constexpr (kMode == 1 || kMode == 4) {
      wgmma_fence();
      issue_s(acc);
      wgmma_wait<0>();
      fence_registers(acc);
      if constexpr (kMode == 4) {
        wgmma_fence();
        issue_s(extra);
      }
#pragma unroll
      for (int e = 0; e < 64; ++e) s[e] = acc[e];
      block_softmax<0, kMax>(s, scale, row_sum);
      if constexpr (kMode == 4) {
        wgmma_wait<0>();
        fence_registers(extra);
        row_sum[0] += extra[0] * 0.f;
      }
      to_a(s, pa);
    } else if constexpr (kMode == 2) {
#pragma unroll
      for (int e = 0; e < 64; ++e) s[e] = acc[e];
      fence_registers(acc);
      wgmma_fence();
      issue_s(acc);  // the next block's
      block_softmax<0, kMax>(s, scale, row_sum);
      to_a(s, pa);
      wgmma_wait<0>();
      fence_registers(acc);
    } else if constexpr (kMode == 3 || kMode == 5 || kMode == 6) {
      wgmma_fence();
      if constexpr (kMode == 5) {
        issue_pv();  // P of the step before (pa), alone
        wgmma_wait<0>();
        fence_registers(o);
        wgmma_fence();
      }
      issue_s(acc);
      if constexpr (kMode == 3) issue_pv();  // P of the step before (pa)
      wgmma_wait<kMode == 3 ? 1 : 0>();
      fence_registers(acc);
      if constexpr (kMode == 6) {
        wgmma_fence();
        issue_pv();
      }
#pragma unroll
      for (int e = 0; e < 64; ++e) s[e] = acc[e];
      block_softmax<0, kMax>(s, scale, row_sum);
      wgmma_wait<0>();
      fence_registers(o);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(pa[kk][j])::"memory");
      to_a(s, pa);
    }
  }
  const long long t1 = clock64();
  float keep = row_sum[0] + row_sum[1] + __uint_as_float(pa[0][0] & 0x3f7fffffu);
#pragma unroll
  for (int e = 0; e < 32; ++e) keep += o[e] * 1e-30f;
  out[threadIdx.x] = keep;
  if (threadIdx.x % 32 == 0) clocks[threadIdx.x / 32] = t1 - t0;
}

template <int kMode, bool kMax>
void measure(int warpgroups, const char* what, long long* clocks, float* out) {
  const int smem = 2 * kQBytes + 2 * kKVBytes + 1024, reps = 256;
  cudaFuncSetAttribute(inflight_kernel<kMode, kMax>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  for (int run = 0; run < 2; ++run) inflight_kernel<kMode, kMax><<<1, 128 * warpgroups, smem>>>(clocks, out, reps);
  cudaDeviceSynchronize();
  long long h[8], mx = 0;
  cudaMemcpy(h, clocks, sizeof(long long) * 4 * warpgroups, cudaMemcpyDeviceToHost);
  for (int w = 0; w < 4 * warpgroups; ++w) mx = h[w] > mx ? h[w] : mx;
  std::printf("%d warpgroup(s), %-9s %-58s %6.0f clocks a block\n", warpgroups, kMax ? "row max" : "no max", what,
              double(mx) / reps);
}

template <bool kMax>
void sweep(int warpgroups, long long* clocks, float* out) {
  measure<0, kMax>(warpgroups, "0 softmax alone", clocks, out);
  measure<1, kMax>(warpgroups, "1 S, wait, softmax (a tile's first step)", clocks, out);
  measure<2, kMax>(warpgroups, "2 the next block's S in flight during the softmax", clocks, out);
  measure<3, kMax>(warpgroups, "3 S + O += P v, wait S, softmax, wait O (steady step)", clocks, out);
  measure<4, kMax>(warpgroups, "4 as 1 with an unused S in flight during the softmax", clocks, out);
  measure<5, kMax>(warpgroups, "5 O += P v, wait, S, wait, softmax (serial GEMMs)", clocks, out);
  measure<6, kMax>(warpgroups, "6 S, wait, O += P v in flight during the softmax, wait", clocks, out);
}

int main() {
  long long* clocks;
  float* out;
  cudaMalloc(&clocks, 8 * sizeof(long long));
  cudaMalloc(&out, 256 * sizeof(float));
  for (int warpgroups : {1, 2}) {
    sweep<true>(warpgroups, clocks, out);
    sweep<false>(warpgroups, clocks, out);
  }
  const cudaError_t e = cudaGetLastError();
  std::printf("%s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
