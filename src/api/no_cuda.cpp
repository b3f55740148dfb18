// Linked instead of the CUDA backend when the library is built without nvcc.
#include "cuda/cuda_backend.hpp"

namespace flashattn::cuda {

namespace {
Status no_cuda() { return {FA_ERROR_NO_DEVICE, "this build of flashattn has no CUDA backend (nvcc was not found at build time)"}; }
}  // namespace

bool available() { return false; }
bool is_device_pointer(const void*) { return false; }
fa_impl best_impl(const fa_params&, bool) { return FA_IMPL_CUDA_SM80; }
Status forward(const fa_params&, fa_impl) { return no_cuda(); }
Status backward(const fa_params&, fa_impl) { return no_cuda(); }
Status workspace_size(const fa_params&, fa_impl, bool, size_t*) { return no_cuda(); }

}  // namespace flashattn::cuda
