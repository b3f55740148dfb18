// The C ABI: validate, pick an implementation, call it, keep the error message per thread.
#include <array>
#include <cmath>
#include <exception>
#include <string>
#include <utility>

#include "api/validate.hpp"
#include "cpu/cpu_backend.hpp"
#include "cuda/cuda_backend.hpp"

using namespace flashattn;

namespace {

thread_local std::string g_last_error;

fa_status finish(const Status& s) {
  g_last_error = s.message;
  return s.code;
}

bool is_cuda_impl(fa_impl impl) {
  return impl == FA_IMPL_CUDA_STANDARD || impl == FA_IMPL_CUDA_SM80 || impl == FA_IMPL_CUDA_SM90;
}

// AUTO: CUDA when the tensors live on the GPU, else the CPU FA2.
fa_impl resolve(const fa_params& p, fa_impl impl, bool backward) {
  if (impl != FA_IMPL_AUTO) return impl;
  if (cuda::is_device_pointer(p.q)) return cuda::best_impl(p, backward);
  return FA_IMPL_CPU_FA2;
}

// The small arrays beside the tensors that validate reads on the host (index arrays, ALiBi slopes).
using IndexArray = std::pair<const char*, const void*>;
std::array<IndexArray, 6> index_arrays(const fa_params& p) {
  return {IndexArray{"cu_seqlens_q", p.cu_seqlens_q}, IndexArray{"cu_seqlens_k", p.cu_seqlens_k},
          IndexArray{"seqused_k", p.seqused_k}, IndexArray{"block_table", p.block_table},
          IndexArray{"leftpad_k", p.leftpad_k}, IndexArray{"alibi_slopes", p.alibi_slopes}};
}

// A CPU implementation's index arrays are host memory: validate reads them (GPU memory would crash it).
Status check_host_indices(const fa_params& p, fa_impl impl) {
  if (is_cuda_impl(impl)) return {};
  for (const auto& [name, ptr] : index_arrays(p))
    if (ptr && cuda::is_device_pointer(ptr)) return invalid("%s is GPU memory but impl %s runs on the CPU", name, fa_impl_name(impl));
  return {};
}

Status check_memory_side(const fa_params& p, fa_impl impl) {
  const bool on_device = cuda::is_device_pointer(p.q) || cuda::is_device_pointer(p.o);
  if (is_cuda_impl(impl)) {
    if (!cuda::available()) return {FA_ERROR_NO_DEVICE, format("impl %s needs a CUDA GPU: none is present or this build has no CUDA", fa_impl_name(impl))};
    if (p.q && !cuda::is_device_pointer(p.q)) return invalid("q is host memory but impl %s runs on the GPU", fa_impl_name(impl));
    if (p.o && !cuda::is_device_pointer(p.o)) return invalid("o is host memory but impl %s runs on the GPU", fa_impl_name(impl));
    // The index arrays a kernel reads (a host pointer would fault it).
    for (const auto& [name, ptr] : index_arrays(p))
      if (ptr && !cuda::is_device_pointer(ptr)) return invalid("%s is host memory but impl %s runs on the GPU", name, fa_impl_name(impl));
  } else if (on_device) {
    return invalid("q/o are GPU memory but impl %s runs on the CPU", fa_impl_name(impl));
  }
  return {};
}

template <class Fn>
fa_status guarded(Fn fn) {
  try {
    return finish(fn());
  } catch (const std::exception& e) {
    return finish({FA_ERROR_INTERNAL, std::string("internal error: ") + e.what()});
  } catch (...) {
    return finish({FA_ERROR_INTERNAL, "internal error"});
  }
}

}  // namespace

