// Small helpers shared by the CUDA sources: error checks that turn into a Status, dtype traits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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
