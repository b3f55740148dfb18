// Entry points of the sm80 forward: checks, the split-KV heuristic and workspace, and the dispatch
// from (dtype, head_dim) to the generated instantiations through the config table.
//
// Alignment: with every pointer 16-byte aligned and every stride and head_dim a multiple of 8
// elements, tiles load with 16-byte cp.async; otherwise the same kernel loads element by element
// (correct for any stride the API allows, slower).
#include <algorithm>
#include <cstdint>

#include "common/layout.hpp"
#include "cuda/kernels.hpp"
#include "cuda/sm80/fwd_instances.cuh"
#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {
namespace {

using sm80::FwdConfig;
using sm80::FwdParams;

using sm80::kMaxSplits;

int sm_count() {
  DeviceInfo dev;
  return device_info(&dev).ok() ? dev.num_sms : 1;
}

int64_t num_rows(const fa_params& p) { return is_varlen(p) ? p.total_q : int64_t(p.batch) * p.seqlen_q; }

// Split-KV when the (q-block, head, batch) grid leaves SMs idle and the keys are long (about 8 CTAs
// per SM then), or when each sequence is a single q-block over many key blocks (decode-like: every
// CTA is one long serial, latency-bound loop; at most 2 CTAs per SM: one wave of the decode config,
// since a few CTAs past it run alone as a second wave). At least 2 key blocks per split. Decode on
// the H100 (16 heads, head_dim 128) read K and V fastest at 8-16 splits at batch 1, 4 at batch 4,
// 1 at batch 16 (dev/sm80fwd/decode_splits.py); 8 CTAs per SM there split 2-4 times too often and
// read 10-30% slower, and 17 splits at batch 1 (272 CTAs) 20% slower than 16. On an H200 with the
// 16-row decode tiles (3 fit an SM), a target of 3 CTAs per SM read 0.96-1.0 of 2 at 16 heads and 0.78 with 32 query heads over one kv head (session 61).
int num_splits(const fa_params& p, const FwdConfig& c) {
  const int n_blocks = (p.seqlen_k + c.block_n - 1) / c.block_n;
  const int max_splits = std::min({kMaxSplits, std::max(n_blocks, 1), 65535 / std::max(p.batch, 1)});
  if (p.num_splits >= 1) return std::clamp(p.num_splits, 1, max_splits);
  const int m_blocks = (p.seqlen_q + c.block_m - 1) / c.block_m;
  const int64_t ctas = int64_t(p.batch) * p.num_heads * m_blocks;
  const int64_t sms = sm_count();
  const bool fills = ctas >= int64_t(0.8 * double(sms));
  const bool decode_like = m_blocks == 1 && n_blocks >= 16 && ctas < 2 * sms;
  const int64_t target = (decode_like ? 2 : 8) * sms;
  if (ctas == 0 || (fills && !decode_like)) return 1;
  const int want = int(decode_like ? target / ctas : (target + ctas - 1) / ctas);
  const int splits = std::min({want, n_blocks / 2, max_splits});
  return splits >= 2 ? splits : 1;
}

size_t partial_bytes(const fa_params& p, int splits) {
  if (splits <= 1) return 0;
  return size_t(splits) * size_t(num_rows(p)) * size_t(p.num_heads) * size_t(p.head_dim + 1) * sizeof(float);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

bool tiles_aligned(const fa_params& p) {
  const bool varlen = is_varlen(p);
  auto strides_ok = [&](int64_t batch, int64_t row, int64_t head) {
    return (varlen || batch % 8 == 0) && row % 8 == 0 && head % 8 == 0;
  };
  return p.head_dim % 8 == 0 && aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.o) &&
         strides_ok(p.q_batch_stride, p.q_row_stride, p.q_head_stride) &&
         strides_ok(p.k_batch_stride, p.k_row_stride, p.k_head_stride) &&
         strides_ok(p.v_batch_stride, p.v_row_stride, p.v_head_stride) &&
         strides_ok(p.o_batch_stride, p.o_row_stride, p.o_head_stride);
}

FwdParams make_params(const fa_params& p, int splits) {
  FwdParams f{};
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.o = p.o;
  f.lse = p.lse;
  f.q_batch_stride = p.q_batch_stride, f.q_row_stride = p.q_row_stride, f.q_head_stride = p.q_head_stride;
  f.k_batch_stride = p.k_batch_stride, f.k_row_stride = p.k_row_stride, f.k_head_stride = p.k_head_stride;
  f.v_batch_stride = p.v_batch_stride, f.v_row_stride = p.v_row_stride, f.v_head_stride = p.v_head_stride;
  f.o_batch_stride = p.o_batch_stride, f.o_row_stride = p.o_row_stride, f.o_head_stride = p.o_head_stride;
  f.cu_seqlens_q = p.cu_seqlens_q;
  f.cu_seqlens_k = p.cu_seqlens_k;
  f.seqused_k = p.seqused_k;
  f.block_table = p.block_table;
  f.block_table_batch_stride = p.block_table_batch_stride;
  f.page_rows = FastDivmod(p.page_block_size);
  f.num_pages = p.num_pages;
  f.leftpad_k = p.leftpad_k;
  f.alibi_slopes = p.alibi_slopes;
  f.alibi_slopes_batch_stride = p.alibi_slopes_batch_stride;
  f.dropout = DropoutMask::of(p);
  f.batch = p.batch, f.seqlen_q = p.seqlen_q, f.seqlen_k = p.seqlen_k;
  f.num_heads = p.num_heads, f.num_heads_kv = p.num_heads_kv, f.head_dim = p.head_dim;
  f.group = p.num_heads / p.num_heads_kv;
  f.total_q = p.total_q;
  f.window_left = p.window_left;
  f.window_right = p.causal ? 0 : p.window_right;
  const float scale = effective_scale(p);
  f.has_softcap = p.softcap > 0.f;
  f.softcap_scale = f.has_softcap ? scale / p.softcap : 1.f;
  f.score_scale_log2 = sm80::kLog2e * (f.has_softcap ? p.softcap : scale);
  f.aligned = tiles_aligned(p);
  f.num_splits = splits;
  f.num_rows = num_rows(p);
  if (splits > 1) {
    f.o_partial = static_cast<float*>(p.workspace);
    f.lse_partial = f.o_partial + size_t(splits) * size_t(f.num_rows) * size_t(p.num_heads) * size_t(p.head_dim);
  }
  return f;
}

// Decode with GQA (one query row, num_heads / num_heads_kv > 1): the q heads of a kv head become the
// rows of one q-block, so each k/v block is read once per kv head instead of once per q head
// (the same tensors seen with other strides: row i of kv head hk is q head hk * group + i).
// A single query row is masked only by window_left, which this view would shift, so it is excluded;
// so are ALiBi, whose slope is the q head's and whose distance is the query row's, and dropout, whose
// mask is drawn per (head, row).
fa_params gqa_decode_view(const fa_params& p) {
  const int group = p.num_heads / p.num_heads_kv;
  if (p.seqlen_q != 1 || group == 1 || is_varlen(p) || p.window_left >= 0 || p.alibi_slopes || p.dropout_p > 0.f)
    return p;
  fa_params v = p;
  v.seqlen_q = group;
  v.num_heads = p.num_heads_kv;
  v.causal = 0;  // with one query row every key is at or before the diagonal
  v.window_right = -1;
  v.q_row_stride = p.q_head_stride, v.q_head_stride = int64_t(group) * p.q_head_stride;
  v.o_row_stride = p.o_head_stride, v.o_head_stride = int64_t(group) * p.o_head_stride;
  return v;  // lse (batch, heads, 1) is (batch, heads_kv, group) with the same indices
}

// The config whose q-blocks the split count is chosen for: the table's (the decode and few-rows
// tiles hold one q-block as it does), or the general instance's decode tiles at any number of rows (a
// paged or left-padded cache, ALiBi over few rows).
FwdConfig split_config(const fa_params& p, int kernel_head_dim) {
  const bool general = sm80::fwd_variant(p.block_table || p.leftpad_k, p.alibi_slopes != nullptr, p.dropout_p > 0.f,
                                         p.seqlen_q, kernel_head_dim) == sm80::FwdVariant::kGeneral;
  return general ? sm80::fwd_decode_config(kernel_head_dim) : sm80::fwd_config(kernel_head_dim);
}

// The kernel head dim of p (after gqa_decode_view) when its sm80 forward kernel was built, else 0.
int built_head_dim(const fa_params& p) {
  const int kernel_head_dim = sm80::fwd_kernel_head_dim(p.head_dim);
  if (kernel_head_dim == 0 || p.batch == 0 || p.batch > 65535) return 0;
  const bool built = p.dtype == FA_FLOAT16 ? sm80::fwd_launcher<__half>(kernel_head_dim) != nullptr
                                           : sm80::fwd_launcher<__nv_bfloat16>(kernel_head_dim) != nullptr;
  return built ? kernel_head_dim : 0;
}

}  // namespace

