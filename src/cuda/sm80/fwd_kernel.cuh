// The FlashAttention-2 forward on mma.sync (sm_80 and later), and the split-KV combine.
//
// One CTA per (q-block of block_m rows, head, batch[, split]). The q tile is loaded to shared
// memory once; each warp owns block_m / warps of its rows (split-Q: warps never exchange data), or,
// in the 16-row decode tiles, a slice of every key block, its (m, l, o) merged into warp 0's at the end.
// The loop walks the key blocks j the mask leaves visible to this q-block:
//   s   = q k_j^T                           (mma.sync, q and k by ldmatrix from swizzled smem)
//   s   = tanh(s * scale / softcap)         (softcap only)
//   m'  = max(m, rowmax(s)), p = exp2(s * scale_log2 - m' * scale_log2)
//   l   = l * exp2((m - m') * scale_log2) + rowsum(p);  o = o * exp2(...) + p v_j
// with p converted to 16 bits in registers and used as the A operand of p v_j (v by ldmatrix.trans).
// Only blocks that cut the mask band (or the end of the keys) apply the element mask. Dropout (the
// kDropout instance) zeroes p's dropped elements before p v_j, not in l, and scales o by 1 / (1 - p).
// At the end o / l is stored in the input dtype and lse = (m * scale_log2 + log2 l) * ln 2 in fp32;
// a row without visible keys gets o = 0, lse = -inf.
//
// Shared memory (16-bit elements, SmemTile layout of mma.cuh):
//   q: (block_m, head_dim)   k: stages x (block_n, head_dim)   v: stages x (block_n, head_dim)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mask.hpp"
#include "cuda/common.cuh"
#include "cuda/sm80/fwd_config.cuh"
#include "cuda/sm80/mma.cuh"

namespace flashattn::sm80 {

constexpr float kNegInf = -__builtin_huge_valf();

// One 16-byte unit (8 elements from column col) of a tile row from src to dst, zero past the row's
// end or head_dim. kAligned: 16-byte cp.async (asynchronous, completes at cp_async_wait; an invalid
// unit reads nothing, its address `fallback`); otherwise element loads and a 16-byte store.
template <bool kAligned, class T>
__device__ __forceinline__ void load_unit(T* dst, const T* src, const T* fallback, bool valid_row, int col, int head_dim) {
  if constexpr (kAligned) {
    const bool valid = valid_row && head_dim > col;
    cp_async_16(dst, valid ? src : fallback, valid);
  } else {
    alignas(16) T vals[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) vals[e] = (valid_row && col + e < head_dim) ? src[e] : T(0.f);
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
  }
}

// Loads rows [row0, row0 + kRows) of one head of a (rows, head_dim) view into a swizzled tile;
// rows >= num_valid_rows and columns >= head_dim are zero-filled (load_unit).
template <int kRows, int kCols, int kThreads, bool kAligned, class T>
__device__ __forceinline__ void load_tile_units(T* tile, const T* head_base, int64_t row_stride, int row0,
                                                int num_valid_rows, int head_dim) {
  using Tile = SmemTile<kRows, kCols>;
  constexpr int kUnitsPerRow = kCols / 8;                // 16-byte units per row
  constexpr int kRowsPerPass = kThreads / kUnitsPerRow;  // rows one pass of the CTA covers
  constexpr int kTileUnits = kRows * kUnitsPerRow;
  auto load_unit = [&](const T* src, bool valid_row, int col, T* dst) {
    sm80::load_unit<kAligned>(dst, src, head_base, valid_row, col, head_dim);
  };
  if constexpr (kThreads % kUnitsPerRow == 0 && kRowsPerPass % 8 == 0 && kTileUnits % kThreads == 0) {
    // This thread's units share one column and rows kRowsPerPass apart (a multiple of 8), so one
    // swizzled offset, one source pointer and one row bound serve them all.
    const int col = (threadIdx.x % kUnitsPerRow) * 8, first_row = threadIdx.x / kUnitsPerRow;
    const int rows_left = num_valid_rows - row0 - first_row;
    const T* src = head_base + int64_t(row0 + first_row) * row_stride + col;
    T* dst = tile + Tile::offset(first_row, col);
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerPass; ++i)
      load_unit(src + i * kRowsPerPass * row_stride, i * kRowsPerPass < rows_left, col,
                dst + i * kRowsPerPass * Tile::kChunk);
  } else {
#pragma unroll
    for (int i = 0; i < (kTileUnits + kThreads - 1) / kThreads; ++i) {
      const int unit = i * kThreads + threadIdx.x;
      if (kTileUnits % kThreads != 0 && unit >= kTileUnits) break;  // a 16-row q tile: fewer units than threads
      const int row = unit / kUnitsPerRow, col = (unit % kUnitsPerRow) * 8;
      load_unit(head_base + int64_t(row0 + row) * row_stride + col, row0 + row < num_valid_rows, col,
                tile + Tile::offset(row, col));
    }
  }
}

