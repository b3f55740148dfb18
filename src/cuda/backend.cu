// The CUDA dispatcher: picks the kernel family for (device, problem) and calls its entry point.
#include "common/mask.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_backend.hpp"
#include "cuda/kernels.hpp"

namespace flashattn::cuda {

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

bool is_device_pointer(const void* ptr) {
  if (!ptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

namespace {
int current_sm() {
  DeviceInfo dev;
  return device_info(&dev).ok() ? dev.sm : 0;
}
}  // namespace

fa_impl best_impl(const fa_params& p, bool backward) {
  if (current_sm() != 90) return FA_IMPL_CUDA_SM80;
  // ALiBi up to head_dim 128: the sm80 backward (the sm90 one takes it on its kernels of 192 and 256 only).
  if (backward) return sm90_backward_supports(p) ? FA_IMPL_CUDA_SM90 : FA_IMPL_CUDA_SM80;
  // Head dims between the Hopper kernels' (64, 128, 192, 256) run them zero-padded: 1.26-3.2x the sm80 forward at
  // every multiple of 8 measured from 8 to 224 (H200, docs/sm90.md steps 77-78).
  if (!sm90_supports(p)) return FA_IMPL_CUDA_SM80;
  // Decode (a few query rows over a long cache) runs the sm80 forward's decode configs: 16-row tiles
  // whose warps split the keys, or 64-row ones (the Hopper ones have 128 or more), and split-KV in
  // one wave. Before the 16-row tiles (session 61), with 64-row ones: 16 heads, head_dim 128, 4k-64k keys,
  // batch 1: 1.1-2.7 TB/s of K and V against 0.9-2.6 for the Hopper kernel, whose only key split is
  // the last round's (8 pieces a tile at most; 0.44-0.53 before it), 1-6% more at batch 4 and 16
  // (bench/results/h100.json). Elsewhere the sm80 forward only where it splits the keys and the
  // Hopper tiles leave SMs idle, or the caller asks for splits.
  if (sm80_forward_decode(p)) return FA_IMPL_CUDA_SM80;
  const bool split = sm80_forward_splits(p) > 1;
  if (split && (p.num_splits > 1 || !sm90_forward_fills_gpu(p))) return FA_IMPL_CUDA_SM80;
  return FA_IMPL_CUDA_SM90;
}

Status workspace_size(const fa_params& p, fa_impl impl, bool backward, size_t* bytes) {
  switch (impl) {
    case FA_IMPL_CUDA_STANDARD: *bytes = standard_forward_workspace(p); return {};
    case FA_IMPL_CUDA_SM80: *bytes = backward ? sm80_backward_workspace(p) : sm80_forward_workspace(p); return {};
    case FA_IMPL_CUDA_SM90: *bytes = backward ? sm90_backward_workspace(p) : sm90_forward_workspace(p); return {};
    default: return invalid("impl: %s is not a CUDA implementation", fa_impl_name(impl));
  }
}

Status forward(const fa_params& p, fa_impl impl) {
  if (current_sm() < 80) return unsupported("impl %s needs compute capability 8.0 or later", fa_impl_name(impl));
  switch (impl) {
    case FA_IMPL_CUDA_STANDARD: return standard_forward(p);
    case FA_IMPL_CUDA_SM80: return sm80_forward(p);
    case FA_IMPL_CUDA_SM90:
      if (current_sm() != 90) return unsupported("impl flashattn-sm90 needs an sm_90 GPU (H100/H200)");
      return sm90_forward(p);  // says which problems it does not take
    default: return invalid("impl: %s is not a CUDA implementation", fa_impl_name(impl));
  }
}

Status backward(const fa_params& p, fa_impl impl) {
  if (current_sm() < 80) return unsupported("impl %s needs compute capability 8.0 or later", fa_impl_name(impl));
  if (impl == FA_IMPL_CUDA_SM80) return sm80_backward(p);
  if (impl == FA_IMPL_CUDA_SM90) {
    if (current_sm() != 90) return unsupported("impl flashattn-sm90 needs an sm_90 GPU (H100/H200)");
    return sm90_backward(p);
  }
  return unsupported("impl %s has no backward pass", fa_impl_name(impl));
}

}  // namespace flashattn::cuda
