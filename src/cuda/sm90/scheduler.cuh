// Persistent tile scheduler: the grid is one CTA per SM (at head_dim 128 and 256 often fewer, for full or
// whole rounds: launch_template.cuh); in round r the CTAs take tiles r * grid ... r * grid + grid - 1, CTA c the c-th
// of them in even rounds and the c-th from the end in odd rounds (a snake draft). With the tiles
// sorted longest first (causal) this evens out the work per CTA: plain round-robin gives CTA 0 the
// longest tile of every round when the number of m_blocks is close to the grid size (1.8x the mean
// at seqlen 16k). The host turns it on per problem (FwdParams::snake_order).
//
// A tile is (m_block, batch, head); a task is a tile, or a piece of one of the last round's split
// tiles (FwdParams::tail_begin: those run last, two rounds). Tiles are grouped in sections of heads_per_section
// (batch, head) pairs whose k and v fit in L2 together; inside a section the m_block index is the
// outer loop so that the CTAs running at once read the same few heads' k, v (the host cuts the
// sections to about one round of tiles where that measured faster: launch_template.cuh). With
// causal masking the m_blocks run from the last (the longest: it sees the most keys) to the
// first, so the short tiles fill the tail.
#pragma once

#include "common/mask.hpp"
#include "common/tile_geometry.hpp"
#include "cuda/sm90/params.cuh"

namespace flashattn::cuda::sm90 {

// Whether q row `row` of the tile's sequence exists (rows < 0: a causal tile's overhang, rows >=
// seqlen_q: past the end); only those are stored.
__device__ __forceinline__ bool row_in_sequence(const Tile& tile, int32_t row) {
  return uint32_t(row) < uint32_t(tile.seqlen_q);
}

// kSplit: the kernel runs split tiles (Traits::kTailSplit); without, the code is as before the split.
// The task of this CTA in round r (>= num_tasks: none in this round). The split tail's two rounds go
// straight, so that CTA c runs both pieces of segment c.
template <bool kSplit>
__device__ __forceinline__ int32_t tile_of_round(int32_t r, const FwdParams& p) {
  const bool reverse = p.snake_order && (r & 1) && !(kSplit && r * int32_t(gridDim.x) >= p.tail_begin);
  const int32_t c = reverse ? int32_t(gridDim.x) - 1 - int32_t(blockIdx.x) : int32_t(blockIdx.x);
  return r * int32_t(gridDim.x) + c;
}

// The piece that tail task j runs (j: the task's index past tail_begin, < 2 grid): piece j / grid of
// segment j mod grid (common/last_round_split.hpp); false: none (past the segments, or a segment
// inside one tile has no piece 1).
__device__ __forceinline__ bool tail_piece_of(int32_t j, const FwdParams& p, TailPiece& piece) {
  const int32_t sub = j >= int32_t(gridDim.x) ? 1 : 0;
  const int32_t c = j - sub * int32_t(gridDim.x);
  return c < p.tail.segments && tail_piece(p.tail, c, sub, piece);
}

template <bool kSplit>
__device__ __forceinline__ Tile decode_tile(int32_t t, const FwdParams& p) {
  Tile tile;
  tile.tail_task = -1;
  if (kSplit && t >= p.tail_begin) {  // a piece of split tile tail_begin + piece.task
    TailPiece piece;
    tile.valid = tail_piece_of(t - p.tail_begin, p, piece);
    if (!tile.valid) return tile;
    tile.tail_task = t - p.tail_begin;
    t = p.tail_begin + piece.task;
  }
  const int32_t num_bh = p.batch * p.num_heads;
  const int32_t section = p.section_tiles_div.div(t);
  const int32_t first_bh = section * p.heads_per_section;
  const int32_t r = t - section * int32_t(p.section_tiles_div.divisor);
  // The last section may hold fewer heads.
  const FastDivmod& section_bh = first_bh + p.heads_per_section > num_bh ? p.last_section_heads_div : p.section_heads_div;
  const int32_t m_index = section_bh.div(r);
  const int32_t bh = first_bh + r - m_index * int32_t(section_bh.divisor);

  tile.m_block = p.causal ? p.num_m_blocks - 1 - m_index : m_index;
  tile.batch = p.num_heads_div.div(bh);
  tile.head = bh - tile.batch * p.num_heads;
  if (p.cu_seqlens_q) {
    const int32_t q0 = p.cu_seqlens_q[tile.batch], k0 = p.cu_seqlens_k[tile.batch];
    tile.q_start = q0;
    tile.k_start = k0;
    tile.seqlen_q = p.cu_seqlens_q[tile.batch + 1] - q0;
    tile.seqlen_k = p.cu_seqlens_k[tile.batch + 1] - k0;
  } else {
    tile.q_start = tile.k_start = 0;
    tile.seqlen_q = p.seqlen_q;
    tile.seqlen_k = p.seqlen_k;
  }
  tile.row0 = tile.m_block * p.block_m - p.row_shift;
  tile.valid = int64_t(tile.m_block) * p.block_m < tile.seqlen_q;
  return tile;
}

// This CTA's next tile from round r on (tiles past a shorter varlen sequence's end are skipped);
// false when none is left. r moves past the tile's round.
template <bool kSplit>
__device__ __forceinline__ bool next_tile(int32_t& r, const FwdParams& p, Tile& tile) {
  const int32_t num_tasks = kSplit ? p.num_tasks : p.num_tiles;
  for (; r * int32_t(gridDim.x) < num_tasks; ++r) {
    const int32_t t = tile_of_round<kSplit>(r, p);
    if (t >= num_tasks) continue;
    tile = decode_tile<kSplit>(t, p);
    if (tile.valid) {
      ++r;
      return true;
    }
  }
  return false;
}

// The keys [begin, end) that every row of the tile (its rows in the sequence) sees.
template <int kBlockM>
__device__ __forceinline__ void tile_inner_keys(const Tile& tile, const Mask& mask, int64_t& begin, int64_t& end) {
  const int64_t tile_row0 = max(tile.row0, 0);
  const int64_t tile_row1 = min(int64_t(tile.row0) + kBlockM, int64_t(tile.seqlen_q)) - 1;
  begin = mask.key_begin(tile_row1);
  end = mask.key_end(tile_row0);
}

// The key blocks [n_begin, n_end) a tile visits (common/tile_geometry.hpp, shared with the host's choices).
// A piece of a split tile runs its part of them (split tiles visit all their key blocks: no mask).
template <int kBlockM, int kBlockN, bool kSplit>
__device__ __forceinline__ void key_block_range(const Tile& tile, const Mask& mask, const FwdParams& p,
                                                int32_t& n_begin, int32_t& n_end) {
  flashattn::key_block_range<kBlockM, kBlockN>(tile.row0, mask, n_begin, n_end);
  if (kSplit && tile.tail_task >= 0) {
    TailPiece piece;
    tail_piece_of(tile.tail_task, p, piece);
    n_end = n_begin + piece.end;
    n_begin += piece.begin;
  }
}

}  // namespace flashattn::cuda::sm90