int sm80_forward_splits(const fa_params& params) {
  const fa_params p = gqa_decode_view(params);
  const int kernel_head_dim = built_head_dim(p);
  return kernel_head_dim == 0 ? 1 : num_splits(p, split_config(p, kernel_head_dim));
}

bool sm80_forward_decode(const fa_params& params) {
  const fa_params p = gqa_decode_view(params);
  const int kernel_head_dim = built_head_dim(p);
  if (kernel_head_dim == 0) return false;
  const FwdConfig table = sm80::fwd_config(kernel_head_dim), few_rows = sm80::fwd_few_rows_config(kernel_head_dim);
  return few_rows.block_m < table.block_m && p.seqlen_q <= few_rows.block_m &&
         (p.seqlen_k + table.block_n - 1) / table.block_n >= 16;
}

size_t sm80_forward_workspace(const fa_params& params) {
  const fa_params p = gqa_decode_view(params);
  const int kernel_head_dim = sm80::fwd_kernel_head_dim(p.head_dim);
  if (kernel_head_dim == 0 || p.batch == 0) return 0;
  return partial_bytes(p, num_splits(p, split_config(p, kernel_head_dim)));
}

Status sm80_forward(const fa_params& params) {
  const fa_params p = gqa_decode_view(params);
  if (p.dtype != FA_FLOAT16 && p.dtype != FA_BFLOAT16)
    return unsupported("dtype %s: flashattn-sm80 computes in fp16 or bf16", fa_dtype_name(p.dtype));
  const int kernel_head_dim = sm80::fwd_kernel_head_dim(p.head_dim);
  if (kernel_head_dim == 0) return unsupported("head_dim %d: flashattn-sm80 supports up to 256", p.head_dim);
  auto launch = p.dtype == FA_FLOAT16 ? sm80::fwd_launcher<__half>(kernel_head_dim)
                                      : sm80::fwd_launcher<__nv_bfloat16>(kernel_head_dim);
  if (!launch)
    return unsupported("head_dim %d: the flashattn-sm80 kernel for head_dim %d was not built (FLASHATTN_CUDA_HEAD_DIMS)",
                       p.head_dim, kernel_head_dim);
  if (effective_scale(p) < 0.f)
    return unsupported("softmax_scale %g: flashattn-sm80 needs a scale >= 0 (its running max assumes it)", double(p.softmax_scale));
  if (p.num_heads > 65535) return unsupported("num_heads %d: flashattn-sm80 launches at most 65535", p.num_heads);
  if (p.batch > 65535) return unsupported("batch %d: flashattn-sm80 launches at most 65535", p.batch);
  if (p.dropout_p > 0.f && (p.block_table || p.leftpad_k))
    return unsupported("dropout_p (%g) with a paged or left-padded KV cache (block_table, leftpad_k): flashattn-sm80 "
                       "drops out in training, without a cache",
                       double(p.dropout_p));
  if (p.batch == 0 || p.seqlen_q == 0 || num_rows(p) == 0) return {};

  const int splits = num_splits(p, split_config(p, kernel_head_dim));
  FA_RETURN_IF_ERROR(require_workspace(p, partial_bytes(p, splits), "flashattn-sm80 split-KV forward"));
  const FwdParams f = make_params(p, splits);
  FA_RETURN_IF_ERROR(launch(f, stream_of(p)));
  if (splits > 1) {
    return p.dtype == FA_FLOAT16 ? sm80::run_fwd_combine<__half>(f, stream_of(p))
                                 : sm80::run_fwd_combine<__nv_bfloat16>(f, stream_of(p));
  }
  return {};
}

}  // namespace flashattn::cuda