template <int kRows, int kCols, int kThreads, class T>
__device__ __forceinline__ void load_tile(T* tile, const T* head_base, int64_t row_stride, int row0, int num_valid_rows,
                                          int head_dim, bool aligned) {
  if (aligned)
    load_tile_units<kRows, kCols, kThreads, true>(tile, head_base, row_stride, row0, num_valid_rows, head_dim);
  else
    load_tile_units<kRows, kCols, kThreads, false>(tile, head_base, row_stride, row0, num_valid_rows, head_dim);
}

// Rows [row0, row0 + kRows) of one kv head of a paged KV cache whose pages do not hold whole tiles:
// each row's page looked up in the sequence's table row (clamped into the pools: a device table is
// not validated); rows >= num_valid_rows and columns >= head_dim zero-filled (load_unit).
// The tile's table entries (at most kRows: pages of one row) are read once, kRows / 32 a lane, all in
// flight together, and each unit takes its page from the lane holding it (shfl). Where a thread's
// units share a column and lie kRowsPerPass rows apart, its (page, row in page) steps by a constant
// instead of a division per unit. The row lookup per unit made the paged kernel issue-bound: pages
// of 16 rows read 0.53-0.57 of the unpaged decode at batch 4-16, 16k keys (ncu: twice the instructions
// of whole-page tiles; H200, session 63).
template <int kRows, int kCols, int kThreads, bool kAligned, class T>
__device__ __forceinline__ void load_paged_rows(T* tile, const T* pool_head, const int32_t* table, const FastDivmod& page_rows,
                                                int num_pages, int64_t page_stride, int64_t row_stride, int row0,
                                                int num_valid_rows, int head_dim) {
  using Tile = SmemTile<kRows, kCols>;
  constexpr int kUnitsPerRow = kCols / 8;
  constexpr int kTileUnits = kRows * kUnitsPerRow;
  constexpr int kSlots = kRows / 32;  // table entries a lane holds
  static_assert(kRows % 32 == 0 && kTileUnits % kThreads == 0, "k/v tiles: whole warps, every lane a unit a pass");
  const int last_row = min(row0 + kRows, num_valid_rows) - 1;
  const int first_page = page_rows.div(row0);
  const int num_tile_pages = last_row >= row0 ? page_rows.div(last_row) - first_page + 1 : 0;
  int entry[kSlots];  // table entry first_page + lane + 32 s in slot s
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int j = int(threadIdx.x) % 32 + 32 * s;
    entry[s] = j < num_tile_pages ? min(max(__ldg(table + first_page + j), 0), num_pages - 1) : 0;
  }
  // The unit's page from the lane holding it (tile_page counted from first_page; every lane takes part).
  auto page_of = [&](int tile_page) {
    int page = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int from_slot = __shfl_sync(0xffffffffu, entry[s], tile_page % 32);
      if (tile_page / 32 == s) page = from_slot;
    }
    return page;
  };
  auto load = [&](T* dst, int page, int page_row, int col, bool valid_row) {
    const T* src = valid_row ? pool_head + page * page_stride + int64_t(page_row) * row_stride + col : pool_head;
    load_unit<kAligned>(dst, src, pool_head, valid_row, col, head_dim);
  };
  constexpr int kRowsPerPass = kThreads / kUnitsPerRow;
  if constexpr (kThreads % kUnitsPerRow == 0 && kRowsPerPass % 8 == 0) {
    // Rows first_row + i * kRowsPerPass, one column: one swizzled offset (the swizzle repeats every
    // 8 rows), and (tile_page, page_row) advanced by kRowsPerPass = pass_pages pages + pass_rows rows.
    const int col = (threadIdx.x % kUnitsPerRow) * 8, first_row = threadIdx.x / kUnitsPerRow;
    int pass_pages, tile_page;
    const int pass_rows = page_rows.divmod(kRowsPerPass, pass_pages);
    int page_row = page_rows.divmod(row0 + first_row, tile_page);
    tile_page -= first_page;
    const int rows_left = num_valid_rows - row0 - first_row;
    T* dst = tile + Tile::offset(first_row, col);
#pragma unroll 1  // unrolled by 2 or more, ptxas spilled at head_dim 128
    for (int i = 0; i < kRows / kRowsPerPass; ++i) {
      const bool valid_row = i * kRowsPerPass < rows_left;
      load(dst + i * kRowsPerPass * Tile::kChunk, page_of(valid_row ? tile_page : 0), page_row, col, valid_row);
      page_row += pass_rows;
      tile_page += pass_pages;
      if (page_row >= int(page_rows.divisor)) page_row -= int(page_rows.divisor), ++tile_page;
    }
  } else {
#pragma unroll 4
    for (int i = 0; i < kTileUnits / kThreads; ++i) {
      const int unit = i * kThreads + threadIdx.x;
      const int row = unit / kUnitsPerRow, col = (unit % kUnitsPerRow) * 8;
      const bool valid_row = row0 + row < num_valid_rows;
      int tile_page;
      const int page_row = page_rows.divmod(row0 + row, tile_page);
      load(tile + Tile::offset(row, col), page_of(valid_row ? tile_page - first_page : 0), page_row, col, valid_row);
    }
  }
}

