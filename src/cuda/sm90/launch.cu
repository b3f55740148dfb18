// Entry points of the Hopper forward (src/cuda/kernels.hpp): which problems it takes, and the
// dispatch on (head_dim, dtype) to the instantiations fwd_hdim<N>_<dtype>.cu.
#include <cudaTypedefs.h>

#include <tuple>
#include <type_traits>

#include "common/layout.hpp"
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "cuda/sm90/fwd_config.hpp"
#include "cuda/sm90/launch.hpp"

namespace flashattn::cuda {
namespace sm90 {
namespace {

// cuTensorMapEncodeTiled from the driver through the runtime, so libcuda is not linked.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      ptr = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// TMA strides are in bytes, multiples of 16; a stride of an axis of extent 1 is never used.
bool stride_ok(int64_t stride, int64_t extent) { return extent <= 1 || (stride > 0 && stride % 8 == 0); }

}  // namespace

Status make_tensor_map(CUtensorMap* map, const void* base, bool bf16, int head_dim, int64_t rows, int heads, int batch,
                       int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows) {
  auto encode = encode_tiled();
  if (!encode) return {FA_ERROR_CUDA, "flashattn-sm90: cuTensorMapEncodeTiled is not available from the driver"};
  rows = rows > 0 ? rows : 1;
  const int64_t fallback = row_stride * 2;  // any valid stride for an axis of extent 1
  cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  cuuint64_t strides[3] = {cuuint64_t(row_stride * 2), cuuint64_t(heads > 1 ? head_stride * 2 : fallback),
                           cuuint64_t(batch > 1 ? batch_stride * 2 : fallback)};
  cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return {FA_ERROR_CUDA, format("flashattn-sm90: cuTensorMapEncodeTiled failed (%d)", int(r))};
  return {};
}

}  // namespace sm90

bool sm90_forward_fills_gpu(const fa_params& p) {
  DeviceInfo dev;
  if (!device_info(&dev).ok()) return true;
  // Every configuration's tiles have 128 query rows or more (launch_template.cuh).
  const int64_t tiles = int64_t(p.batch) * p.num_heads * ((int64_t(p.seqlen_q) + 127) / 128);
  return tiles >= dev.num_sms;
}

namespace {

// Calls f(std::integral_constant<int, kernel head_dim>{}, std::bool_constant<bf16>{}) for the instantiation
// of p's kernel head dim (sm90::fwd_kernel_head_dim) and dtype; none() where there is none or it is not built
// (FLASHATTN_CUDA_HEAD_DIMS).
template <class F, class None>
auto with_instance(const fa_params& p, F&& f, None&& none) {
  const bool bf16 = p.dtype == FA_BFLOAT16;
  auto call = [&](auto d) { return bf16 ? f(d, std::true_type{}) : f(d, std::false_type{}); };
  switch (sm90::fwd_kernel_head_dim(p.head_dim)) {
#if FLASHATTN_HDIM_64
    case 64: return call(std::integral_constant<int, 64>{});
#endif
#if FLASHATTN_HDIM_128
    case 128: return call(std::integral_constant<int, 128>{});
#endif
#if FLASHATTN_HDIM_192
    case 192: return call(std::integral_constant<int, 192>{});
#endif
#if FLASHATTN_HDIM_256
    case 256: return call(std::integral_constant<int, 256>{});
#endif
    default: return none();
  }
}

}  // namespace

bool sm90_supports(const fa_params& p) {
  if (p.dtype != FA_FLOAT16 && p.dtype != FA_BFLOAT16) return false;
  if (p.seqused_k || p.block_table || p.leftpad_k) return false;  // a KV cache (used lengths, pages): the sm80 forward's path
  if (p.dropout_p > 0.f && p.alibi_slopes) return false;            // dropout with ALiBi: the sm80 forward's
  if (!with_instance(p, [](auto, auto) { return true; }, [] { return false; })) return false;
  // The softmax takes the row max of the raw scores and scales it after: right for scale > 0
  // (and with softcap, which is applied first). A negative scale goes to sm80.
  if (p.softmax_scale < 0.f && p.softcap <= 0.f) return false;
  // TMA: 16-byte aligned bases and strides. The epilogue's stores need the same of o.
  if (!sm90::aligned16(p.q) || !sm90::aligned16(p.k) || !sm90::aligned16(p.v) || !sm90::aligned16(p.o)) return false;
  const bool varlen = is_varlen(p);
  const int64_t batch = varlen ? 1 : p.batch;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  using sm90::stride_ok;
  if (!stride_ok(p.q_row_stride, 2) || !stride_ok(p.q_head_stride, p.num_heads) || !stride_ok(p.q_batch_stride, batch))
    return false;
  if (!stride_ok(p.o_row_stride, 2) || !stride_ok(p.o_head_stride, p.num_heads) || !stride_ok(p.o_batch_stride, batch))
    return false;
  for (auto [row, head, bat] : {std::tuple{p.k_row_stride, p.k_head_stride, p.k_batch_stride},
                                std::tuple{p.v_row_stride, p.v_head_stride, p.v_batch_stride}})
    if (!stride_ok(row, 2) || !stride_ok(head, p.num_heads_kv) || !stride_ok(bat, batch)) return false;
  // TMA coordinates are int32.
  if (rows_q >= (int64_t(1) << 31) || rows_k >= (int64_t(1) << 31)) return false;
  return true;
}

size_t sm90_forward_workspace(const fa_params& p) {
  DeviceInfo dev;
  if (!sm90_supports(p) || !device_info(&dev).ok()) return 0;
  return with_instance(
      p, [&](auto d, auto bf16) { return sm90::fwd_workspace<decltype(d)::value, decltype(bf16)::value>(p, dev.num_sms); },
      [] { return size_t(0); });
}

Status sm90_forward(const fa_params& p) {
  if (!sm90_supports(p))
    return unsupported("impl flashattn-sm90 does not take this problem (dtype %s, head_dim %d; it needs fp16 or "
                       "bf16, head_dim a multiple of 8 up to 256, 16-byte aligned pointers and strides, softmax_scale >= 0 unless "
                       "softcap, fewer than 2^31 rows, not both dropout and ALiBi)",
                       fa_dtype_name(p.dtype), p.head_dim);
  return with_instance(
      p, [&](auto d, auto bf16) { return sm90::run_fwd<decltype(d)::value, decltype(bf16)::value>(p); },
      [&] { return unsupported("flashattn-sm90: head_dim %d", p.head_dim); });
}

}  // namespace flashattn::cuda
