// Epilogue: O / row_sum to the output dtype and the lse, rows outside the sequence predicated off
// (varlen tiles may overhang the next sequence's rows in the packed tensor, causal tiles the rows
// before the first: Tile::row0). Three ways:
//   store_tile:        4-byte stores straight from the accumulator registers (each warp store
//                      touches 8 rows: the load/store unit, not the tensor cores, sets the pace
//                      of short sequences);
//   store_tile_slab:   O through a slab of shared memory per warp, then a TMA store (or 16-byte
//                      stores);
//   store_tile_staged: O through shared memory (the tile's own q buffer, whose rows the
//                      warpgroup has finished reading), then a TMA store (or 16-byte stores).
// Columns past FwdParams::head_dim (a zero-padded head dim: fwd_kernel_head_dim) are not stored: a panel's TMA
// store is skipped past them and clips within them, the register and 16-byte stores are guarded.
// Each takes the rows' 1 / row_sum from its caller (inverse_row_sums): the kernels Traits::kInverseEarly
// names compute them while the tile's last O += P v runs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm90/params.cuh"
#include "cuda/sm90/primitives.cuh"
#include "cuda/sm90/scheduler.cuh"

namespace flashattn::cuda::sm90 {

// Whether O's column col (a multiple of 8) is stored: below FwdParams::head_dim; known at compile time below
// the least head_dim the kernel runs (the guard then costs nothing: a runtime one on the TMA stores' panels
// made ptxas spill 12 more bytes in head_dim 128's dropout kernel).
template <class T>
__device__ __forceinline__ bool stores_column(int col, const FwdParams& p) {
  return col < T::kMinHeadDim || col < p.head_dim;
}

// The lse of the thread's two rows (one lane of four writes it).
template <class T>
__device__ __forceinline__ void store_lse(const float (&row_max)[2], const float (&row_sum)[2], const FwdParams& p,
                                          const Tile& tile, int32_t row0) {
  constexpr float kLn2 = 0.6931471805599453f;
  if (!p.lse || threadIdx.x % 4 != 0) return;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int32_t row = row0 + 8 * i;
    if (!row_in_sequence(tile, row)) continue;
    const float lse = row_sum[i] > 0.f ? (row_max[i] + __log2f(row_sum[i])) * kLn2 : -INFINITY;
    const int64_t index = p.cu_seqlens_q ? int64_t(tile.head) * p.total_q + tile.q_start + row
                                         : (int64_t(tile.batch) * p.num_heads + tile.head) * p.seqlen_q + row;
    p.lse[index] = lse;
  }
}

// 1 / row_sum of the thread's two rows; 0 for a row that saw no key (o = 0). The approximate reciprocal
// (MUFU.RCP, 1 ulp): a row's sum lies in [1, 2^8 seqlen_k] (the element that set the running max adds 1),
// far inside its range, and O goes to 16 bits; the IEEE division was ~20 instructions and a branch.
__device__ __forceinline__ void inverse_row_sums(const float (&row_sum)[2], float (&inv)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) inv[i] = row_sum[i] > 0.f ? __fdividef(1.f, row_sum[i]) : 0.f;
}

template <class T>
__device__ __forceinline__ void store_tile(const float (&o)[T::kHeadDim / 2], const float (&row_max)[2],
                                           const float (&row_sum)[2], const float (&inv)[2], const FwdParams& p,
                                           const Tile& tile, int consumer_wg) {
  const int thread = threadIdx.x % 128, lane = threadIdx.x % 32;
  const int32_t row0 = tile.row0 + 64 * consumer_wg + 16 * (thread / 32) + lane / 4;
  const int64_t batch_offset = p.cu_seqlens_q ? 0 : int64_t(tile.batch) * p.o_batch_stride;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int32_t row = row0 + 8 * i;
    if (!row_in_sequence(tile, row)) continue;
    uint32_t* out = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.o) + batch_offset +
                                                (tile.q_start + row) * p.o_row_stride +
                                                int64_t(tile.head) * p.o_head_stride + 2 * (lane % 4));
