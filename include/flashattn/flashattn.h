/* flashattn — exact attention, forward and backward, on the CPU and on NVIDIA GPUs.
 *
 * The C ABI. One params struct (fa_params) describes a problem; every backend reads it.
 * Tensors are passed by pointer and element strides; the head_dim axis must be contiguous.
 *
 *   q, o, dq, dout : (batch, seqlen_q, num_heads,    head_dim)
 *   k, v, dk, dv   : (batch, seqlen_k, num_heads_kv, head_dim)
 *   lse            : (batch, num_heads, seqlen_q) fp32, contiguous
 *
 * Variable length: when cu_seqlens_q / cu_seqlens_k (int32, batch + 1 entries, non-decreasing,
 * starting at 0) are set, q/k/v/o are packed (total_tokens, heads, head_dim), the batch strides
 * are ignored, seqlen_q / seqlen_k hold the longest sequence, total_q / total_k the token counts,
 * and lse is (num_heads, total_q).
 *
 * Masking (row i of a sequence with lengths s_q, s_k; key j visible when all hold):
 *   causal:  j <= i + s_k - s_q                       (bottom-right aligned, as FlashAttention >= 2.1)
 *   window:  i + s_k - s_q - window_left <= j <= i + s_k - s_q + window_right   (-1 = unbounded)
 * A row with no visible key gets output 0 and lse -inf.
 *
 * Scores: s = softmax_scale * q.k, then with softcap > 0: s = softcap * tanh(s / softcap).
 */
#ifndef FLASHATTN_FLASHATTN_H
#define FLASHATTN_FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FA_API __declspec(dllexport)
#else
#define FA_API __attribute__((visibility("default")))
#endif

typedef enum fa_status {
  FA_OK = 0,
  FA_ERROR_INVALID_ARGUMENT = 1, /* an argument is wrong; the message names it */
  FA_ERROR_UNSUPPORTED = 2,      /* valid, but the chosen implementation lacks it (dtype, head_dim, ...) */
  FA_ERROR_NO_DEVICE = 3,        /* the implementation needs a device this machine lacks */
  FA_ERROR_CUDA = 4,             /* the CUDA runtime reported an error */
  FA_ERROR_WORKSPACE = 5,        /* workspace missing or too small */
  FA_ERROR_INTERNAL = 6
} fa_status;

typedef enum fa_dtype { FA_FLOAT32 = 0, FA_FLOAT16 = 1, FA_BFLOAT16 = 2 } fa_dtype;

/* Which implementation runs the call. FA_IMPL_AUTO picks the fastest one for the pointers'
 * device (CUDA when built with CUDA and the pointers are device pointers, else the CPU FA2). */
typedef enum fa_impl {
  FA_IMPL_AUTO = 0,
  FA_IMPL_CPU_REFERENCE = 1, /* standard attention, materializes S and P, accumulates in double */
  FA_IMPL_CPU_FA1 = 2,       /* FlashAttention-1 loop order (forward only) */
  FA_IMPL_CPU_FA2 = 3,       /* FlashAttention-2, multithreaded */
  FA_IMPL_CUDA_STANDARD = 4, /* materializing attention on the GPU (cuBLAS + softmax kernel) */
  FA_IMPL_CUDA_SM80 = 5,     /* FA2 on tensor cores, mma.sync (sm_80 and later) */
  FA_IMPL_CUDA_SM90 = 6      /* Hopper: TMA + wgmma + warp specialization */
} fa_impl;