// Programmatic dependent launch (sm_90; nothing before): the split-KV combine is launched to start
// while the split grid runs (run_fwd_combine), so its launch is not another gap after it. Each split
// CTA lets it be scheduled at once (its CTAs need no shared memory and wait); the combine waits until
// the whole split grid has finished and its partials are visible.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Pairwise (tree) reductions of n values: short dependency chains.
template <int n>
__device__ __forceinline__ float tree_max(float (&x)[n]) {
#pragma unroll
  for (int stride = 1; stride < n; stride *= 2)
#pragma unroll
    for (int i = 0; i + stride < n; i += 2 * stride) x[i] = fmaxf(x[i], x[i + stride]);
  return x[0];
}
template <int n>
__device__ __forceinline__ float tree_sum(float (&x)[n]) {
#pragma unroll
  for (int stride = 1; stride < n; stride *= 2)
#pragma unroll
    for (int i = 0; i + stride < n; i += 2 * stride) x[i] += x[i + stride];
  return x[0];
}

// The config arrives as its fields: nvcc's host stubs cannot take a class-type template argument.
// kVariant (FwdVariant): the instances with a KV cache's pages or left padding, and with ALiBi, are
// separate, since the page lookup in the shared code cost the other kernels 2-8% (spills; H200,
// session 62).
template <int kHeadDim, int kBlockM_, int kBlockN_, int kWarps_, int kStages_, class T, FwdVariant kVariant>
__global__ void __launch_bounds__(32 * kWarps_) fwd_kernel(const FwdParams p) {
  constexpr bool kCache = kVariant == FwdVariant::kGeneral;   // block_table, leftpad_k
  constexpr bool kAlibi = kVariant != FwdVariant::kPlain;     // alibi_slopes
  constexpr bool kDropout = kVariant == FwdVariant::kDropout;  // dropout
  using Traits = FwdTraits<FwdConfig{kHeadDim, kBlockM_, kBlockN_, kWarps_, kStages_}>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kThreads = Traits::kThreads, kWarps = Traits::kWarps;
  constexpr int kMTiles = Traits::kMTiles, kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  constexpr int kStages = Traits::kStages;
  constexpr bool kWarpsSplitKeys = Traits::kWarpsSplitKeys;
  using QTile = SmemTile<kBlockM, kHeadDim>;
  using KVTile = SmemTile<kBlockN, kHeadDim>;
  allow_dependent_launch();  // the combine, when split (a grid launched as a dependent still waits for this one)

  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);
  T* sk = sq + QTile::kElements;                // kStages k tiles
  T* sv = sk + kStages * KVTile::kElements;     // kStages v tiles

  // Heaviest q-blocks first (causal: the last rows see the most keys), for a balanced tail.
  const int m_block = gridDim.x - 1 - blockIdx.x, head = blockIdx.y;
  const int batch = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
  const int head_kv = head / p.group;

  // The sequence: where its rows start (varlen) and its lengths.
  int64_t q_start = 0, k_start = 0;
  int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  if (p.cu_seqlens_q) {
    q_start = p.cu_seqlens_q[batch];
    k_start = p.cu_seqlens_k[batch];
    seqlen_q = p.cu_seqlens_q[batch + 1] - int(q_start);
    seqlen_k = p.cu_seqlens_k[batch + 1] - int(k_start);
  } else if (p.seqused_k) {
    // The keys past it are a KV cache's unused rows. Clamped: the device array is not validated.
    seqlen_k = min(max(p.seqused_k[batch], 0), seqlen_k);
  }
  if constexpr (kCache) {
    if (p.leftpad_k) {  // a left-padded cache: the keys start at row leftpad_k[b] (clamped likewise)
      k_start = min(max(p.leftpad_k[batch], 0), seqlen_k);
      seqlen_k -= int(k_start);
    }
  }
  // ALiBi's slope in the units of the scores s below (raw q.k, or the softcap's tanh): the softmax
  // multiplies them by score_scale_log2, the bias is in units of the scaled scores. 0: none.
  float alibi_slope = 0.f;
  if constexpr (kAlibi)
    if (p.alibi_slopes)
      alibi_slope = p.alibi_slopes[batch * p.alibi_slopes_batch_stride + head] * kLog2e / p.score_scale_log2;
  const int m0 = m_block * kBlockM;
  if (m0 >= seqlen_q) return;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const T* q_head = static_cast<const T*>(p.q) + (varlen ? 0 : batch * p.q_batch_stride) + (q_start + m0) * p.q_row_stride +
                    head * p.q_head_stride;
  // k and v of this kv head: the sequence's rows, or (paged) the pools, whose pages load_kv finds.
  const bool paged = kCache && p.block_table != nullptr;
  const bool own_rows = !varlen && !paged;
  const T* k_head = static_cast<const T*>(p.k) + (own_rows ? batch * p.k_batch_stride : 0) + k_start * p.k_row_stride +
                    head_kv * p.k_head_stride;
  const T* v_head = static_cast<const T*>(p.v) + (own_rows ? batch * p.v_batch_stride : 0) + k_start * p.v_row_stride +
                    head_kv * p.v_head_stride;

  // Key blocks visible to any row of this q-block (key_begin and key_end grow with the row), then
  // this split's share of them.
  const Mask mask(seqlen_q, seqlen_k, false, p.window_left, p.window_right);
  const int m_last = min(m0 + kBlockM, seqlen_q) - 1;
  const int key_lo = int(mask.key_begin(m0)), key_hi = int(mask.key_end(m_last));
  int n_begin = key_lo / kBlockN, n_end = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_begin;
  if (p.num_splits > 1) {
    const int per_split = (n_end - n_begin + p.num_splits - 1) / p.num_splits;
    n_begin = min(n_end, n_begin + split * per_split);
    n_end = min(n_end, n_begin + per_split);
  }
  // Blocks entirely inside every row's band need no element mask.
  const int full_lo = int(mask.key_begin(m_last)), full_hi = int(mask.key_end(m0));

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = kWarpsSplitKeys ? 0 : warp * 16 * kMTiles;  // first q-block row of this warp
  const int warp_key0 = kWarpsSplitKeys ? warp * Traits::kWarpKeys : 0;  // first key of a block of this warp

  float o_acc[kMTiles][kDTiles][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];  // row_sum: this lane's partial sum of its columns
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][dt][e] = 0.f;
    row_max[mt][0] = row_max[mt][1] = kNegInf;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  // ldmatrix lane addresses (patterns in mma.cuh), one 32-bit shared address per operand: q rows of
  // this warp (A), k rows (B, [n][k]) and v rows (B, [k][n], .trans) of stage 0. A k-step or an m-,
  // n- or d-tile is a compile-time XOR / add on it, a stage a constant offset, in place of a
  // swizzled offset per fragment (H100: +1-4% at head_dim 128, fewer spills; dev/sm80fwd/NOTES.md).
  const WarpCursor<kBlockM, kHeadDim> cur_q(smem_addr(sq), warp_row0 + lane % 16, lane / 16, 0);
  const WarpCursor<kBlockN, kHeadDim> cur_k(smem_addr(sk), warp_key0 + 8 * (lane / 16) + lane % 8, (lane / 8) % 2, 0);
  const WarpCursor<kBlockN, kHeadDim> cur_v(smem_addr(sv), warp_key0 + 8 * ((lane / 8) % 2) + lane % 8, lane / 16, 0);
  static_assert(KVTile::kBytes % 128 == 0, "stages keep the 128-byte alignment the cursors need");

  // Tiles of whole rows (every row inside the sequence, head_dim == kHeadDim, aligned) load with
  // load_whole_tile: one 64-bit add a 16-byte unit, where load_tile's per-unit bounds and select were
  // ~75 instructions a warp for q alone (ncu, head_dim 128). For k and v only from head_dim 128: at
  // head_dim 64 the second load path in the loop made ptxas spill and measured 0.4-2% slower.
  const bool whole_d = p.aligned && p.head_dim == kHeadDim;
  constexpr bool kWholeKV = kHeadDim >= 128 && whole_tile_split<kBlockN, kHeadDim, kThreads>();
  constexpr bool kWholeQ = whole_tile_split<kBlockM, kHeadDim, kThreads>();
  const int rows_q = seqlen_q - m0;
  auto load_kv = [&](T* tile, const T* head, int64_t page_stride, int64_t row_stride, int n_block) {
    if (paged) {
      const int32_t* table = p.block_table + batch * p.block_table_batch_stride;
      // Key block j: rows [j * block_n, ..) of the sequence. Inside one page (always, with pages of a
      // multiple of block_n; every block with one page a sequence, as cache_batch_idx makes): one lookup.
      int page_index;
      const int page_row0 = p.page_rows.divmod(n_block * kBlockN, page_index);
      const int block_rows = min(kBlockN, seqlen_k - n_block * kBlockN);
      if (page_row0 + block_rows > int(p.page_rows.divisor)) {  // across pages: a page per row
        if (p.aligned)
          load_paged_rows<kBlockN, kHeadDim, kThreads, true>(tile, head, table, p.page_rows, p.num_pages, page_stride,
                                                             row_stride, n_block * kBlockN, seqlen_k, p.head_dim);
        else
          load_paged_rows<kBlockN, kHeadDim, kThreads, false>(tile, head, table, p.page_rows, p.num_pages, page_stride,
                                                              row_stride, n_block * kBlockN, seqlen_k, p.head_dim);
        return;
      }
      // The head's base moves to the block's page, less the rows before the block, so the loads' row
      // offsets stay the sequence's (the table's entry clamped into the pools: a device table is not
      // validated).
      const int page = min(max(table[page_index], 0), p.num_pages - 1);
      head += page * page_stride + int64_t(page_row0 - n_block * kBlockN) * row_stride;
    }
    if constexpr (kWholeKV) {
      if (whole_d && (n_block + 1) * kBlockN <= seqlen_k) {
        load_whole_tile<T, kBlockN, kHeadDim, kThreads>(smem_addr(tile), head + int64_t(n_block) * kBlockN * row_stride,
                                                        row_stride);
        return;
      }
    }
    load_tile<kBlockN, kHeadDim, kThreads>(tile, head, row_stride, n_block * kBlockN, seqlen_k, p.head_dim, p.aligned);
  };
  auto load_k = [&](int n_block, int stage) {
    load_kv(sk + stage * KVTile::kElements, k_head, p.k_batch_stride, p.k_row_stride, n_block);
  };
  auto load_v = [&](int n_block, int stage) {
    load_kv(sv + stage * KVTile::kElements, v_head, p.v_batch_stride, p.v_row_stride, n_block);
  };

  // Prologue: q and the first k (and v) block in flight.
  bool q_loaded = false;
  if constexpr (kWholeQ) {
    if (whole_d && rows_q >= kBlockM) {
      load_whole_tile<T, kBlockM, kHeadDim, kThreads>(smem_addr(sq), q_head, p.q_row_stride);
      q_loaded = true;
    }
  }
  if (!q_loaded) load_tile<kBlockM, kHeadDim, kThreads>(sq, q_head, p.q_row_stride, 0, rows_q, p.head_dim, p.aligned);
  if (n_begin < n_end) {
    load_k(n_begin, 0);
    if constexpr (kStages == 2) load_v(n_begin, 0);
  }
  cp_async_commit();

  for (int n_block = n_begin; n_block < n_end; ++n_block) {
    const int stage = kStages == 2 ? (n_block - n_begin) & 1 : 0;
    const uint32_t stage_off = stage * KVTile::kBytes;  // k_j, v_j: the cursors' tiles + stage_off
    // Block j has landed (this thread's copies: wait; everyone's: the barrier), and every warp is
    // done with the buffers the next loads overwrite.
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kStages == 2) {
      if (n_block + 1 < n_end) {
        load_k(n_block + 1, stage ^ 1);
        load_v(n_block + 1, stage ^ 1);
      }
    } else {
      load_v(n_block, 0);
    }
    cp_async_commit();

    // s = q k_j^T: (16 * kMTiles, block_n) per warp.
    float s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t qa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ldsm_x4(qa[mt], cur_q.at(mt * 16, kk * 16));
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t kb[4];
        ldsm_x4(kb, cur_k.at(np * 16, kk * 16) + stage_off);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    if constexpr (kStages == 1) {
      // v_j has landed and every warp is done with k_j: prefetch k_{j+1} over the softmax and p v_j.
      cp_async_wait<0>();
      __syncthreads();
      if (n_block + 1 < n_end) load_k(n_block + 1, 0);
      cp_async_commit();
    }

    if (p.has_softcap) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = cuda::softcap_tanh(s[mt][nt][e] * p.softcap_scale);
    }

    const int n0 = n_block * kBlockN;
    if constexpr (kAlibi) {
      if (alibi_slope != 0.f) {  // ALiBi: s_ij -= slope * |i + seqlen_k - seqlen_q - j| (masked ones stay -inf below)
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            // The distance of this lane's first column; the others are compile-time steps from it.
            const float first = float(int(mask.diagonal(m0 + warp_row0 + mt * 16 + g + 8 * half)) - (n0 + warp_key0 + 2 * t));
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) s[mt][nt][2 * half + e] -= alibi_slope * fabsf(first - float(nt * 8 + e));
          }
      }
    }
    if (!(n0 >= full_lo && n0 + kBlockN <= full_hi)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = m0 + warp_row0 + mt * 16 + g + 8 * half;
          const int lo = int(mask.key_begin(row)), hi = int(mask.key_end(row));
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = n0 + warp_key0 + nt * 8 + 2 * t + e;
              if (col < lo || col >= hi) s[mt][nt][2 * half + e] = kNegInf;
            }
        }
    }

    // Online softmax, one row (mt, half) at a time; a row is spread over the 4 lanes of a quad.
    const float scale_log2 = p.score_scale_log2;
    float correction[kMTiles][2];
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float part[kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) part[nt] = fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]);
        const float m_block = quad_max(fmaxf(row_max[mt][half], tree_max(part)));
        // The max moves only when it grows by more than cuda::kMaxSlack (cuda/common.cuh); o is
        // rescaled in the rare blocks that move it.
        const bool moved = (m_block - row_max[mt][half]) * scale_log2 > cuda::kMaxSlack;
        const float m_new = moved ? m_block : row_max[mt][half];
        // A row with nothing visible yet keeps max -inf: subtract 0 so p = exp2(-inf) = 0, not NaN.
        const float m_scaled = m_new == kNegInf ? 0.f : m_new * scale_log2;
        correction[mt][half] = moved ? exp2_fast(row_max[mt][half] * scale_log2 - m_scaled) : 1.f;
        rescale |= moved;
        row_max[mt][half] = m_new;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          float& x0 = s[mt][nt][2 * half];
          float& x1 = s[mt][nt][2 * half + 1];
          x0 = exp2_fast(x0 * scale_log2 - m_scaled);
          x1 = exp2_fast(x1 * scale_log2 - m_scaled);
          part[nt] = x0 + x1;
        }
        row_sum[mt][half] = row_sum[mt][half] * correction[mt][half] + tree_sum(part);
      }
    // Once the running max settles (most blocks of a long row), o needs no rescaling: skip the
    // multiplies when no row of the warp moved.
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) o_acc[mt][dt][e] *= correction[mt][e / 2];
    }

    // o += p v_j: p's C fragments repacked as A fragments (mma.cuh), v_j by ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < kNTiles / 2; ++kk) {
      // Dropout: p's dropped elements zeroed, a 16 x 16 tile (this warp's rows, keys 16 kk..) at a time,
      // number e of the lane's call being s[mt][2 kk + e / 4][e % 4] (src/common/dropout.hpp). The row
      // sums above keep them (lse is of P); the kept ones' scale comes in the epilogue. (All of a block's
      // bits drawn before s = q k^T: 7-9% slower, H200.)
      if (kDropout && p.dropout.on())
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const uint32_t bits = p.dropout.keep_bits(batch * p.num_heads + head, (m0 + warp_row0) / 16 + mt,
                                                    (n0 + warp_key0) / 16 + kk, lane);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            float& x = s[mt][2 * kk + e / 4][e % 4];
            x = (bits >> e) & 1u ? x : 0.f;
          }
        }
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, cur_v.at(kk * 16, dp * 16) + stage_off);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(o_acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma_16816<T>(o_acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing may be in flight when the CTA exits

  if constexpr (kWarpsSplitKeys) {
    // Merge: warps 1.. leave their running max, partial sums and o in the k/v stages (free once every
    // warp has left the loop; [warp - 1][value][lane] floats), and warp 0 rescales each to the common
    // max and adds it, as the online softmax merges two key blocks. Warp 0 then runs the epilogue alone.
    constexpr int kValues = Traits::kMergeFloats;
    float* merge = reinterpret_cast<float*>(sk);
    __syncthreads();
    if (warp > 0) {
      float* mine = merge + (warp - 1) * kValues * 32 + lane;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        mine[32 * half] = row_max[0][half];
        mine[32 * (2 + half)] = row_sum[0][half];
      }
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[32 * (4 + 4 * dt + e)] = o_acc[0][dt][e];
    }
    __syncthreads();
    if (warp > 0) return;
    const float scale_log2 = p.score_scale_log2;
    // exp2((m - m_new) * scale) with m = -inf (nothing visible) weighing 0.
    auto weight = [&](float m, float m_new) { return m == kNegInf ? 0.f : exp2_fast((m - m_new) * scale_log2); };
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m_new = row_max[0][half];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) m_new = fmaxf(m_new, merge[(w - 1) * kValues * 32 + 32 * half + lane]);
      const float c = weight(row_max[0][half], m_new);
      row_sum[0][half] *= c;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o_acc[0][dt][2 * half] *= c;
        o_acc[0][dt][2 * half + 1] *= c;
      }
