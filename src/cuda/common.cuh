// Small helpers shared by the CUDA sources: error checks that turn into a Status, dtype traits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>

#include "common/status.hpp"

namespace flashattn::cuda {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return {FA_ERROR_CUDA, format("%s: %s", what, cudaGetErrorString(err))};
}

// After a launch: the launch error (bad configuration, too much shared memory, ...).
#define FA_CUDA_CHECK_LAUNCH(what) FA_RETURN_IF_ERROR(::flashattn::cuda::cuda_status(cudaGetLastError(), what))
#define FA_CUDA_CHECK(expr) FA_RETURN_IF_ERROR(::flashattn::cuda::cuda_status((expr), #expr))

inline cudaStream_t stream_of(const fa_params& p) { return static_cast<cudaStream_t>(p.stream); }

// What the dispatch and the launch heuristics ask of the current device.
struct DeviceInfo {
  int index = 0;
  int sm = 0;  // compute capability, major * 10 + minor
  int num_sms = 1;
  int64_t l2_bytes = int64_t(50) << 20;
  int smem_per_block = 0;  // dynamic shared memory one block may opt in to (0: unknown)
};

// The current device's DeviceInfo: which device is current is asked on every call (cudaSetDevice
// changes it), its attributes once per device ordinal (below 64; past that on every call).
inline Status device_info(DeviceInfo* info) {
  int dev = 0;
  if (const cudaError_t err = cudaGetDevice(&dev); err != cudaSuccess) {
    cudaGetLastError();  // not left behind for a later launch check
    return cuda_status(err, "cudaGetDevice");
  }
  auto query = [dev] {
    DeviceInfo d;
    d.index = dev;
    int major = 0, minor = 0, sms = 0, l2 = 0;
    bool failed = false;
    for (auto [value, attr] : {std::pair{&major, cudaDevAttrComputeCapabilityMajor},
                               std::pair{&minor, cudaDevAttrComputeCapabilityMinor},
                               std::pair{&sms, cudaDevAttrMultiProcessorCount}, std::pair{&l2, cudaDevAttrL2CacheSize},
                               std::pair{&d.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin}})
      failed |= cudaDeviceGetAttribute(value, attr, dev) != cudaSuccess;
    if (failed) cudaGetLastError();  // a failed query keeps its default and leaves no error behind
    d.sm = major * 10 + minor;
    if (sms > 0) d.num_sms = sms;
    if (l2 > 0) d.l2_bytes = l2;
    return d;
  };
  constexpr int kCachedDevices = 64;
  if (dev < 0 || dev >= kCachedDevices) {
    *info = query();
    return {};
  }
  static DeviceInfo cache[kCachedDevices];
  static std::once_flag once[kCachedDevices];
  std::call_once(once[dev], [&] { cache[dev] = query(); });
  *info = cache[dev];
  return {};
}

// Both GPU forwards' online softmax: a row's running max moves only when a key block raises it by
// more than kMaxSlack (log2 units; a row's first visible block always does). O / l and the lse
// (max + log2 l) are the same for any max used throughout, so a stale max changes nothing but the
// range of P (below 2^kMaxSlack, as exact in bf16 / fp16 as below 1), and O is rescaled only in the
// rare blocks that move it that far (docs/sm90.md, step 16).
constexpr float kMaxSlack = 8.f;

// The softcap's tanh in the GPU kernels (s = softcap * tanh(s * scale / softcap), and 1 - tanh^2 in the
// backward's dS): the SFU's tanh.approx.f32, one instruction in place of tanhf's libdevice sequence; the
// forward's lse and the backward's P use the same one. Its relative error, about 2^-11 (PTX ISA), moves a
// score of softcap * tanh by about softcap * 2^-11 at most; FlashAttention 2 and 3 take it too. Dev switch:
// FLASHATTN_FAST_TANH=0 builds tanhf.
#ifndef FLASHATTN_FAST_TANH
#define FLASHATTN_FAST_TANH 1
#endif
#if defined(__CUDACC__)
__device__ __forceinline__ float softcap_tanh(float x) {
#if FLASHATTN_FAST_TANH
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return tanhf(x);
#endif
}
#endif

// A kernel's dynamic shared memory against what this GPU lets one block use: the sm80 tables are
// sized for the A100 (163 KB), and a GPU with less (99 KB on sm_86 / sm_89 cards) gets this error
// instead of cudaFuncSetAttribute's "invalid argument".
inline Status require_shared_memory(const DeviceInfo& dev, int bytes, const char* impl, const char* pass,
                                    int head_dim) {
  if (bytes <= dev.smem_per_block) return {};
  return unsupported("%s: the %s kernel for head_dim %d needs %d bytes of shared memory per block; this GPU allows %d",
                     impl, pass, head_dim, bytes, dev.smem_per_block);
}

// Lets kKernel launch with `bytes` (the same on every call) of dynamic shared memory on device dev
// (the current one): the first call there checks the GPU's limit (require_shared_memory) and sets the
// attribute, later ones only test a bit (one per device ordinal; ordinals past 63 set it every call).
template <auto kKernel>
Status opt_in_shared_memory(const DeviceInfo& dev, int bytes, const char* impl, const char* pass, int head_dim) {
  static std::atomic<uint64_t> opted_in{0};
  const uint64_t bit = dev.index < 64 ? uint64_t(1) << dev.index : 0;
  if (opted_in.load(std::memory_order_acquire) & bit) return {};
  FA_RETURN_IF_ERROR(require_shared_memory(dev, bytes, impl, pass, head_dim));
  FA_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  opted_in.fetch_or(bit, std::memory_order_acq_rel);
  return {};
}
// The same for a caller that has not asked for the current device yet (device_info's cudaGetDevice).
template <auto kKernel>
Status opt_in_shared_memory(int bytes, const char* impl, const char* pass, int head_dim) {
  DeviceInfo dev;
  FA_RETURN_IF_ERROR(device_info(&dev));
  return opt_in_shared_memory<kKernel>(dev, bytes, impl, pass, head_dim);
}

// Workspace check shared by every entry point: the caller supplies device memory.
inline Status require_workspace(const fa_params& p, size_t needed, const char* impl) {
  if (needed == 0) return {};
  if (!p.workspace || p.workspace_bytes < needed)
    return {FA_ERROR_WORKSPACE, format("workspace: %s needs %zu bytes of device memory (got %zu at %p); ask fa_workspace_size",
                                       impl, needed, p.workspace ? p.workspace_bytes : size_t(0), p.workspace)};
  return {};
}

template <fa_dtype D> struct DTypeOf;
template <> struct DTypeOf<FA_FLOAT16> { using type = __half; };
template <> struct DTypeOf<FA_BFLOAT16> { using type = __nv_bfloat16; };

}  // namespace flashattn::cuda