typedef struct fa_params {
  /* Forward tensors. */
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse; /* optional in the forward pass (NULL: not written), required by the backward */
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;

  /* Backward tensors: dout is the incoming gradient of o; dq, dk, dv are written. */
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

  /* Sizes. */
  int32_t batch;
  int32_t seqlen_q; /* varlen: the longest query sequence */
  int32_t seqlen_k; /* varlen: the longest key sequence */
  int32_t num_heads;
  int32_t num_heads_kv; /* num_heads % num_heads_kv == 0 (MQA: 1, GQA: a divisor) */
  int32_t head_dim;

  /* Variable length (both NULL, or both set). Memory of the backend's device. */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t total_q; /* varlen: rows of the packed q / o (= cu_seqlens_q[batch]) */
  int64_t total_k; /* varlen: rows of the packed k / v (= cu_seqlens_k[batch]) */

  fa_dtype dtype;
  float softmax_scale; /* 0: 1 / sqrt(head_dim) */
  int32_t causal;      /* bottom-right aligned */
  int32_t window_left, window_right; /* -1: unbounded */
  float softcap;                     /* 0: off */
  int32_t deterministic;             /* backward: bit-identical gradients run to run */

  /* Execution. */
  void* stream;           /* CUDA: cudaStream_t (NULL: the default stream) */
  void* workspace;        /* CUDA: device memory of at least fa_workspace_size() bytes */
  size_t workspace_bytes;
  int32_t num_threads;     /* CPU: 0 = every core */
  int64_t cpu_cache_bytes; /* CPU: the on-chip budget M that sets the block sizes; 0 = L2 size */
  int32_t num_splits;      /* CUDA forward split-KV: 0 = heuristic, 1 = off */

  /* KV cache (forward only, not with varlen): sequence b uses keys [0, seqused_k[b]) of its seqlen_k
   * allocated rows, and causal / window masks align to that length. NULL: all seqlen_k keys.
   * Memory of the backend's device. Appended last, so the fields above keep their offsets. */
  const int32_t* seqused_k;

  /* Paged KV cache (forward only, not with varlen): k and v are pools of num_pages pages of
   * page_block_size rows, (num_pages, page_block_size, num_heads_kv, head_dim), the batch strides
   * stepping from page to page. Key j of sequence b is row j % page_block_size of page
   * block_table[b * block_table_batch_stride + j / page_block_size]; seqlen_k is the keys a table row
   * can address, seqused_k (when set) the keys used. Entries past the used keys are never read.
   * NULL: k and v are (batch, seqlen_k, ...). Memory of the backend's device; on a GPU the entries
   * are not checked (that would need a copy and a sync): one outside [0, num_pages) reads page 0 or
   * num_pages - 1, never memory outside the pools. */
  const int32_t* block_table;
  int64_t block_table_batch_stride;
  int32_t page_block_size;
  int32_t num_pages;

  /* Left-padded KV cache (forward only, not with varlen or block_table): sequence b's keys are rows
   * [leftpad_k[b], seqused_k[b] (or seqlen_k)) of its cache, and causal / window masks align to their
   * count. NULL: they start at row 0. Memory of the backend's device (on a GPU not checked: clamped). */
  const int32_t* leftpad_k;

  /* ALiBi (Press et al., "Train short, test long"), as flash_attn's alibi_slopes: the score of query
   * row i and key j gets -slope * |i + seqlen_k - seqlen_q - j| added after the scale and softcap
   * (the distance to the bottom-right-aligned diagonal, with the sequence's own lengths), slope =
   * alibi_slopes[b * alibi_slopes_batch_stride + h] for sequence b and query head h (batch stride 0:
   * one slope per head for every sequence). NULL: off. fp32, memory of the backend's device. */
  const float* alibi_slopes;
  int64_t alibi_slopes_batch_stride;

  /* Dropout on the attention probabilities (as flash_attn's dropout_p): each element of P is dropped
   * with probability dropout_p (to 1/65536) and the kept ones scaled by 1 / (1 - dropout_p), in the
   * forward and, the same elements, the backward; lse is that of the scores before dropout. The mask
   * is a function of (dropout_seed, dropout_offset, sequence, head, row, key) alone
   * (src/common/dropout.hpp): pass the same seed and offset to the backward, and a new offset (or
   * seed) for the next call. Taken by the CPU backends, flashattn-sm80 (not with a paged or
   * left-padded KV cache) and flashattn-sm90 (not with ALiBi: FA_IMPL_AUTO then picks sm80); the
   * others answer FA_ERROR_UNSUPPORTED. 0: off. */
  float dropout_p;
  uint64_t dropout_seed;
  uint64_t dropout_offset;
} fa_params;

/* Zeroes *p and sets the defaults (window -1/-1, dtype fp16, scale 0 = 1/sqrt(d)). */
FA_API void fa_params_init(fa_params* p);

/* Sets every stride of a contiguous (batch, seqlen, heads, head_dim) layout from the sizes. */
FA_API void fa_params_set_contiguous_strides(fa_params* p);

/* o = softmax(scale * q k^T [masked]) v, and lse = log(sum(exp(s))) per row when p->lse. */
FA_API fa_status fa_forward(const fa_params* p, fa_impl impl);

/* dq, dk, dv from dout, o, lse (the forward's outputs) by recomputation. */
FA_API fa_status fa_backward(const fa_params* p, fa_impl impl);

/* Bytes of device workspace the call needs (0 on the CPU). The pass is 0 forward, 1 backward. */
FA_API fa_status fa_workspace_size(const fa_params* p, fa_impl impl, int backward, size_t* bytes);

/* The message of the last error on this thread ("" after success). */
FA_API const char* fa_last_error(void);

FA_API const char* fa_status_name(fa_status s);
FA_API const char* fa_impl_name(fa_impl impl);
FA_API const char* fa_dtype_name(fa_dtype d);

/* 1 when the library was built with CUDA and a GPU is present. */
FA_API int fa_cuda_available(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_FLASHATTN_H */