#pragma unroll
      for (int w = 1; w < kWarps; ++w) {
        const float* theirs = merge + (w - 1) * kValues * 32 + lane;
        const float cw = weight(theirs[32 * half], m_new);
        row_sum[0][half] += cw * theirs[32 * (2 + half)];
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o_acc[0][dt][2 * half] += cw * theirs[32 * (4 + 4 * dt + 2 * half)];
          o_acc[0][dt][2 * half + 1] += cw * theirs[32 * (4 + 4 * dt + 2 * half + 1)];
        }
      }
      row_max[0][half] = m_new;
    }
  }

  // Epilogue: o / l and lse, rows below seqlen_q only, columns below head_dim only; with dropout o is
  // also scaled by 1 / (1 - p) (the kept elements' factor).
  const bool split_out = p.num_splits > 1;
  const float o_scale = kDropout ? p.dropout.scale : 1.f;
  // The lse (natural log) of row (mt, half) with row sum l, and where row `row` of the sequence
  // keeps it in p.lse; both epilogues below use them.
  auto row_lse = [&](int mt, int half, float l) {
    return l > 0.f ? (row_max[mt][half] * p.score_scale_log2 + __log2f(l)) * kLn2 : kNegInf;
  };
  auto lse_index = [&](int row) {
    return varlen ? int64_t(head) * p.total_q + q_start + row
                  : (int64_t(batch) * p.num_heads + head) * p.seqlen_q + row;
  };
  if (whole_d && !split_out) {
    // Each warp passes o through its own rows of the q tile (only this warp read them), then stores
    // 16-byte pieces of whole rows. From the fragments, each 4-byte store touches 8 rows; with a
    // test per column that was 16% of a 512-key call's time at head_dim 128 (ncu); staged: +3-13%
    // at 512-1k keys (dev/sm80fwd/NOTES.md). Without a key block the loop's barrier never ordered
    // the other threads' copies of q before these writes, and the warp's own ldmatrix reads of its
    // rows came from other lanes' addresses (racecheck).
    if (!kWarpsSplitKeys && n_begin >= n_end) __syncthreads();  // (the merge's barriers did)
    __syncwarp();
    constexpr int kUnits = kHeadDim / 8, kWarpUnits = 16 * kMTiles * kUnits;
    static_assert(kWarpUnits % 32 == 0, "whole 16-byte units per lane");
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float l = quad_sum(row_sum[mt][half]);
        const int r = warp_row0 + mt * 16 + g + 8 * half, row = m0 + r;
        const float inv_l = l > 0.f ? o_scale / l : 0.f;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt)
          *reinterpret_cast<uint32_t*>(sq + QTile::offset(r, dt * 8) + 2 * t) =
              pack2<T>(o_acc[mt][dt][2 * half] * inv_l, o_acc[mt][dt][2 * half + 1] * inv_l);
        if (p.lse && t == 0 && row < seqlen_q) p.lse[lse_index(row)] = row_lse(mt, half, l);
      }
    __syncwarp();
    T* o_rows = static_cast<T*>(p.o) + (varlen ? 0 : batch * p.o_batch_stride) + (q_start + m0) * p.o_row_stride +
                head * p.o_head_stride;
