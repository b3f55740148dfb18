// What the forward's softmax costs on one SM (docs/sm90.md, step 54): clocks per warp instruction on one
// sub-partition (SMSP) for its instructions (MUFU.EX2, F2FP = cvt.rn.bf16x2.f32, FFMA, FADD, FMNMX, PRMT),
// one CTA of `warps` warps (warps / 4 per SMSP), each warp kChains independent chains; then one 64 x 128
// block's softmax as the head_dim 64 kernels run it, for 1, 2 or 3 warpgroups at once, with and without
// the row max, and with a share of the exp2s on the FMA pipe.
//   nvcc -O3 -arch=sm_90a -o pipe_rates dev/sm90/pipe_rates.cu && ./pipe_rates
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#include "block_softmax.cuh"

constexpr int kIters = 4096, kChains = 8;

template <int kOp>
__global__ void pipe_kernel(float* out, long long* clocks, float seed) {
  float x[kChains];
  uint32_t u[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) { x[c] = seed + 0.001f * (threadIdx.x + c); u[c] = __float_as_uint(x[c]); }
  __syncthreads();
  long long t0 = clock64();
#pragma unroll 4
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (kOp == 0) {  // MUFU.EX2
        asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[c]));
      } else if constexpr (kOp == 1) {  // F2FP pack of two floats into bf16x2
        uint32_t r;
        asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x[c]), "f"(x[(c + 1) % kChains]));
        x[c] = __uint_as_float(r);
      } else if constexpr (kOp == 2) {  // FFMA
        asm volatile("fma.rn.f32 %0, %0, %0, %0;" : "+f"(x[c]));
      } else if constexpr (kOp == 3) {  // FMNMX
        asm volatile("max.f32 %0, %0, %1;" : "+f"(x[c]) : "f"(x[(c + 3) % kChains]));
      } else if constexpr (kOp == 4) {  // IADD3
        asm volatile("add.u32 %0, %0, %1;" : "+r"(u[c]) : "r"(u[(c + 1) % kChains]));
      } else if constexpr (kOp == 8) {  // IMNMX
        asm volatile("max.s32 %0, %0, %1;" : "+r"(u[c]) : "r"(u[(c + 3) % kChains]));
      } else if constexpr (kOp == 5) {  // PRMT (the two high halves)
        asm volatile("prmt.b32 %0, %0, %1, 0x7632;" : "+r"(u[c]) : "r"(u[(c + 1) % kChains]));
      } else if constexpr (kOp == 6) {  // cvt.rn.f16x2.f32
        uint32_t r;
        asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x[c]), "f"(x[(c + 1) % kChains]));
        x[c] = __uint_as_float(r);
      } else if constexpr (kOp == 7) {  // FADD
        asm volatile("add.f32 %0, %0, %1;" : "+f"(x[c]) : "f"(x[(c + 5) % kChains]));
      }
    }
  }
  long long t1 = clock64();
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) acc += x[c] + __uint_as_float(u[c]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x % 32 == 0) clocks[threadIdx.x / 32] = t1 - t0;
}

template <int kOp>
void measure(const char* name, int warps, float* out, long long* clocks) {
  pipe_kernel<kOp><<<1, 32 * warps>>>(out, clocks, 0.5f);
  pipe_kernel<kOp><<<1, 32 * warps>>>(out, clocks, 0.5f);
  cudaDeviceSynchronize();
  long long h[64];
  cudaMemcpy(h, clocks, sizeof(long long) * warps, cudaMemcpyDeviceToHost);
  long long mx = 0;
  for (int w = 0; w < warps; ++w) mx = h[w] > mx ? h[w] : mx;
  // Per SMSP: warps / 4 warps each ran kIters * kChains instructions.
  const double per_smsp = double(kIters) * kChains * (warps >= 4 ? warps / 4 : 1);
  printf("%-28s warps %2d: %6.2f clocks a warp instruction on an SMSP\n", name, warps, mx / per_smsp);
}

