// Tile configuration of the sm80 forward: one constexpr table from head_dim to
// (block_m, block_n, warps, stages), the derived constants, and the host-side problem description
// the kernels read (FwdParams).
#pragma once

#include <cstdint>

#include "common/dropout.hpp"
#include "common/fast_divmod.hpp"

namespace flashattn::sm80 {

struct FwdConfig {
  int head_dim;  // the kernel's head_dim; problems with a smaller head_dim are zero-padded to it
  int block_m;   // query rows per CTA
  int block_n;   // keys per main-loop iteration
  int warps;     // each warp owns block_m / warps query rows (16 per m-tile of the mma)
  int stages;    // 2: K and V of block j+1 load during block j; 1: V_j loads during S_j, K_{j+1} during P_j V_j
};

// The kernel's instances beside the plain one, on the table's tiles: kAlibi, ALiBi (prefill); kDropout,
// dropout with or without ALiBi (any number of rows); on the decode tiles: kGeneral, a paged or left-padded
// KV cache, with or without ALiBi, and ALiBi over up to 16 query rows (fwd_variant picks). Dropout in the
// ALiBi instance cost ALiBi alone 8% (ptxas: 56 bytes spilled at head_dim 128, not 16; H200, session 65).
enum class FwdVariant { kPlain, kAlibi, kDropout, kGeneral };

// Split-KV: at most this many splits of a row's keys (the combine's lanes hold 4 splits' weights each).
constexpr int kMaxSplits = 128;

// Shared memory: the q tile plus `stages` k and v tiles, 16-bit elements.
constexpr int fwd_smem_bytes(const FwdConfig& c) {
  return 2 * c.head_dim * (c.block_m + 2 * c.stages * c.block_n);
}

// Registers per thread for the accumulators alone: o (rows x head_dim) and s (rows x block_n) in fp32.
constexpr int fwd_accumulator_regs(const FwdConfig& c) {
  return (c.block_m * c.head_dim + c.block_m * c.block_n) / (32 * c.warps);
}

// A100 allows 163 KB of dynamic shared memory per CTA, H100 227 KB; every entry fits the A100.
constexpr int kMaxSmemSm80 = 163 * 1024;

// clang-format off
constexpr FwdConfig kFwdConfigs[] = {
    // 32 rows per warp: each k/v fragment read from shared memory feeds 2 m-tiles.
    {32,  128, 64, 4, 2},  // 24 KB, 96 accumulators: 179 registers, 2 CTAs per SM
    {64,  128, 128, 4, 2}, // 80 KB, 192 accumulators: H100 16k 330 TFLOP/s vs 320 (block_n 96), 300 (64)
    {96,  128, 64, 4, 2},  // 72 KB, 160 accumulators: the d128 shape with 3/4 of the k-steps
    {128, 128, 64, 4, 2},  // 96 KB, 192 accumulators, 2 CTAs/SM: H100 16k 366 vs 353 (block_n 48), 336 (32), 277 (128x128, 8 warps)
    // 16 rows per warp: o alone is head_dim / 2 registers.
    {192, 128, 64, 8, 1},  // 96 KB, 8 warps of 255 registers: 1 CTA per SM, so 1 stage is enough smem
    {256, 128, 64, 8, 1},  // 128 KB, 8 warps: o is 128 registers; a second k/v stage would not fit the A100
};
// clang-format on
// Each entry fits the A100's shared memory and leaves >= 60 of 255 registers beyond its accumulators.
#define FA_CHECK_FWD_CONFIG(i) \
  static_assert(fwd_smem_bytes(kFwdConfigs[i]) <= kMaxSmemSm80 && fwd_accumulator_regs(kFwdConfigs[i]) <= 192, "config " #i)
FA_CHECK_FWD_CONFIG(0);
FA_CHECK_FWD_CONFIG(1);
FA_CHECK_FWD_CONFIG(2);
FA_CHECK_FWD_CONFIG(3);
FA_CHECK_FWD_CONFIG(4);
FA_CHECK_FWD_CONFIG(5);
#undef FA_CHECK_FWD_CONFIG

constexpr int kFwdHeadDims = sizeof(kFwdConfigs) / sizeof(kFwdConfigs[0]);

// The smallest kernel head_dim >= head_dim (0 when head_dim > 256).
constexpr int fwd_kernel_head_dim(int head_dim) {
  for (const FwdConfig& c : kFwdConfigs)
    if (head_dim <= c.head_dim) return c.head_dim;
  return 0;
}

constexpr FwdConfig fwd_config(int kernel_head_dim) {
  for (const FwdConfig& c : kFwdConfigs)
    if (c.head_dim == kernel_head_dim) return c;
  return {0, 0, 0, 0, 0};
}

// Dev switches: warps of the decode configs (fwd_decode_config, fwd_few_rows_config; 0: none), and
// whether the 16-row one is built (1) or only the 64-row one (0).
#ifndef FLASHATTN_SM80_DECODE_WARPS
#define FLASHATTN_SM80_DECODE_WARPS 4
#endif
#ifndef FLASHATTN_SM80_DECODE_SPLIT_KEYS
#define FLASHATTN_SM80_DECODE_SPLIT_KEYS 1
#endif

// Few query rows over many keys (decode; gqa_decode_view has put a kv head's group of query heads in
// the rows): a 128-row tile computes 127 dropped rows for each one of a single-row decode step, and
// that mma work, not reading K and V, bounded the split-KV forward. So rows that fit 64 run 64-row
// tiles of 16 rows a warp with the table's block_n and stages. Head dims up to 128: past that the
// table's tiles already have 16 rows a warp; there this config is the table's.
constexpr FwdConfig fwd_few_rows_config(int kernel_head_dim) {
  const FwdConfig c = fwd_config(kernel_head_dim);
  constexpr int kWarps = FLASHATTN_SM80_DECODE_WARPS;
  if (kWarps <= 0 || c.head_dim > 128) return c;
  return {c.head_dim, 16 * kWarps, c.block_n, kWarps, c.stages};
}

// Rows that fit 16 run 16-row tiles whose warps split each key block (FwdTraits::kWarpsSplitKeys):
// in the 64-row tiles every warp reads every k and v element from shared memory (L1 69.7% busy
// against cuDNN's 20.7% at batch 16, 16k keys: ncu, H200). Split: +3-14% over them at 16 heads,
// head_dim 128, batch 1-16, 4k-64k keys (H200). Deeper rings of k/v stages (3-6, block_n 32-64) read
// 0.83-0.99 of the 2 stages in the 64-row tiles; with the split keys 3 stages read 0.97-1.01 and
// block_n 128 0.88-1.0 (session 61).
constexpr FwdConfig fwd_decode_config(int kernel_head_dim) {
  const FwdConfig c = fwd_few_rows_config(kernel_head_dim);
  if (!FLASHATTN_SM80_DECODE_SPLIT_KEYS || FLASHATTN_SM80_DECODE_WARPS <= 0 || c.head_dim > 128) return c;
  return {c.head_dim, 16, c.block_n, c.warps, c.stages};
}

// The instance a problem runs (cache: block_table or leftpad_k; alibi: alibi_slopes; dropout: dropout_p
// > 0, never with a cache: sm80_forward refuses it); kGeneral runs the decode config, the others the
// table's (dropout's tiles are 16 x 16 of a sequence's rows and keys, which the table's tiles hold whole).
constexpr FwdVariant fwd_variant(bool cache, bool alibi, bool dropout, int seqlen_q, int kernel_head_dim) {
  if (cache) return FwdVariant::kGeneral;
  if (dropout) return FwdVariant::kDropout;
  if (alibi && seqlen_q <= fwd_decode_config(kernel_head_dim).block_m) return FwdVariant::kGeneral;
  return alibi ? FwdVariant::kAlibi : FwdVariant::kPlain;
}

// Compile-time traits of one config (a table entry, or a candidate in dev/sm80fwd).
template <FwdConfig kConfig>
struct FwdTraits {
  static constexpr int kHeadDim = kConfig.head_dim;
  static constexpr int kBlockM = kConfig.block_m, kBlockN = kConfig.block_n, kWarps = kConfig.warps;
  static constexpr int kStages = kConfig.stages;
  static constexpr int kThreads = 32 * kWarps;
  // Split-Q (FA2): warp w owns rows [block_m / warps * w, ..) and every key of a block. A 16-row
  // tile with several warps splits the keys instead (flash-decoding inside the CTA): warp w owns
  // keys [block_n / warps * w, ..) of every block and all 16 rows, with its own running max, sum
  // and o, merged at the end. So each k/v element read from shared memory feeds one warp, not all.
  static constexpr bool kWarpsSplitKeys = kBlockM == 16 && kWarps > 1;
  static constexpr int kMTiles = kWarpsSplitKeys ? 1 : kBlockM / (16 * kWarps);  // m16 tiles per warp
  static constexpr int kWarpKeys = kWarpsSplitKeys ? kBlockN / kWarps : kBlockN;  // keys of a block per warp
  static constexpr int kNTiles = kWarpKeys / 8;                                  // n8 tiles of s per m-tile
  static constexpr int kDTiles = kHeadDim / 8;                                   // n8 tiles of o per m-tile
  static constexpr int kSmemBytes = fwd_smem_bytes(kConfig);
  static_assert(kWarpsSplitKeys || (kBlockM % (16 * kWarps) == 0 && kMTiles >= 1), "each warp owns whole m16 tiles");
  static_assert(kWarpKeys % 16 == 0 && kHeadDim % 16 == 0, "k-steps of 16");
  // The merge passes warps 1.. 's max, sum (2 rows each) and o fragments through the k/v stages.
  static constexpr int kMergeFloats = 4 + 4 * kDTiles;  // per lane
  static_assert(!kWarpsSplitKeys || (kWarps - 1) * 32 * kMergeFloats * 4 <= 2 * kStages * kBlockN * kHeadDim * 2,
                "the merge fits the k/v stages");
  static_assert(kStages == 1 || kStages == 2, "the main loop knows one or two k/v stages");
};

// What a forward kernel reads: the params struct resolved (scale, mask band, kv-head ratio) and,
// for split-KV, where the partials go. Strides are in elements.
struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // nullptr: not written
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  const int32_t* cu_seqlens_q;  // varlen when set
  const int32_t* cu_seqlens_k;
  const int32_t* seqused_k;  // a KV cache's used keys per sequence (nullptr: seqlen_k)
  // A paged KV cache (nullptr: none): k and v are (num_pages, page_block_size, heads_kv, head_dim)
  // pools, the batch strides the page strides. A key block inside one page (every block, with pages of
  // a multiple of block_n rows) takes one table lookup; a block across pages a page per row.
  const int32_t* block_table;  // (batch, block_table_batch_stride) page indices
  int64_t block_table_batch_stride;
  FastDivmod page_rows;  // by page_block_size
  int32_t num_pages;
  int32_t batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim;
  int32_t group;        // num_heads / num_heads_kv
  int64_t total_q;      // varlen: rows of packed q
  int32_t window_left;  // Mask band; causal is right = 0
  int32_t window_right;
  float softcap_scale;     // softcap > 0: s = tanh(softcap_scale * q.k), softcap_scale = softmax_scale / softcap
  float score_scale_log2;  // then exp(s') = exp2(score_scale_log2 * s''): log2(e) * (softcap or softmax_scale)
  bool has_softcap;
  bool aligned;  // every pointer 16-byte aligned and every stride and head_dim a multiple of 8 elements
  // Split-KV: num_splits > 1 writes per-split normalized o and lse to the workspace, rows indexed by
  // the global query row r (varlen: packed row; else b * seqlen_q + i), num_rows of them.
  int32_t num_splits;
  int64_t num_rows;
  float* o_partial;    // (num_splits, num_rows, num_heads, head_dim)
  float* lse_partial;  // (num_splits, num_heads, num_rows)
  const int32_t* leftpad_k;  // a left-padded KV cache: sequence b's keys start at row leftpad_k[b]
  const float* alibi_slopes;  // ALiBi: s -= slope * |i + seqlen_k - seqlen_q - j|, slope [b * stride + head]
  int64_t alibi_slopes_batch_stride;
  DropoutMask dropout;  // off unless dropout_p > 0 (src/common/dropout.hpp)
};

}  // namespace flashattn::sm80