#pragma unroll
    for (int n = 0; n < T::kHeadDim / 8; ++n)
      if (stores_column<T>(8 * n, p))
        out[4 * n] = pack2(o[4 * n + 2 * i] * inv[i], o[4 * n + 2 * i + 1] * inv[i], T::kBf16);
  }
  store_lse<T>(row_max, row_sum, p, tile, row0);
}

// O / row_sum of this warp's 16 rows, 16-byte chunks [chunk0, chunk0 + kCount), to shared memory
// by stmatrix: chunk_addr(r, c) is the address of chunk c - chunk0 of the warp's row r. Matrices
// (row half i, chunk n) for n, n + 1; lane l addresses row l % 8 of matrix l / 8.
template <class T, int kCount, class ChunkAddr>
__device__ __forceinline__ void stmatrix_o(const float (&o)[T::kHeadDim / 2], const float (&inv)[2], int chunk0,
                                           ChunkAddr chunk_addr) {
  const int lane = threadIdx.x % 32, m = lane / 8, r_lane = lane % 8 + 8 * (m % 2);
#pragma unroll
  for (int n = 0; n < kCount; n += 2) {
    uint32_t r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int nn = chunk0 + n + j / 2, i = j % 2;
      r[j] = pack2(o[4 * nn + 2 * i] * inv[i], o[4 * nn + 2 * i + 1] * inv[i], T::kBf16);
    }
    stmatrix_x4(chunk_addr(r_lane, n + m / 2), r[0], r[1], r[2], r[3]);
  }
}

// O of this warp's 16 rows through its own slab of shared memory, kSlabCols columns at a time:
// panels of 64 columns x 16 rows of 128 bytes, 16-byte chunks swizzled as TMA's 128-byte swizzle
// (chunk c of row r at c ^ (r % 8): free of bank conflicts both ways). Then
//   fixed-length batches: one TMA store per panel by the warp's first lane (rows past seqlen_q
//     are outside the tensor map): the warp goes on while the stores drain (every SM reaching
//     its epilogue at once made the stores queue: ~7700 clocks a tile at head_dim 256);
//   varlen, or rows before the first: 16-byte stores of row pieces, rows outside the sequence
//     predicated off.
// Either writes whole 32-byte sectors (store_tile's 4-byte stores: 8 rows x 16 bytes a warp
// store). Private to the warp: __syncwarp and the bulk-group waits are the only synchronization.
template <class T>
__device__ __forceinline__ void store_tile_slab(const float (&o)[T::kHeadDim / 2], const float (&row_max)[2],
                                                const float (&row_sum)[2], const float (&inv)[2],
                                                const FwdParams& p, const CUtensorMap* map_o, const Tile& tile,
                                                int consumer_wg, uint8_t* slabs,
                                                [[maybe_unused]] int trace_count = 0) {
  constexpr int kChunks = T::kSlabCols / 8;  // 16-byte chunks of a slab row: 16 or 8
  constexpr int kRowsPerStore = 32 / kChunks;  // rows a warp store covers (varlen)
  constexpr int kPanelBytes = 16 * 128;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  uint8_t* slab_ptr = slabs + (consumer_wg * 4 + warp) * 16 * T::kSlabCols * 2;
  const uint32_t slab = smem_addr(slab_ptr);
  auto chunk_addr = [&](int r, int c) { return swizzled_chunk(slab, kPanelBytes, r, c); };
  const int32_t row_w = tile.row0 + 64 * consumer_wg + 16 * warp;  // first row of the warp
  const bool tma = FLASHATTN_SM90_TMA_STORE && !p.cu_seqlens_q && tile.row0 >= 0;  // see store_tile_staged
  const int64_t batch_offset = p.cu_seqlens_q ? 0 : int64_t(tile.batch) * p.o_batch_stride;
  uint16_t* out = static_cast<uint16_t*>(p.o) + batch_offset + (tile.q_start + row_w) * p.o_row_stride +
                  int64_t(tile.head) * p.o_head_stride;
#pragma unroll
  for (int pass = 0; pass < T::kHeadDim / T::kSlabCols; ++pass) {
    // The slab is free once the stores before (the tile before's, or the pass before) have read it.
    if (lane == 0) bulk_wait_group_0<true>();
    __syncwarp();
    if (pass == 1) SM90_TRACE(p, consumer_wg, trace_count, 11);
    stmatrix_o<T, kChunks>(o, inv, pass * kChunks, chunk_addr);
    if (pass == 0) SM90_TRACE(p, consumer_wg, trace_count, 9);
    if (tma) fence_proxy_async_shared();  // the stmatrix writes before the TMA unit reads them
    __syncwarp();
    if (tma) {
      if (lane == 0) {
#pragma unroll
        for (int c = 0; c < T::kSlabCols / 64; ++c)
          if (stores_column<T>(pass * T::kSlabCols + 64 * c, p))
            tma_store_4d(map_o, slab_ptr + c * kPanelBytes, pass * T::kSlabCols + 64 * c, row_w, tile.head, tile.batch);
        bulk_commit_group();
      }
      SM90_TRACE(p, consumer_wg, trace_count, pass == 0 ? 10 : 12);
    } else {
#pragma unroll
      for (int it = 0; it < 16 / kRowsPerStore; ++it) {
        const int r = it * kRowsPerStore + lane / kChunks, c = lane % kChunks;
        const uint4 v = ld_shared_v4(chunk_addr(r, c));
        const int col = pass * T::kSlabCols + 8 * c;
        if (row_in_sequence(tile, row_w + r) && stores_column<T>(col, p))
          st_global_v4(out + r * p.o_row_stride + col, v);
      }
    }
  }
  store_lse<T>(row_max, row_sum, p, tile, row_w + lane / 4);
}

