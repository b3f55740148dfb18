#include "api/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/dtype.hpp"
#include "common/layout.hpp"

namespace flashattn {

ImplLimits impl_limits(fa_impl impl) {
  switch (impl) {
    case FA_IMPL_CPU_REFERENCE: return {1024, true, true, true, true, true, true, true, true, true, true, true};
    case FA_IMPL_CPU_FA1: return {1024, true, true, true, false, true, true, true, true, false, true, true};
    case FA_IMPL_CPU_FA2: return {1024, true, true, true, true, true, true, true, true, true, true, true};
    case FA_IMPL_CUDA_STANDARD: return {256, true, true, true, false, false, false, false, false, false, false, false};
    case FA_IMPL_CUDA_SM80: return {256, false, true, true, true, false, true, true, true, true, true, true};
    // ALiBi's backward: from head_dim 129, the kernels of 192 and 256 (sm90_bwd_kernel_head_dim, bwd_wide_kernel).
    case FA_IMPL_CUDA_SM90: return {256, false, true, true, true, false, false, false, true, false, true, false, 129};
    default: return {0, false, false, false, false, false, false, false, false, false, false, false};
  }
}

namespace {

// Byte range [begin, end) a strided tensor can touch; empty when it has no element.
struct Extent {
  uintptr_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
  bool overlaps(const Extent& o) const { return !empty() && !o.empty() && begin < o.end && o.begin < end; }
};

Extent extent(const void* data, int64_t batch, int64_t batch_stride, int64_t rows, int64_t row_stride, int64_t heads,
              int64_t head_stride, int64_t head_dim, size_t elem) {
  if (!data || batch <= 0 || rows <= 0 || heads <= 0 || head_dim <= 0) return {};
  int64_t last = (batch - 1) * batch_stride + (rows - 1) * row_stride + (heads - 1) * head_stride + head_dim - 1;
  auto b = reinterpret_cast<uintptr_t>(data);
  return {b, b + uintptr_t(last + 1) * elem};
}

Status check_strides(const char* name, int64_t bs, int64_t rs, int64_t hs) {
  if (bs < 0) return invalid("%s_batch_stride must be >= 0 (got %lld)", name, (long long)bs);
  if (rs < 0) return invalid("%s_row_stride must be >= 0 (got %lld)", name, (long long)rs);
  if (hs < 0) return invalid("%s_head_stride must be >= 0 (got %lld)", name, (long long)hs);
  return {};
}

// An output's elements must be distinct memory locations. Taking the axes of more than one element
// in order of stride, each must step past everything the smaller ones span (sufficient, and true of
// every BSHD / BHSD / padded / packed layout).
Status check_distinct_elements(const char* name, int64_t nb, int64_t bs, int64_t rows, int64_t rs, int64_t heads,
                               int64_t hs, int64_t d) {
  struct Axis {
    int64_t size, stride;
  };
  if (nb <= 0 || rows <= 0 || heads <= 0 || d <= 0) return {};  // no element
  std::vector<Axis> axes;
  for (Axis a : {Axis{nb, bs}, Axis{rows, rs}, Axis{heads, hs}, Axis{d, 1}})
    if (a.size > 1) axes.push_back(a);
  std::sort(axes.begin(), axes.end(), [](const Axis& a, const Axis& b) { return a.stride < b.stride; });
  int64_t span = 0;  // last offset reachable by the axes so far
  for (const Axis& a : axes) {
    if (a.stride <= span)
      return invalid("%s: its strides (batch %lld, row %lld, head %lld) make elements overlap in memory (an output needs one "
                     "location per element)",
                     name, (long long)bs, (long long)rs, (long long)hs);
    span += (a.size - 1) * a.stride;
  }
  return {};
}

Status check_cu_seqlens(const char* name, const int32_t* cu, int32_t batch, int64_t total, int32_t max_len) {
  if (cu[0] != 0) return invalid("%s[0] must be 0 (got %d)", name, cu[0]);
  for (int32_t b = 0; b < batch; ++b) {
    int64_t len = int64_t(cu[b + 1]) - cu[b];
    if (len < 0) return invalid("%s must be non-decreasing (%s[%d] = %d > %s[%d] = %d)", name, name, b, cu[b], name, b + 1, cu[b + 1]);
    if (len > max_len)
      return invalid("%s: sequence %d has length %lld, longer than the max seqlen %d given", name, b, (long long)len, max_len);
  }
  if (cu[batch] != total) return invalid("%s[batch] = %d must equal its total (%lld)", name, cu[batch], (long long)total);
  return {};
}

}  // namespace

Status check_impl_value(const fa_impl& impl) {
  const int64_t v = enum_value(impl);
  if (v < FA_IMPL_AUTO || v > FA_IMPL_CUDA_SM90) return invalid("impl: unknown implementation %lld", (long long)v);
  return {};
}

Status validate(const fa_params* pp, Pass pass, fa_impl impl) {
  if (!pp) return invalid("params: null pointer");
  const fa_params& p = *pp;
  ImplLimits lim = impl_limits(impl);
  if (lim.max_head_dim == 0) return invalid("impl: unknown implementation %d", int(impl));
  if (pass == Pass::Backward && !lim.backward) return unsupported("impl: %s has no backward pass", fa_impl_name(impl));

  if (p.batch < 0) return invalid("batch must be >= 0 (got %d)", p.batch);
  if (p.seqlen_q < 0) return invalid("seqlen_q must be >= 0 (got %d)", p.seqlen_q);
  if (p.seqlen_k < 0) return invalid("seqlen_k must be >= 0 (got %d)", p.seqlen_k);
  if (p.num_heads <= 0) return invalid("num_heads must be > 0 (got %d)", p.num_heads);
  if (p.num_heads_kv <= 0) return invalid("num_heads_kv must be > 0 (got %d)", p.num_heads_kv);
  if (p.num_heads % p.num_heads_kv != 0)
    return invalid("num_heads (%d) must be a multiple of num_heads_kv (%d)", p.num_heads, p.num_heads_kv);
  if (p.head_dim <= 0) return invalid("head_dim must be > 0 (got %d)", p.head_dim);
  if (p.head_dim > lim.max_head_dim)
    return unsupported("head_dim %d exceeds the maximum of %s (%d)", p.head_dim, fa_impl_name(impl), lim.max_head_dim);
  const int64_t dtype = enum_value(p.dtype);
  if (dtype != FA_FLOAT32 && dtype != FA_FLOAT16 && dtype != FA_BFLOAT16)
    return invalid("dtype: unknown value %lld", (long long)dtype);
  bool has_dtype = p.dtype == FA_FLOAT32 ? lim.fp32 : p.dtype == FA_FLOAT16 ? lim.fp16 : lim.bf16;
  if (!has_dtype) return unsupported("dtype %s is not supported by %s", fa_dtype_name(p.dtype), fa_impl_name(impl));
  if (!std::isfinite(p.softmax_scale)) return invalid("softmax_scale must be finite (got %g)", double(p.softmax_scale));
  if (!std::isfinite(p.softcap) || p.softcap < 0) return invalid("softcap must be finite and >= 0 (got %g)", double(p.softcap));
  if (p.window_left < -1) return invalid("window_left must be >= -1 (got %d)", p.window_left);
  if (p.window_right < -1) return invalid("window_right must be >= -1 (got %d)", p.window_right);
  if (p.num_threads < 0) return invalid("num_threads must be >= 0 (got %d)", p.num_threads);
  if (p.cpu_cache_bytes < 0) return invalid("cpu_cache_bytes must be >= 0 (got %lld)", (long long)p.cpu_cache_bytes);
  if (p.num_splits < 0) return invalid("num_splits must be >= 0 (got %d)", p.num_splits);

  const bool varlen = p.cu_seqlens_q || p.cu_seqlens_k;
  if (varlen) {
    if (!p.cu_seqlens_q) return invalid("cu_seqlens_q is null while cu_seqlens_k is set (varlen needs both)");
    if (!p.cu_seqlens_k) return invalid("cu_seqlens_k is null while cu_seqlens_q is set (varlen needs both)");
    if (p.total_q < 0) return invalid("total_q must be >= 0 (got %lld)", (long long)p.total_q);
    if (p.total_k < 0) return invalid("total_k must be >= 0 (got %lld)", (long long)p.total_k);
  }
  if (p.seqused_k) {
    if (varlen) return unsupported("seqused_k with cu_seqlens: a KV cache's used lengths need the padded (batch, seqlen_k) layout");
    if (pass == Pass::Backward) return unsupported("seqused_k: the backward pass does not take it (a KV cache is for the forward)");
    if (!lim.seqused_k) return unsupported("seqused_k is not supported by %s", fa_impl_name(impl));
  }
  const bool paged = p.block_table != nullptr;
  if (!paged && p.page_block_size != 0)
    return invalid("page_block_size is %d but block_table is null (set both for a paged KV cache)", p.page_block_size);
  if (paged) {
    if (varlen) return unsupported("block_table with cu_seqlens: a paged KV cache needs the padded (batch, seqlen_k) layout");
    if (pass == Pass::Backward) return unsupported("block_table: the backward pass does not take a paged KV cache");
    if (!lim.paged_kv) return unsupported("block_table (paged KV cache) is not supported by %s", fa_impl_name(impl));
    if (p.page_block_size <= 0) return invalid("page_block_size must be > 0 with a block_table (got %d)", p.page_block_size);
    if (p.num_pages <= 0) return invalid("num_pages must be > 0 with a block_table (got %d)", p.num_pages);
    const int64_t pages_per_seq = (int64_t(p.seqlen_k) + p.page_block_size - 1) / p.page_block_size;
    if (p.batch > 1 && p.block_table_batch_stride < pages_per_seq)
      return invalid("block_table_batch_stride (%lld) must be >= the pages seqlen_k %d spans (%lld of %d rows)",
                     (long long)p.block_table_batch_stride, p.seqlen_k, (long long)pages_per_seq, p.page_block_size);
  }
  if (p.leftpad_k) {
    if (varlen) return unsupported("leftpad_k with cu_seqlens: a left-padded KV cache needs the padded (batch, seqlen_k) layout");
    if (paged) return unsupported("leftpad_k with block_table: a paged KV cache has no left padding (its table says where keys are)");
    if (pass == Pass::Backward) return unsupported("leftpad_k: the backward pass does not take a KV cache");
    if (!lim.paged_kv) return unsupported("leftpad_k (left-padded KV cache) is not supported by %s", fa_impl_name(impl));
  }
  if (p.alibi_slopes) {
    if (!lim.alibi) return unsupported("alibi_slopes (ALiBi) is not supported by %s", fa_impl_name(impl));
    if (pass == Pass::Backward && !lim.alibi_backward) {
      if (lim.alibi_backward_from == 0)
        return unsupported("alibi_slopes (ALiBi): the backward pass of %s does not take it (its forward does)", fa_impl_name(impl));
      if (p.head_dim < lim.alibi_backward_from)
        return unsupported("alibi_slopes (ALiBi): the backward pass of %s takes it from head_dim %d on (got %d; its "
                           "forward at any)", fa_impl_name(impl), lim.alibi_backward_from, p.head_dim);
    }
    if (p.alibi_slopes_batch_stride < 0)
      return invalid("alibi_slopes_batch_stride must be >= 0 (got %lld)", (long long)p.alibi_slopes_batch_stride);
    if (p.batch > 1 && p.alibi_slopes_batch_stride > 0 && p.alibi_slopes_batch_stride < p.num_heads)
      return invalid("alibi_slopes_batch_stride (%lld) must be 0 (one slope per head) or >= num_heads (%d)",
                     (long long)p.alibi_slopes_batch_stride, p.num_heads);
  } else if (p.alibi_slopes_batch_stride != 0) {
    return invalid("alibi_slopes_batch_stride is %lld but alibi_slopes is null", (long long)p.alibi_slopes_batch_stride);
  }
  if (!(p.dropout_p >= 0.f && p.dropout_p < 1.f))  // NaN fails too
    return invalid("dropout_p must be in [0, 1) (got %g)", double(p.dropout_p));
  if (p.dropout_p > 0.f && !lim.dropout)
    return unsupported("dropout_p (%g): dropout is not supported by %s", double(p.dropout_p), fa_impl_name(impl));
  if (p.dropout_p > 0.f && p.alibi_slopes && !lim.dropout_alibi)
    return unsupported("dropout_p (%g) with alibi_slopes: %s takes one or the other (flashattn-sm80 both)",
                       double(p.dropout_p), fa_impl_name(impl));
  if (p.batch == 0) return {};
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const int64_t nbatch = varlen ? 1 : p.batch;
  const bool any_q = rows_q > 0, any_k = rows_k > 0;

  // Pointers: a tensor with no element may be null.
  if (any_q && !p.q) return invalid("q is a null pointer");
  if (any_k && !p.k) return invalid("k is a null pointer");
  if (any_k && !p.v) return invalid("v is a null pointer");
  if (any_q && !p.o) return invalid("o is a null pointer");
  if (pass == Pass::Backward) {
    if (any_q && !p.lse) return invalid("lse is a null pointer (the backward pass needs the forward's lse)");
    if (any_q && !p.dout) return invalid("dout is a null pointer");
    if (any_q && !p.dq) return invalid("dq is a null pointer");
    if (any_k && !p.dk) return invalid("dk is a null pointer");
    if (any_k && !p.dv) return invalid("dv is a null pointer");
  }
  FA_RETURN_IF_ERROR(check_strides("q", p.q_batch_stride, p.q_row_stride, p.q_head_stride));
  FA_RETURN_IF_ERROR(check_strides("k", p.k_batch_stride, p.k_row_stride, p.k_head_stride));
  FA_RETURN_IF_ERROR(check_strides("v", p.v_batch_stride, p.v_row_stride, p.v_head_stride));
  FA_RETURN_IF_ERROR(check_strides("o", p.o_batch_stride, p.o_row_stride, p.o_head_stride));
  if (pass == Pass::Backward) {
    FA_RETURN_IF_ERROR(check_strides("do", p.do_batch_stride, p.do_row_stride, p.do_head_stride));
    FA_RETURN_IF_ERROR(check_strides("dq", p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride));
    FA_RETURN_IF_ERROR(check_strides("dk", p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride));
    FA_RETURN_IF_ERROR(check_strides("dv", p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride));
  }
  if (varlen && lim.host_memory) {
    FA_RETURN_IF_ERROR(check_cu_seqlens("cu_seqlens_q", p.cu_seqlens_q, p.batch, p.total_q, p.seqlen_q));
    FA_RETURN_IF_ERROR(check_cu_seqlens("cu_seqlens_k", p.cu_seqlens_k, p.batch, p.total_k, p.seqlen_k));
  }
  if (p.seqused_k && lim.host_memory) {
    for (int32_t b = 0; b < p.batch; ++b)
      if (p.seqused_k[b] < 0 || p.seqused_k[b] > p.seqlen_k)
        return invalid("seqused_k[%d] = %d must lie in [0, seqlen_k = %d]", b, p.seqused_k[b], p.seqlen_k);
  }
  if (p.leftpad_k && lim.host_memory) {
    for (int32_t b = 0; b < p.batch; ++b) {
      const int32_t used = p.seqused_k ? p.seqused_k[b] : p.seqlen_k;
      if (p.leftpad_k[b] < 0 || p.leftpad_k[b] > used)
        return invalid("leftpad_k[%d] = %d must lie in [0, %s = %d]", b, p.leftpad_k[b], p.seqused_k ? "seqused_k[b]" : "seqlen_k",
                       used);
    }
  }
  if (p.alibi_slopes && lim.host_memory) {
    for (int32_t b = 0; b < p.batch; ++b)
      for (int32_t h = 0; h < p.num_heads; ++h) {
        const float slope = p.alibi_slopes[b * p.alibi_slopes_batch_stride + h];
        if (!std::isfinite(slope)) return invalid("alibi_slopes[%d][%d] = %g must be finite", b, h, double(slope));
      }
  }
  if (paged && lim.host_memory) {
    // The entries of the used keys' pages; the rest may hold anything (e.g. -1).
    for (int32_t b = 0; b < p.batch; ++b) {
      const int64_t used = p.seqused_k ? p.seqused_k[b] : p.seqlen_k;
      for (int64_t i = 0; i * p.page_block_size < used; ++i) {
        const int32_t page = p.block_table[b * p.block_table_batch_stride + i];
        if (page < 0 || page >= p.num_pages)
          return invalid("block_table[%d][%lld] = %d must lie in [0, num_pages = %d)", b, (long long)i, page, p.num_pages);
      }
    }
  }

  // Outputs must not overlap themselves, inputs or each other.
  if (pass == Pass::Forward) {
    FA_RETURN_IF_ERROR(check_distinct_elements("o", nbatch, p.o_batch_stride, rows_q, p.o_row_stride, p.num_heads, p.o_head_stride, p.head_dim));
  } else {
    FA_RETURN_IF_ERROR(check_distinct_elements("dq", nbatch, p.dq_batch_stride, rows_q, p.dq_row_stride, p.num_heads, p.dq_head_stride, p.head_dim));
    FA_RETURN_IF_ERROR(check_distinct_elements("dk", nbatch, p.dk_batch_stride, rows_k, p.dk_row_stride, p.num_heads_kv, p.dk_head_stride, p.head_dim));
    FA_RETURN_IF_ERROR(check_distinct_elements("dv", nbatch, p.dv_batch_stride, rows_k, p.dv_row_stride, p.num_heads_kv, p.dv_head_stride, p.head_dim));
  }
  const size_t es = dtype_size(p.dtype);
  const int64_t d = p.head_dim, h = p.num_heads, hk = p.num_heads_kv;
  struct Named {
    const char* name;
    Extent e;
  };
  auto ext = [&](const char* name, const void* data, int64_t bs, int64_t rows, int64_t rs, int64_t heads, int64_t hs) {
    return Named{name, extent(data, nbatch, bs, rows, rs, heads, hs, d, es)};
  };
  // k and v: (batch, seqlen_k, ...), or a paged cache's (num_pages, page_block_size, ...).
  auto kv_ext = [&](const char* name, const void* data, int64_t bs, int64_t rs, int64_t hs) {
    if (!paged) return ext(name, data, bs, rows_k, rs, hk, hs);
    return Named{name, extent(data, p.num_pages, bs, p.page_block_size, rs, hk, hs, d, es)};
  };
  Named lse{"lse", {}};
  if (p.lse && any_q) {
    auto b = reinterpret_cast<uintptr_t>(p.lse);
    lse.e = {b, b + uintptr_t(nbatch * h * rows_q) * sizeof(float)};
  }
  std::vector<Named> inputs = {ext("q", p.q, p.q_batch_stride, rows_q, p.q_row_stride, h, p.q_head_stride),
                               kv_ext("k", p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride),
                               kv_ext("v", p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride)};
  std::vector<Named> outputs;
  if (pass == Pass::Forward) {
    outputs = {ext("o", p.o, p.o_batch_stride, rows_q, p.o_row_stride, h, p.o_head_stride), lse};
  } else {
    inputs.push_back(ext("o", p.o, p.o_batch_stride, rows_q, p.o_row_stride, h, p.o_head_stride));
    inputs.push_back(ext("dout", p.dout, p.do_batch_stride, rows_q, p.do_row_stride, h, p.do_head_stride));
    inputs.push_back(lse);
    outputs = {ext("dq", p.dq, p.dq_batch_stride, rows_q, p.dq_row_stride, h, p.dq_head_stride),
               ext("dk", p.dk, p.dk_batch_stride, rows_k, p.dk_row_stride, hk, p.dk_head_stride),
               ext("dv", p.dv, p.dv_batch_stride, rows_k, p.dv_row_stride, hk, p.dv_head_stride)};
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (const Named& in : inputs)
      if (outputs[i].e.overlaps(in.e)) return invalid("%s overlaps %s in memory (outputs must not alias inputs)", outputs[i].name, in.name);
    for (size_t j = i + 1; j < outputs.size(); ++j)
      if (outputs[i].e.overlaps(outputs[j].e)) return invalid("%s overlaps %s in memory", outputs[i].name, outputs[j].name);
  }
  return {};
}

}  // namespace flashattn