#pragma unroll
    for (int j = 0; j < kWarpUnits / 32; ++j) {
      const int unit = j * 32 + lane, r = warp_row0 + unit / kUnits, c = (unit % kUnits) * 8;
      if (m0 + r < seqlen_q)
        *reinterpret_cast<uint4*>(o_rows + int64_t(r) * p.o_row_stride + c) =
            *reinterpret_cast<const uint4*>(sq + QTile::offset(r, c));
    }
    return;
  }
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = quad_sum(row_sum[mt][half]);
      const int row = m0 + warp_row0 + mt * 16 + g + 8 * half;  // row within the sequence
      if (row >= seqlen_q) continue;
      const float inv_l = l > 0.f ? o_scale / l : 0.f;
      const float lse = row_lse(mt, half, l);
      const int64_t global_row = varlen ? q_start + row : int64_t(batch) * p.seqlen_q + row;
      if (split_out) {
        float* dst = p.o_partial + ((int64_t(split) * p.num_rows + global_row) * p.num_heads + head) * p.head_dim;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          const int col = dt * 8 + 2 * t;
          if (col < p.head_dim) {
            dst[col] = o_acc[mt][dt][2 * half] * inv_l;
            if (col + 1 < p.head_dim) dst[col + 1] = o_acc[mt][dt][2 * half + 1] * inv_l;
          }
        }
        if (t == 0) p.lse_partial[(int64_t(split) * p.num_heads + head) * p.num_rows + global_row] = lse;
      } else {
        T* dst = static_cast<T*>(p.o) + (varlen ? 0 : batch * p.o_batch_stride) + (q_start + row) * p.o_row_stride +
                 head * p.o_head_stride;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          const int col = dt * 8 + 2 * t;
          const float x0 = o_acc[mt][dt][2 * half] * inv_l, x1 = o_acc[mt][dt][2 * half + 1] * inv_l;
          if (p.aligned) {
            if (col < p.head_dim) *reinterpret_cast<uint32_t*>(dst + col) = pack2<T>(x0, x1);
          } else {
            if (col < p.head_dim) dst[col] = T(x0);
            if (col + 1 < p.head_dim) dst[col + 1] = T(x1);
          }
        }
        if (p.lse && t == 0) p.lse[lse_index(row)] = lse;
      }
    }
}