extern "C" {

void fa_params_init(fa_params* p) {
  if (!p) return;
  *p = fa_params{};
  p->dtype = FA_FLOAT16;
  p->window_left = -1;
  p->window_right = -1;
}

void fa_params_set_contiguous_strides(fa_params* p) {
  if (!p) return;
  const int64_t d = p->head_dim, h = p->num_heads, hk = p->num_heads_kv;
  const int64_t sq = p->seqlen_q, sk = p->seqlen_k;
  auto set = [](int64_t& bs, int64_t& rs, int64_t& hs, int64_t rows, int64_t heads, int64_t d) {
    hs = d;
    rs = heads * d;
    bs = rows * heads * d;
  };
  set(p->q_batch_stride, p->q_row_stride, p->q_head_stride, sq, h, d);
  set(p->o_batch_stride, p->o_row_stride, p->o_head_stride, sq, h, d);
  set(p->do_batch_stride, p->do_row_stride, p->do_head_stride, sq, h, d);
  set(p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride, sq, h, d);
  set(p->k_batch_stride, p->k_row_stride, p->k_head_stride, sk, hk, d);
  set(p->v_batch_stride, p->v_row_stride, p->v_head_stride, sk, hk, d);
  set(p->dk_batch_stride, p->dk_row_stride, p->dk_head_stride, sk, hk, d);
  set(p->dv_batch_stride, p->dv_row_stride, p->dv_head_stride, sk, hk, d);
}

fa_status fa_forward(const fa_params* p, fa_impl impl) {
  return guarded([&]() -> Status {
    if (!p) return invalid("params: null pointer");
    FA_RETURN_IF_ERROR(check_impl_value(impl));
    fa_impl chosen = resolve(*p, impl, false);
    FA_RETURN_IF_ERROR(check_host_indices(*p, chosen));  // validate reads them
    FA_RETURN_IF_ERROR(validate(p, Pass::Forward, chosen));
    FA_RETURN_IF_ERROR(check_memory_side(*p, chosen));
    if (p->batch == 0 || (p->cu_seqlens_q ? p->total_q == 0 : p->seqlen_q == 0)) return {};
    switch (chosen) {
      case FA_IMPL_CPU_REFERENCE: return cpu::reference_forward(*p);
      case FA_IMPL_CPU_FA1: return cpu::fa1_forward(*p);
      case FA_IMPL_CPU_FA2: return cpu::fa2_forward(*p);
      default: return cuda::forward(*p, chosen);
    }
  });
}

fa_status fa_backward(const fa_params* p, fa_impl impl) {
  return guarded([&]() -> Status {
    if (!p) return invalid("params: null pointer");
    FA_RETURN_IF_ERROR(check_impl_value(impl));
    fa_impl chosen = resolve(*p, impl, true);
    FA_RETURN_IF_ERROR(check_host_indices(*p, chosen));  // validate reads them
    FA_RETURN_IF_ERROR(validate(p, Pass::Backward, chosen));
    FA_RETURN_IF_ERROR(check_memory_side(*p, chosen));
    if (p->batch == 0) return {};
    switch (chosen) {
      case FA_IMPL_CPU_REFERENCE: return cpu::reference_backward(*p);
      case FA_IMPL_CPU_FA2: return cpu::fa2_backward(*p);
      default: return cuda::backward(*p, chosen);
    }
  });
}

fa_status fa_workspace_size(const fa_params* p, fa_impl impl, int backward, size_t* bytes) {
  return guarded([&]() -> Status {
    if (!bytes) return invalid("bytes: null pointer");
    *bytes = 0;
    if (!p) return invalid("params: null pointer");
    FA_RETURN_IF_ERROR(check_impl_value(impl));
    fa_impl chosen = resolve(*p, impl, backward != 0);
    FA_RETURN_IF_ERROR(check_host_indices(*p, chosen));
    FA_RETURN_IF_ERROR(validate(p, backward ? Pass::Backward : Pass::Forward, chosen));
    if (!is_cuda_impl(chosen)) return {};
    return cuda::workspace_size(*p, chosen, backward != 0, bytes);
  });
}

const char* fa_last_error(void) { return g_last_error.c_str(); }

const char* fa_status_name(fa_status s) {
  switch (enum_value(s)) {
    case FA_OK: return "ok";
    case FA_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FA_ERROR_UNSUPPORTED: return "unsupported";
    case FA_ERROR_NO_DEVICE: return "no device";
    case FA_ERROR_CUDA: return "cuda error";
    case FA_ERROR_WORKSPACE: return "workspace";
    case FA_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* fa_impl_name(fa_impl impl) {
  switch (enum_value(impl)) {
    case FA_IMPL_AUTO: return "auto";
    case FA_IMPL_CPU_REFERENCE: return "cpu-reference";
    case FA_IMPL_CPU_FA1: return "cpu-fa1";
    case FA_IMPL_CPU_FA2: return "cpu-fa2";
    case FA_IMPL_CUDA_STANDARD: return "cuda-standard";
    case FA_IMPL_CUDA_SM80: return "flashattn-sm80";
    case FA_IMPL_CUDA_SM90: return "flashattn-sm90";
  }
  return "unknown impl";
}

const char* fa_dtype_name(fa_dtype d) {
  switch (enum_value(d)) {
    case FA_FLOAT32: return "fp32";
    case FA_FLOAT16: return "fp16";
    case FA_BFLOAT16: return "bf16";
  }
  return "unknown dtype";
}

int fa_cuda_available(void) { return cuda::available() ? 1 : 0; }

}  // extern "C"