// Barrier ids of the staged epilogue: one per consumer warpgroup (after the ping-pong ids).
constexpr int kEpilogueBarrier = 3;

// A piece of one of the last round's split tiles (Tile::tail_task >= 0): this warpgroup's rows after its
// key blocks, O unnormalized against the row max m_j (exp2 domain) and the row sum l_j, go to the
// piece's slot in the workspace as the registers hold them (coalesced float4s). Returns whether this
// warpgroup is the last of the tile's pieces to finish these rows (a counter per split tile and
// warpgroup); it then merges them (merge_pieces) once its persistent loop is done: with the merge in the
// loop, ptxas spilled 136-350 bytes of the main loop's registers.
template <class T>
__device__ __forceinline__ bool store_piece(const float (&o)[T::kHeadDim / 2], const float (&row_max)[2],
                                            const float (&row_sum)[2], const FwdParams& p, const Tile& tile,
                                            int consumer_wg) {
  constexpr int kChunks = T::kHeadDim / 8;  // float4s of O a thread
  const int thread = threadIdx.x % 128;
  TailPiece piece;
  tail_piece_of(tile.tail_task, p, piece);
  float4* mine = p.tail_o + ((int64_t(piece.first) + piece.piece) * T::kConsumerWarpgroups + consumer_wg) * kChunks * 128;
#pragma unroll
  for (int n = 0; n < kChunks; ++n)
    mine[n * 128 + thread] = make_float4(o[4 * n], o[4 * n + 1], o[4 * n + 2], o[4 * n + 3]);
  p.tail_ml[(int64_t(piece.first + piece.piece) * T::kConsumerWarpgroups + consumer_wg) * 128 + thread] =
      make_float4(row_max[0], row_max[1], row_sum[0], row_sum[1]);
  __threadfence();
  const int barrier = kEpilogueBarrier + consumer_wg;
  named_barrier_sync(barrier, 128);
  int32_t* done = p.tail_done + piece.task * T::kConsumerWarpgroups + consumer_wg;
  if (!named_barrier_or(barrier, 128, thread == 0 && atomicAdd(done, 1) == piece.pieces - 1)) return false;
  __threadfence();
  return true;
}