// Columns [kVec c, kVec c + kVec) of the combined o: every split's partial (o_row + s * split_stride)
// weighted by w of its lane (split s: lane s % 32, w[s / 32]) and summed. The whole warp calls it (the
// weights go round by shuffles); lanes with c past the row (!active) load and store nothing.
template <int kVec, int kPerLane, class T>
__device__ __forceinline__ void combine_columns(T* o, const float* o_row, int64_t split_stride, int num_splits,
                                                const float (&w)[kPerLane], int c, bool active) {
  float acc[kVec] = {};
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int splits_i = min(32, num_splits - 32 * i);  // warp-uniform
#pragma unroll 4
    for (int j = 0; j < splits_i; ++j) {
      const float ws = __shfl_sync(0xffffffffu, w[i], j);
      if (!active) continue;
      const float* src = o_row + (32 * i + j) * split_stride + kVec * c;
      if constexpr (kVec == 4) {
        const float4 x = *reinterpret_cast<const float4*>(src);
        acc[0] += ws * x.x, acc[1] += ws * x.y, acc[2] += ws * x.z, acc[3] += ws * x.w;
      } else {
        acc[0] += ws * *src;
      }
    }
  }
  if (active)
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[kVec * c + e] = T(acc[e]);
}

// Split-KV combine: one warp per (global query row, head). With lse_s the partials' log-sum-exps,
//   lse = log(sum_s exp(lse_s)),  o = sum_s exp(lse_s - lse) * o_s
// (the same merge as the online softmax, over splits instead of key blocks). Splits that saw no
// visible key have lse_s = -inf and weight 0; a row with none at all gets o = 0, lse = -inf.
// Lane l holds the weights of splits l, l + 32, ..; each o_s is read once, 4 columns a lane where
// they are 16-byte aligned, with a warp's loads of several splits in flight together. (One split
// at a time, a column a lane, took 11.8 us for 16 rows of 16 splits, H200 ncu: 8% of a decode call.)
template <class T>
__global__ void __launch_bounds__(128) fwd_combine_kernel(const FwdParams p) {
  const int64_t item = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // (global_row, head)
  if (item >= p.num_rows * p.num_heads) return;
  wait_for_prior_grid();
  const int lane = threadIdx.x % 32;
  const int64_t global_row = item / p.num_heads;
  const int head = int(item % p.num_heads);
  const int num_splits = p.num_splits;

  constexpr int kPerLane = kMaxSplits / 32;
  float lse_s[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int s = lane + 32 * i;
    lse_s[i] = s < num_splits ? p.lse_partial[(int64_t(s) * p.num_heads + head) * p.num_rows + global_row] : kNegInf;
  }
  float lse_max = lse_s[0];
#pragma unroll
  for (int i = 1; i < kPerLane; ++i) lse_max = fmaxf(lse_max, lse_s[i]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, offset));
  float sum = 0.f;
  if (lse_max != kNegInf)
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) sum += expf(lse_s[i] - lse_max);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float lse = sum > 0.f ? lse_max + logf(sum) : kNegInf;
  float w[kPerLane];  // exp(lse_s - lse); 0 for a split without keys, and everywhere in a row without any
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) w[i] = lse == kNegInf ? 0.f : expf(lse_s[i] - lse);

  // The row's place in o and lse.
  int64_t o_offset, lse_index;
  if (p.cu_seqlens_q) {
    o_offset = global_row * p.o_row_stride + int64_t(head) * p.o_head_stride;
    lse_index = int64_t(head) * p.total_q + global_row;
  } else {
    const int64_t batch = global_row / p.seqlen_q, row = global_row % p.seqlen_q;
    o_offset = batch * p.o_batch_stride + row * p.o_row_stride + int64_t(head) * p.o_head_stride;
    lse_index = (batch * p.num_heads + head) * p.seqlen_q + row;
  }
  const float* o_row = p.o_partial + (global_row * p.num_heads + head) * p.head_dim;  // split 0's partial
  const int64_t split_stride = p.num_rows * p.num_heads * p.head_dim;
  T* o = static_cast<T*>(p.o) + o_offset;
  // Warp-uniform loops: every lane takes part in the shuffles, also past the last column.
  if (p.head_dim % 4 == 0 && (reinterpret_cast<uintptr_t>(p.o_partial) & 15) == 0) {
    for (int c0 = 0; c0 < p.head_dim / 4; c0 += 32)
      combine_columns<4>(o, o_row, split_stride, num_splits, w, c0 + lane, c0 + lane < p.head_dim / 4);
  } else {
    for (int c0 = 0; c0 < p.head_dim; c0 += 32)
      combine_columns<1>(o, o_row, split_stride, num_splits, w, c0 + lane, c0 + lane < p.head_dim);
  }
  if (p.lse && lane == 0) p.lse[lse_index] = lse;
}

}  // namespace flashattn::sm80