// One block's first softmax as the 2-warpgroup head_dim 64 kernel runs it (block_softmax.cuh), timed per warp;
// `reps` blocks back to back, each on fresh scores (s += p keeps a dependency).
template <int kPolyEvery, bool kMax, bool kSums = true>
__global__ void softmax_kernel(float* out, long long* clocks, float scale, int reps) {
  float s[64];
#pragma unroll
  for (int e = 0; e < 64; ++e) s[e] = 0.01f * ((threadIdx.x * 7 + e * 13) % 97);
  uint32_t acc = 0;
  float row_sum[2] = {0.f, 0.f};
  __syncthreads();
  long long t0 = clock64();
  for (int r = 0; r < reps; ++r) {
    block_softmax<kPolyEvery, kMax, kSums>(s, scale, row_sum);
#pragma unroll
    for (int k = 0; k < 32; ++k) {
      uint32_t p;
      asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(s[2 * k + 1]), "f"(s[2 * k]));
      acc ^= p;
      s[2 * k] += __uint_as_float(p & 0x3f000000u);  // the next block's scores depend on this one
    }
  }
  long long t1 = clock64();
  out[blockIdx.x * blockDim.x + threadIdx.x] = row_sum[0] + row_sum[1] + __uint_as_float(acc & 0x3f7fffffu);
  if (threadIdx.x % 32 == 0) clocks[threadIdx.x / 32] = t1 - t0;
}

template <int kPolyEvery, bool kMax, bool kSums = true>
void measure_softmax(int warps, const char* what) {
  float* out;
  long long* clocks;
  cudaMalloc(&out, 4096 * sizeof(float));
  cudaMalloc(&clocks, 64 * sizeof(long long));
  const int reps = 64;
  softmax_kernel<kPolyEvery, kMax, kSums><<<1, 32 * warps>>>(out, clocks, 0.125f, reps);
  softmax_kernel<kPolyEvery, kMax, kSums><<<1, 32 * warps>>>(out, clocks, 0.125f, reps);
  cudaDeviceSynchronize();
  long long h[64];
  cudaMemcpy(h, clocks, sizeof(long long) * warps, cudaMemcpyDeviceToHost);
  long long mx = 0;
  for (int w = 0; w < warps; ++w) mx = h[w] > mx ? h[w] : mx;
  printf("softmax of a 64 x 128 block (%s), %d warpgroup(s) at once: %6.0f clocks a block\n", what, warps / 4, double(mx) / reps);
  cudaFree(out);
  cudaFree(clocks);
}

int main() {
  float* out;
  long long* clocks;
  cudaMalloc(&out, 4096 * sizeof(float));
  cudaMalloc(&clocks, 64 * sizeof(long long));
  for (int warps : {4, 8, 16}) {
    measure<0>("ex2.approx.ftz.f32", warps, out, clocks);
    measure<1>("cvt.rn.bf16x2.f32", warps, out, clocks);
    measure<6>("cvt.rn.f16x2.f32", warps, out, clocks);
    measure<2>("fma.rn.f32", warps, out, clocks);
    measure<7>("add.f32", warps, out, clocks);
    measure<3>("max.f32", warps, out, clocks);
    measure<4>("add.u32", warps, out, clocks);
    measure<5>("prmt.b32", warps, out, clocks);
    measure<8>("max.s32", warps, out, clocks);
  }
  for (int warps : {4, 8, 12}) {
    measure_softmax<0, true>(warps, "as the kernel");
    measure_softmax<0, false>(warps, "no row max");
    measure_softmax<0, false, false>(warps, "no row max, no sums");
    measure_softmax<0, true, false>(warps, "row max, no sums");
    measure_softmax<4, true>(warps, "1/4 exp2 by polynomial");
    measure_softmax<2, true>(warps, "1/2 exp2 by polynomial");
  }
  cudaError_t e = cudaGetLastError();
  printf("%s\n", cudaGetErrorString(e));
  return 0;
}