// The split tile's pieces of this warpgroup's rows, read back in piece order (the same sums whichever
// piece finished last) and merged as the online softmax merges key blocks,
//   M = max_j m_j,   O = sum_j 2^(m_j - M) O_j,   l = sum_j 2^(m_j - M) l_j,
// then stored as a whole tile's (store_tile). Unrolled: a piece's 16-32 loads in flight at once.
template <class T>
__device__ __forceinline__ void merge_pieces(const FwdParams& p, const Tile& tile, int consumer_wg) {
  constexpr int kChunks = T::kHeadDim / 8;
  constexpr int kWarpgroups = T::kConsumerWarpgroups;
  const int thread = threadIdx.x % 128;
  TailPiece piece;
  tail_piece_of(tile.tail_task, p, piece);
  const int64_t first = int64_t(piece.first) * kWarpgroups + consumer_wg;  // the tile's piece 0
  auto o_of = [&](int j) { return p.tail_o + (first + j * kWarpgroups) * kChunks * 128 + thread; };
  auto ml_of = [&](int j) { return p.tail_ml + (first + j * kWarpgroups) * 128 + thread; };
  float4 ml[kMaxTailPieces];
  float m[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kMaxTailPieces; ++j) {
    if (j == piece.pieces) break;
    ml[j] = __ldcg(ml_of(j));
    m[0] = fmaxf(m[0], ml[j].x), m[1] = fmaxf(m[1], ml[j].y);
  }
  float o[T::kHeadDim / 2], l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kChunks * 4; ++i) o[i] = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxTailPieces; ++j) {
    if (j == piece.pieces) break;
    // A piece with no visible key in a row (m_j = -inf) adds nothing.
    const float c0 = ml[j].x == -INFINITY ? 0.f : fast_exp2(ml[j].x - m[0]);
    const float c1 = ml[j].y == -INFINITY ? 0.f : fast_exp2(ml[j].y - m[1]);
    l[0] = fmaf(ml[j].z, c0, l[0]), l[1] = fmaf(ml[j].w, c1, l[1]);
    const float4* part = o_of(j);
#pragma unroll
    for (int n = 0; n < kChunks; ++n) {  // o[4 n + 2 i + e] belongs to row i
      const float4 v = __ldcg(part + n * 128);
      o[4 * n] = fmaf(v.x, c0, o[4 * n]), o[4 * n + 1] = fmaf(v.y, c0, o[4 * n + 1]);
      o[4 * n + 2] = fmaf(v.z, c1, o[4 * n + 2]), o[4 * n + 3] = fmaf(v.w, c1, o[4 * n + 3]);
    }
  }
  float inv[2];
  inverse_row_sums(l, inv);
  store_tile<T>(o, m, l, inv, p, tile, consumer_wg);
}

// O of this warpgroup's 64 rows into `q_tile` (the tile's q buffer: panels of 64 columns by
// block_m rows of 128 bytes, 16-byte chunks swizzled with the row as TMA writes them, so both
// the stmatrix rows and the row reads below are free of bank conflicts), then to global memory:
//   fixed-length batches: one TMA store per panel (rows past seqlen_q are outside the tensor map
//     and not written), issued by the warpgroup's first thread; returns true: the buffer is still
//     being read, and that thread releases it (release_staged_q) once the store has read it;
//   varlen (a tile may overhang the next sequence's rows), or rows before the first: rows of
//     16-byte chunks, rows outside the sequence predicated off, then one arrival on `q_empty`;
//     returns false.
template <class T>
__device__ __forceinline__ bool store_tile_staged(const float (&o)[T::kHeadDim / 2], const float (&row_max)[2],
                                                  const float (&row_sum)[2], const float (&inv)[2],
                                                  const FwdParams& p, const CUtensorMap* map_o, const Tile& tile,
                                                  int consumer_wg, uint8_t* q_tile, uint64_t* q_empty,
                                                  [[maybe_unused]] int trace_count = 0) {
  constexpr int kChunks = T::kHeadDim / 8;  // 16-byte chunks of a row
  const int thread = threadIdx.x % 128, lane = threadIdx.x % 32, warp = thread / 32;
  const uint32_t base = smem_addr(q_tile) + consumer_wg * 64 * 128;
  auto chunk_addr = [&](int r, int c) { return swizzled_chunk(base, T::kQPanelBytes, r, c); };  // r: of the warpgroup
  stmatrix_o<T, kChunks>(o, inv, 0, [&](int r, int c) { return chunk_addr(16 * warp + r, c); });
  const int32_t row_wg = tile.row0 + 64 * consumer_wg;  // first row of the warpgroup
  // A TMA store whose box starts at a negative row faults (illegal instruction on the H100), unlike
  // a load: a causal tile that overhangs row 0 takes the 16-byte stores. Decided per tile, not per
  // warpgroup: a choice ptxas cannot prove uniform made it wrap the whole persistent loop's wgmma
  // and barriers for divergence (5-8% slower, also where no tile overhangs).
  const bool tma = FLASHATTN_SM90_TMA_STORE && !p.cu_seqlens_q && tile.row0 >= 0;
  if (tma) fence_proxy_async_shared();  // the stmatrix writes before the TMA unit reads them
  named_barrier_sync(kEpilogueBarrier + consumer_wg, 128);
  SM90_TRACE(p, consumer_wg, trace_count, 9);

  if (tma) {
    if (thread == 0) {
#pragma unroll
      for (int c = 0; c < T::kPanels; ++c)
        if (stores_column<T>(64 * c, p))
          tma_store_4d(map_o, q_tile + c * T::kQPanelBytes + consumer_wg * 64 * 128, 64 * c, row_wg, tile.head,
                       tile.batch);
      bulk_commit_group();
    }
  } else {
    const int64_t batch_offset = p.cu_seqlens_q ? 0 : int64_t(tile.batch) * p.o_batch_stride;
    uint16_t* out = static_cast<uint16_t*>(p.o) + batch_offset + (tile.q_start + row_wg) * p.o_row_stride +
                    int64_t(tile.head) * p.o_head_stride;
#pragma unroll
    for (int it = 0; it < 64 * kChunks / 128; ++it) {
      const int idx = it * 128 + thread, r = idx / kChunks, c = idx % kChunks;
      const uint4 v = ld_shared_v4(chunk_addr(r, c));
      if (row_in_sequence(tile, row_wg + r) && stores_column<T>(8 * c, p))
        st_global_v4(out + r * p.o_row_stride + 8 * c, v);
    }
    SM90_TRACE(p, consumer_wg, trace_count, 10);
    fence_proxy_async_shared();  // the reads above before the TMA write that refills the buffer
    named_barrier_sync(kEpilogueBarrier + consumer_wg, 128);
    SM90_TRACE(p, consumer_wg, trace_count, 12);
    if (thread == 0) mbar_arrive(q_empty);
  }
  store_lse<T>(row_max, row_sum, p, tile, row_wg + 16 * warp + lane / 4);
  return tma;
}

// After store_tile_staged returned true: once the warpgroup's TMA stores have read the q buffer,
// the producer may refill it (the warpgroup's first thread, which issued them).
__device__ __forceinline__ void release_staged_q(uint64_t* q_empty) {
  if (threadIdx.x % 128 == 0) {
    bulk_wait_group_0<true>();
    mbar_arrive(q_empty);
  }
}

}  // namespace flashattn::cuda::sm90
