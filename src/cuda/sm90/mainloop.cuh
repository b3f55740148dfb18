// The pipeline of one tile: a producer thread loads q once and k, v block by block through TMA
// into a ring of stages; two consumer warpgroups (64 rows of q each) compute S = q k^T and
// O += P v with wgmma, the online softmax between the two in registers.
//
//   producer:  q | k0 v0 | k1 v1 | k2 v2 ...          (waits on *_empty, arms *_full with bytes)
//   consumer:  issue S(n) and O += P(n+1) v(n+1) -> wait S(n), free k -> softmax(n)
//              -> wait O, free v -> rescale O, P(n) to registers -> issue S(n-1), O += P(n) v(n) ...
// With Traits::kRescaleEarly the rescale of O moves between the issue of S(n-1) and that of
// O += P(n) v(n), off the path from the wait for O to the next issue. With Traits::kSerial (3
// consumer warpgroups) each warpgroup runs O += P(n+1) v(n+1), S(n) and softmax(n) in turn, and
// the other two warpgroups' GEMMs keep the tensor cores busy meanwhile.
//
// Key blocks run from the last to the first, so the blocks that need element masking (the
// diagonal for causal, the end of the sequence) come first; causal with the optimistic softmax from
// the first up, the first block then a full one (KeyOrder, Traits::kKeysForward).
//
// Two consumer loops: run_tile (one tile, the kernel then stores it) and, with
// Traits::kTileOverlap, run (all tiles of the CTA as one stream of key blocks: the software
// pipeline above goes on across tile boundaries, the epilogue inside it).
#pragma once

#include <cuda.h>

#include "common/mask.hpp"
#include "cuda/common.cuh"
#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/params.cuh"
#include "cuda/sm90/primitives.cuh"
#include "cuda/sm90/scheduler.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashattn::cuda::sm90 {

// Pipeline position shared by producer and consumers: stage of the ring and the parity of its lap.
template <int kStages>
struct PipelineState {
  int32_t index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1;
    }
  }
};

template <class T>
__device__ __forceinline__ Mask tile_mask(const Tile& tile, const FwdParams& p) {
  return Mask(tile.seqlen_q, tile.seqlen_k, p.causal != 0, p.window_left, p.window_right);
}

// The key block a tile loads and computes at step i, producer and consumers alike: the steps count down
// from n_end - 1 to n_begin; the blocks with them, or with Traits::kKeysForward the other way, ascending.
template <class T>
struct KeyOrder {
  int32_t n_begin, n_end;
  __device__ __forceinline__ int32_t block(int32_t i) const { return T::kKeysForward ? n_begin + n_end - 1 - i : i; }
};

// A tile's plan (TilePlan): the tile and its key blocks.
template <class T>
__device__ __forceinline__ void plan_tile(const Tile& tile, const FwdParams& p, TilePlan& plan) {
  plan.tile = tile;
  const Mask mask = tile_mask<T>(tile, p);
  key_block_range<T::kBlockM, T::kBlockN, T::kTailSplit>(tile, mask, p, plan.n_begin, plan.n_end);
  tile_inner_keys<T::kBlockM>(tile, mask, plan.inner_begin, plan.inner_end);
}

// A consumer warpgroup's next tile (false: none is left). Traits::kPublishedTiles: the producer's plan,
// which comes with the tile's q (this waits for both); otherwise decoded here from the schedule (round), and
// run_tile waits for q after its set-up.
template <class T>
__device__ __forceinline__ bool consumer_next_tile(SharedStorage<T>& smem, const FwdParams& p,
                                                   const PipelineState<T::kQStages>& q_pipe, int32_t& round,
                                                   TilePlan& plan) {
  if constexpr (T::kPublishedTiles) {
    mbar_wait(&smem.q_full[q_pipe.index], q_pipe.phase);
    if constexpr (T::kPlanByLds) {
      plan = ld_shared_copy(smem.plan[q_pipe.index]);
    } else {
      plan = smem.plan[q_pipe.index];
    }
    // The producer rewrites the plan once the warpgroup's first thread has released the q buffer, after the
    // epilogue's barrier (Traits::kPublishedTiles). racecheck's build: every other reader arrives too.
    if (FLASHATTN_SM90_PLAN_RELEASE_EVERY && threadIdx.x % 128 != 0) mbar_arrive(&smem.q_empty[q_pipe.index]);
    return plan.tile.valid;
  } else {
    if (!next_tile<T::kTailSplit>(round, p, plan.tile)) return false;
    plan_tile<T>(plan.tile, p, plan);
    return true;
  }
}

// Producer -------------------------------------------------------------------------------------

template <class T>
struct Producer {
  // One block of rows (q, k or v) as kPanels boxes of 64 columns into `dst`; with Traits::kL2Hints, L2
  // evict_last for k and v (`reused` by the head's other tiles), evict_first for q.
  __device__ __forceinline__ static void load_panels(const CUtensorMap* map, uint64_t* bar, uint8_t* dst,
                                                     int panel_bytes, int32_t row, int32_t head, int32_t batch,
                                                     bool reused) {
#pragma unroll
    for (int c = 0; c < T::kPanels; ++c) {
      if constexpr (T::kL2Hints) {
        tma_load_4d(map, bar, dst + c * panel_bytes, 64 * c, row, head, batch, reused ? l2_evict_last() : l2_evict_first());
      } else {
        tma_load_4d(map, bar, dst + c * panel_bytes, 64 * c, row, head, batch);
      }
    }
  }

  // One thread: the schedule's tiles in turn (next_tile), each one's plan published with its q (TilePlan).
  // k, v of head `head_kv` of the tile's sequence; TMA zero-fills rows past the
  // tensor's end, and rows of the next varlen sequence are masked by index in the softmax.
  // With two q buffers the next tile's q is loaded as soon as its buffer is free (the consumers
  // release it at the end of the tile before this one): the waits for this tile's k, v stages
  // poll for it (not in the tiles Traits::kQAfterKVTo names: they load it after their k, v). Only
  // after this tile's loads are all issued does the loop block on it, so the consumers are never
  // kept waiting for k or v.
  __device__ static void run(const CUtensorMap* map_q, const CUtensorMap* map_k, const CUtensorMap* map_v,
                             SharedStorage<T>& smem, const FwdParams& p) {
    PipelineState<T::kStages> pipe;
    PipelineState<T::kQStages> q_pipe;
    int32_t round = 0;
    Tile tile, next;
    [[maybe_unused]] int trace_count = 0;
    [[maybe_unused]] int planned_qs = 0;  // the q buffer of the last plan published (the loop's tile at its top)
    // q of a tile, with its plan published before the arrival the consumers wait for (Traits::kPublishedTiles;
    // written in place: the producer's 24 registers hold no second copy).
    auto load_q = [&](const Tile& t) {
      const int qs = q_pipe.index;
      SM90_WATCH(kTraceProducer, t.m_block, t.batch * 100 + t.head, -1, trace_count);
      mbar_wait(&smem.q_empty[qs], q_pipe.phase ^ 1);
      if constexpr (T::kPublishedTiles) {
        plan_tile<T>(t, p, smem.plan[qs]);
        planned_qs = qs;
      }
      mbar_arrive_expect_tx(&smem.q_full[qs], T::kQBytes);
      const int32_t q_row = int32_t(t.q_start) + t.row0;  // may be < 0: TMA fills zeros
      const int32_t batch_coord = p.cu_seqlens_q ? 0 : t.batch;
      load_panels(map_q, &smem.q_full[qs], smem.q[qs], T::kQPanelBytes, q_row, t.head, batch_coord, false);
      q_pipe.advance();
    };
    bool have = next_tile<T::kTailSplit>(round, p, tile);
    if (have) load_q(tile);
    while (have) {
      SM90_TRACE(p, kTraceProducer, trace_count, 0);
      const bool have_next = next_tile<T::kTailSplit>(round, p, next);
      bool next_q_pending = have_next;
      const int32_t batch_coord = p.cu_seqlens_q ? 0 : tile.batch;
      const int32_t head_kv = tile.head / p.heads_per_kv_head;
      // The tile's key blocks: from its published plan (in its q buffer until the tile after next loads q), or
      // from the mask.
      int32_t n_begin, n_end;
      if constexpr (T::kPublishedTiles) {
        n_begin = smem.plan[planned_qs].n_begin;
        n_end = smem.plan[planned_qs].n_end;
      } else {
        key_block_range<T::kBlockM, T::kBlockN, T::kTailSplit>(tile, tile_mask<T>(tile, p), p, n_begin, n_end);
      }

      // A tile of Traits::kQAfterKVFrom to kQAfterKVTo key blocks loads the next q after its k, v: no polling for it here.
      const bool q_after_kv =
          T::kQAfterKVTo > 0 && n_end - n_begin >= T::kQAfterKVFrom && n_end - n_begin <= T::kQAfterKVTo;
      auto wait_stage = [&](uint64_t* empty, uint32_t parity) {
        if (T::kQStages == 2 && next_q_pending && !q_after_kv) {
          while (!mbar_test_wait(empty, parity)) {
            if (mbar_test_wait(&smem.q_empty[q_pipe.index], q_pipe.phase ^ 1)) {
              SM90_TRACE(p, kTraceProducer, trace_count, 2);
              load_q(next);
              next_q_pending = false;
              break;
            }
          }
        }
        mbar_wait(empty, parity);
      };

      const KeyOrder<T> order{n_begin, n_end};
      for (int32_t i = n_end - 1; i >= n_begin; --i) {
        const int32_t n = order.block(i);
        const int32_t k_row = int32_t(tile.k_start) + n * T::kBlockN;
        const int s = pipe.index;
        SM90_WATCH(kTraceProducer, tile.m_block, tile.batch * 100 + tile.head, n, trace_count);
        wait_stage(&smem.k_empty[s], pipe.phase ^ 1);
        if (i == n_end - 1) SM90_TRACE(p, kTraceProducer, trace_count, 1);
        mbar_arrive_expect_tx(&smem.k_full[s], T::kKVBytes);
        load_panels(map_k, &smem.k_full[s], smem.k[s], T::kKVPanelBytes, k_row, head_kv, batch_coord, true);
        SM90_WATCH(kTraceProducer, tile.m_block, tile.batch * 100 + tile.head, 10000 + n, trace_count);
        wait_stage(&smem.v_empty[s], pipe.phase ^ 1);
        mbar_arrive_expect_tx(&smem.v_full[s], T::kKVBytes);
        load_panels(map_v, &smem.v_full[s], smem.v[s], T::kKVPanelBytes, k_row, head_kv, batch_coord, true);
        pipe.advance();
      }
      SM90_TRACE(p, kTraceProducer, trace_count, 3);
      if (next_q_pending) load_q(next);
      ++trace_count;
      tile = next;
      have = have_next;
    }
    // No tile is left: a plan marked so, in the next q buffer once it is free, ends the consumers' loops
    // (consumer_next_tile).
    if constexpr (T::kPublishedTiles) {
      const int qs = q_pipe.index;
      mbar_wait(&smem.q_empty[qs], q_pipe.phase ^ 1);
      smem.plan[qs].tile.valid = false;
      mbar_arrive(&smem.q_full[qs]);
    }
  }
};

// Consumer -------------------------------------------------------------------------------------

// Ping-pong between the two consumer warpgroups: each issues its GEMMs only in its turn (named
// barrier kPingPongBarrier + wg), then hands the turn to the other, so one warpgroup's softmax
// runs while the other's GEMMs hold the tensor cores.
constexpr int kPingPongBarrier = 1;  // ids 1 and 2; 0 is __syncthreads

template <class T>
__device__ __forceinline__ void pingpong_wait(int consumer_wg) {
  if constexpr (T::kPingPong) named_barrier_sync(kPingPongBarrier + consumer_wg, 256);
}
template <class T>
__device__ __forceinline__ void pingpong_pass(int consumer_wg) {
  if constexpr (T::kPingPong) named_barrier_arrive(kPingPongBarrier + (consumer_wg ^ 1), 256);
}

// What the stream needs of one tile: the tile itself (for the epilogue), its key blocks and the
// blocks [plain_begin, plain_end) that need no mask (the rows' key ranges are recomputed in the
// rare blocks that do: fewer registers live across the loop).
struct TileWork {
  Tile tile;
  int32_t n_begin, n_end;
  int32_t plain_begin, plain_end;
  __device__ __forceinline__ bool needs_mask(int32_t n) const { return n < plain_begin || n >= plain_end; }
};

// One consumer warpgroup's 64 rows. Accumulator layout of wgmma m64nN (per thread, warp w of
// the warpgroup, lane l): element [4 * n + 2 * i + j] is row 16 w + l / 4 + 8 i, column
// 8 n + 2 (l % 4) + j. The same layout holds S (N = block_n) and O (N = head_dim).
template <class T>
struct Consumer {
  static constexpr int kN = T::kBlockN, kD = T::kHeadDim;
  using Mma = Wgmma<kN, T::kBf16>;
  using MmaO = Wgmma<kD, T::kBf16>;

  float o[kD / 2];
  float row_max[2];  // running max of the row's scores, log2 domain
  float row_sum[2];  // this thread's part of the running sum of exp2(score - row_max)
  float row_inv[2];  // Traits::kInverseEarly: 1 / the row's full sum (inverse_row_sums), from run_tile for the epilogue
  int trace_count = 0;  // FLASHATTN_SM90_TRACE: tiles so far

  // Issues S = q k^T for this warpgroup's 64 rows: q (64, head_dim) and k (block_n, head_dim),
  // both K-major in shared memory.
  __device__ __forceinline__ static void issue_qk(float (&s)[kN / 2], const uint8_t* q_rows, const uint8_t* k) {
    const SmemDesc dq = kmajor_desc(smem_addr(q_rows)), dk = kmajor_desc(smem_addr(k));
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;  // k16 step inside a 64-column panel
      Mma::template ss<0>(s, dq.at((kk / 4) * T::kQPanelBytes + off), dk.at((kk / 4) * T::kKVPanelBytes + off), kk > 0);
    }
    wgmma_commit();
  }

  // The same with q from registers (the A-operand layout, load_q_fragments).
  __device__ __forceinline__ static void issue_qk(float (&s)[kN / 2], const uint32_t (&qa)[kD / 16][4],
                                                  const uint8_t* k) {
    const SmemDesc dk = kmajor_desc(smem_addr(k));
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      Mma::template rs<0>(s, qa[kk], dk.at((kk / 4) * T::kKVPanelBytes + (kk % 4) * 32), kk > 0);
    wgmma_commit();
  }

  // This warp's 16 rows of the warpgroup's q (64 rows at q_rows, TMA's 128-byte swizzle: the
  // 16-byte chunk c of row r sits at chunk c ^ (r % 8)) in the A-operand layout, per k16 step:
  // ldmatrix x4, lanes 0-15 address rows 0-15 of the step's first 8 columns, lanes 16-31 the next 8.
  __device__ __forceinline__ static void load_q_fragments(uint32_t (&qa)[kD / 16][4], const uint8_t* q_rows) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    const int row = 16 * warp + lane % 16;
    const uint32_t q_addr = smem_addr(q_rows);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int chunk = 2 * (kk % 4) + lane / 16;
      ldmatrix_x4(swizzled_chunk(q_addr, T::kQPanelBytes, row, 8 * (kk / 4) + chunk), qa[kk]);
    }
  }

  // Issues O += P v: P (64, block_n) from registers as the A operand, v (block_n, head_dim)
  // MN-major in shared memory. accumulate = 0: O = P v (O's old contents are ignored).
  __device__ __forceinline__ void issue_pv(const uint32_t (&p)[kN / 16][4], const uint8_t* v, int accumulate = 1) {
    const SmemDesc dv = mnmajor_desc(smem_addr(v), T::kKVPanelBytes);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) MmaO::template rs<1>(o, p[kk], dv.at(kk * 16 * 128), kk > 0 ? 1 : accumulate);
    wgmma_commit();
  }

  // Softcap (when on) and the mask by index where the block needs it (-inf: no weight). Both are
  // rare: the branches stay outside the element loops so the common path pays nothing.
  __device__ __forceinline__ static void mask_scores(float (&s)[kN / 2], const FwdParams& p, int32_t key0,
                                                     const int32_t (&key_begin)[2], const int32_t (&key_end)[2],
                                                     bool need_mask) {
    if (p.has_softcap) {
#pragma unroll
      for (int e = 0; e < kN / 2; ++e) s[e] = p.softcap * softcap_tanh(s[e] * p.softcap_pre);
    }
    if (need_mask) {
      // Bounds relative to the thread's first key, so each element compares its compile-time
      // column 8 n + j: one test and a select where no window's left edge falls in the block
      // (causal alone, the end of the sequence), two where one does.
      const int32_t key_lane = key0 + 2 * (threadIdx.x % 4);
      int32_t lo[2], hi[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        lo[i] = key_begin[i] - key_lane;
        hi[i] = key_end[i] - key_lane;
      }
      if (__any_sync(0xffffffffu, lo[0] > 0 || lo[1] > 0)) {
        mask_columns<true>(s, lo, hi);
      } else {
        mask_columns<false>(s, lo, hi);
      }
    }
  }

  // -inf where column c = 8 n + j of the thread's row i lies outside [lo[i], hi[i]) (kLeft) or
  // at or past hi[i].
  template <bool kLeft>
  __device__ __forceinline__ static void mask_columns(float (&s)[kN / 2], const int32_t (&lo)[2],
                                                      const int32_t (&hi)[2]) {
#pragma unroll
    for (int n = 0; n < kN / 8; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int32_t c = 8 * n + j;
          if ((kLeft && c < lo[i]) || c >= hi[i]) s[4 * n + 2 * i + j] = -INFINITY;
        }
  }

  // ALiBi (Traits::kAlibi): s -= slope * |diagonal(row) - key| after the softcap (a masked -inf stays
  // -inf), the slope in the scores' units (the softmax multiplies s by score_scale_log2, the bias is in
  // units of the scaled scores). Per thread and tile: the slope, and its two rows' diagonals less its
  // first key column (2 (thread % 4)); per block an element's distance is then a compile-time step.
  struct AlibiRows {
    float slope;
    float diagonal[2];
  };
  __device__ __forceinline__ static AlibiRows alibi_rows(const Tile& tile, const FwdParams& p, int32_t row0) {
    constexpr float kLog2e = 1.4426950408889634f;
    AlibiRows a;
    a.slope = p.alibi_slopes[tile.batch * p.alibi_slopes_batch_stride + tile.head] * kLog2e / p.score_scale_log2;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      a.diagonal[i] = float(row0 + 8 * i + tile.seqlen_k - tile.seqlen_q - 2 * int32_t(threadIdx.x % 4));
    return a;
  }
  __device__ __forceinline__ static void alibi_scores(float (&s)[kN / 2], const AlibiRows& a, int32_t key0) {
    const float d[2] = {a.diagonal[0] - float(key0), a.diagonal[1] - float(key0)};
#pragma unroll
    for (int n = 0; n < kN / 8; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) s[4 * n + 2 * i + j] -= a.slope * fabsf(d[i] - float(8 * n + j));
  }

  // Dropout (Traits::kDropout): P's dropped elements zeroed once the softmax has summed them all (O = (Z P / l)
  // V: the row sums are of P, the scale 1 / (1 - p) comes with 1 / l in the epilogue). s[8 kt + e] (rows g, g + 8,
  // keys 16 kt + 8 (e / 4) + 2 t + e % 2) is number e of this lane's call in 16 x 16 tile kt, the layout of
  // common/dropout.hpp (the accumulator is mma.sync's): one Philox call a tile. i16: the warp's row tile.
  __device__ __forceinline__ static void dropout_scores(float (&s)[kN / 2], const DropoutMask& d, int32_t bh, int32_t i16,
                                                        int32_t key0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kt = 0; kt < kN / 16; ++kt) {
      const uint32_t keep = d.keep_bits(bh, i16, key0 / 16 + kt, lane);
#pragma unroll
      for (int e = 0; e < 8; ++e) s[8 * kt + e] = (keep >> e) & 1u ? s[8 * kt + e] : 0.f;
    }
  }

  // mask_scores with this thread's two rows' key ranges computed from the tile.
  __device__ __forceinline__ static void mask_block(float (&s)[kN / 2], const FwdParams& p, const TileWork& w,
                                                    int32_t n, int consumer_wg) {
    int32_t key_begin[2] = {0, 0}, key_end[2] = {0, 0};
    const bool need_mask = w.needs_mask(n);
    if (need_mask) {
      const Mask mask = tile_mask<T>(w.tile, p);
      const int thread = threadIdx.x % 128, lane = threadIdx.x % 32;
      const int32_t row0 = w.tile.row0 + 64 * consumer_wg + 16 * (thread / 32) + lane / 4;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        key_begin[i] = int32_t(mask.key_begin(row0 + 8 * i));
        key_end[i] = int32_t(mask.key_end(row0 + 8 * i));
      }
    }
    mask_scores(s, p, n * kN, key_begin, key_end, need_mask);
  }

  // Online softmax of one block: new running max (log2 domain), P = exp2(s * scale - max) in
  // place (exp2_rows), the sums rescaled. corr rescales O. The row max and row sum run in kChains
  // independent chains: one serial chain of kN / 4 dependent instructions would sit on the
  // critical path between the two GEMMs. The running max moves only past kMaxSlack
  // (cuda/common.cuh): corr is 1 (rescale_o skips) for all but the rare blocks that raise a row's
  // max that much.
  __device__ __forceinline__ void online_softmax(float (&s)[kN / 2], float score_scale, float (&corr)[2]) {
    constexpr int kChains = (kN / 8) % 4 == 0 ? 4 : 2;
    float m_part[2][kChains];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < kChains; ++c) m_part[i][c] = fmaxf(s[4 * c + 2 * i], s[4 * c + 2 * i + 1]);
#pragma unroll
    for (int n = kChains; n < kN / 8; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        m_part[i][n % kChains] = fmaxf(m_part[i][n % kChains], fmaxf(s[4 * n + 2 * i], s[4 * n + 2 * i + 1]));
    float m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float m = m_part[i][0];
#pragma unroll
      for (int c = 1; c < kChains; ++c) m = fmaxf(m, m_part[i][c]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      float m_new = fmaxf(row_max[i], m * score_scale);
      if (!(m_new > row_max[i] + kMaxSlack)) m_new = row_max[i];
      m_use[i] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet: keep p = 0
      corr[i] = fast_exp2(row_max[i] - m_use[i]);
      row_max[i] = m_new;
    }
    float sum[2];
    exp2_rows(s, score_scale, m_use, sum);
#pragma unroll
    for (int i = 0; i < 2; ++i) row_sum[i] = fmaf(row_sum[i], corr[i], sum[i]);
  }

  // P = exp2(s * scale - m) in place with one FFMA and one EX2 an element, and the sums of this thread's
  // elements of each row (in kChains chains, added at the end).
  __device__ __forceinline__ static void exp2_rows(float (&s)[kN / 2], float score_scale, const float (&m)[2],
                                                   float (&sum)[2]) {
    constexpr int kChains = (kN / 8) % 4 == 0 ? 4 : 2;
    float sum_part[2][kChains] = {};
#pragma unroll
    for (int n = 0; n < kN / 8; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float e = fast_exp2(fmaf(s[4 * n + 2 * i + j], score_scale, -m[i]));
          s[4 * n + 2 * i + j] = e;
          sum_part[i][n % kChains] += e;
        }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      sum[i] = sum_part[i][0];
#pragma unroll
      for (int c = 1; c < kChains; ++c) sum[i] += sum_part[i][c];
    }
  }

  // The softmax of a block after the row maxima are known, without the block's max: P = exp2(s * scale -
  // row_max) in place and the sums. Where every element stays under 2^kMaxSlack the running max would not
  // have moved (online_softmax: the same P and corr = 1, but for rounding right at the slack's edge, where
  // either is valid), so the block is done; a thread's partial sum over its elements bounds each of them.
  // Otherwise (a row's max moves, or has none yet: -inf or NaN sums) the warpgroup, together by a named
  // barrier, returns false with s spent: the caller issues S again and runs online_softmax. Saves the max's
  // FMNMX chains and shuffles before the exp2s (a dev build without the block max, wrong where a max moves,
  // ran 9% faster at head_dim 128, 16k; docs/sm90.md, step 36).
  __device__ __forceinline__ bool optimistic_softmax(float (&s)[kN / 2], float score_scale, float (&corr)[2],
                                                     int consumer_wg) {
    float sum[2];
    exp2_rows(s, score_scale, row_max, sum);
    constexpr float kLimit = 256.f;  // 2^kMaxSlack
    static_assert(kMaxSlack == 8.f, "kLimit is 2^kMaxSlack");
    const bool moved = FLASHATTN_SM90_OPT_MAX == 2 || !(sum[0] <= kLimit) || !(sum[1] <= kLimit);
    if (named_barrier_or(kEpilogueBarrier + consumer_wg, 128, moved)) return false;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      row_sum[i] += sum[i];
      corr[i] = 1.f;
    }
    return true;
  }

  // kRescaleEarly off: runs on the critical path between the wait for O += P v and the next issue;
  // on: while the tensor cores compute S, off that path. Skipped when no row of the warp moved its
  // max (corr = 1 exactly: nearly every block after the first, with kMaxSlack).
  __device__ __forceinline__ void rescale_o(const float (&corr)[2]) {
    if (!__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) return;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        o[4 * n + 2 * i] *= corr[i];
        o[4 * n + 2 * i + 1] *= corr[i];
      }
  }

  // The rescale of O by corr of the block whose P v is issued next, placed after the issue of S
  // (the fences pin it there: O is not touched by that wgmma) and before the wgmma that reads O.
  __device__ __forceinline__ void rescale_between_issues(const float (&corr)[2]) {
    fence_registers(o);
    rescale_o(corr);
    fence_registers(o);
    wgmma_fence();
  }

  // P in the A-operand register layout of wgmma (that of mma.sync m16n8k16, per warp).
  __device__ __forceinline__ static void to_a_operand(const float (&s)[kN / 2], uint32_t (&p)[kN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      p[kk][0] = pack2(s[8 * kk + 0], s[8 * kk + 1], T::kBf16);
      p[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3], T::kBf16);
      p[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5], T::kBf16);
      p[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7], T::kBf16);
    }
  }

  // After the softmax of the block whose S just finished: waits for the O += P v issued beside that
  // S and frees its v (stage prev_stage). The softmax must stay above the wait: ptxas hoists the
  // wait over straight-line code (and the overlap is lost), but not over a loop, and the spin on
  // v_full of the current block (needed by the next O += P v anyway) is that loop.
  __device__ __forceinline__ void wait_pv_after_softmax(SharedStorage<T>& smem, float (&s)[kN / 2], float (&corr)[2],
                                                        uint32_t (&pa)[kN / 16][4],
                                                        const PipelineState<T::kStages>& pipe, int prev_stage,
                                                        bool signals) {
    fence_registers(s);
    fence_registers(row_sum);
    fence_registers(corr);
    mbar_wait(&smem.v_full[pipe.index], pipe.phase);
    wgmma_wait<0>();
    fence_registers(o);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) fence_registers(pa[kk]);  // read by the tensor cores until here
    if (signals) mbar_arrive(&smem.v_empty[prev_stage]);
  }

  // Runs the key blocks of one tile; leaves O unnormalized, row_max and the full row sums.
  // deferred_q_release >= 0: the q buffer that the tile before stored O from with TMA, freed here
  // once the store has read it.
  // Software pipelined inside the warpgroup: while the tensor cores compute S of block n and
  // O += P v of the block before it in KeyOrder (n + 1, or n - 1 ascending), the warpgroup waits only
  // for S, runs the softmax of block n, then waits for O to rescale it.
  // The tile's plan from consumer_next_tile (which waited for its q where the producer published it).
  __device__ __forceinline__ void run_tile(SharedStorage<T>& smem, const FwdParams& p, const TilePlan& plan,
                                           int consumer_wg, PipelineState<T::kStages>& pipe,
                                           PipelineState<T::kQStages>& q_pipe, int deferred_q_release) {
    const int thread = threadIdx.x % 128, lane = threadIdx.x % 32;
    const bool signals = thread == 0;  // one arrival per warpgroup on the empty barriers
    const Tile& tile = plan.tile;
    const Mask mask = tile_mask<T>(tile, p);
    const int32_t n_begin = plan.n_begin, n_end = plan.n_end;

    // The key range of this thread's two rows, and the keys every row of the tile sees (blocks
    // inside need no mask).
    const int32_t row0 = tile.row0 + 64 * consumer_wg + 16 * (thread / 32) + lane / 4;
    int32_t key_begin[2], key_end[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      key_begin[i] = int32_t(mask.key_begin(row0 + 8 * i));
      key_end[i] = int32_t(mask.key_end(row0 + 8 * i));
    }
    AlibiRows alibi{};
    if constexpr (T::kAlibi) alibi = alibi_rows(tile, p, row0);
    // Dropout: (sequence, head) and this warp's row tile (tiles start at multiples of 16 rows: no row shift).
    const int32_t drop_bh = tile.batch * p.num_heads + tile.head, drop_i16 = (row0 - lane / 4) / 16;
    const int64_t inner_begin = plan.inner_begin, inner_end = plan.inner_end;
    // The blocks plain_blocks gives, tested by key here: run_tile written with plain_blocks and
    // TileWork::needs_mask measured 2% slower at 512 keys (dev/sm90/results-h100-run18.txt, 18f).
    auto needs_mask = [&](int32_t n) {
      const int64_t key0 = int64_t(n) * kN;
      return key0 < inner_begin || key0 + kN > inner_end || key0 + kN > tile.seqlen_k;
    };

#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
    if constexpr (T::kInverseEarly) row_inv[0] = row_inv[1] = 0.f;  // a tile without a visible key: o = 0

    const int qs = q_pipe.index;
    SM90_TRACE(p, consumer_wg, trace_count, 0);
    SM90_WATCH(consumer_wg, tile.m_block, tile.batch * 100 + tile.head, -1, trace_count);
    if constexpr (!T::kPublishedTiles) mbar_wait(&smem.q_full[qs], q_pipe.phase);
    SM90_TRACE(p, consumer_wg, trace_count, 1);
    q_pipe.advance();
    // q_empty: after the last S, or (staged epilogue) once O has passed through the buffer.
    const bool release_q = signals && !T::kStagedEpilogue;
    if (n_end <= n_begin) {  // no visible key in the whole tile
      if (deferred_q_release >= 0) release_staged_q(&smem.q_empty[deferred_q_release]);
      // Elsewhere the wgmma holds the warpgroup together between the wait for q_full and the
      // release; here, without it, a warp still before its wait could see the buffer refilled
      // (q_full a phase further, same parity with one q buffer) and wait forever.
      if (!T::kStagedEpilogue) {
        named_barrier_sync(kEpilogueBarrier + consumer_wg, 128);
        if (release_q) mbar_arrive(&smem.q_empty[qs]);
      }
      return;
    }
    const uint8_t* q_rows = smem.q[qs] + consumer_wg * 64 * 128;
    float s[kN / 2];
    uint32_t pa[kN / 16][4];
    float corr[2];
    uint32_t qa[kD / 16][4];  // Traits::kQInRegisters only
    if constexpr (T::kQInRegisters) load_q_fragments(qa, q_rows);
    auto issue_s = [&](const uint8_t* k) {
      if constexpr (T::kQInRegisters) {
        issue_qk(s, qa, k);
      } else {
        issue_qk(s, q_rows, k);
      }
    };

    // The first step's block (n_end - 1, or n_begin ascending): S alone. q is released at the last step.
    const KeyOrder<T> order{n_begin, n_end};
    int32_t i = n_end - 1, n = order.block(i);
    mbar_wait(&smem.k_full[pipe.index], pipe.phase);
    SM90_TRACE(p, consumer_wg, trace_count, 2);
    pingpong_wait<T>(consumer_wg);
    wgmma_fence();
    issue_s(smem.k[pipe.index]);
    pingpong_pass<T>(consumer_wg);
    // The tile before stored O from its q buffer with TMA: free it once read, while S runs.
    if (deferred_q_release >= 0) release_staged_q(&smem.q_empty[deferred_q_release]);
    wgmma_wait<0>();
    fence_registers(s);
    SM90_TRACE(p, consumer_wg, trace_count, 3);
    if (signals) mbar_arrive(&smem.k_empty[pipe.index]);
    if (release_q && i == n_begin) mbar_arrive(&smem.q_empty[qs]);
    mask_scores(s, p, n * kN, key_begin, key_end, needs_mask(n));
    if constexpr (T::kAlibi) alibi_scores(s, alibi, n * kN);
    online_softmax(s, p.score_scale_log2, corr);
    if constexpr (T::kDropout) dropout_scores(s, p.dropout, drop_bh, drop_i16, n * kN);
    to_a_operand(s, pa);
    SM90_TRACE(p, consumer_wg, trace_count, 4);
    int prev_stage = pipe.index;
    uint32_t prev_phase = pipe.phase;
    pipe.advance();

    // Serial steady state (Traits::kSerial): O += P v of the step before alone, then S of block n
    // alone and its softmax; the other consumer warpgroups' GEMMs fill the tensor cores meanwhile.
    // Only O and S (or P) are live (64 + 64 floats a thread at head_dim 128, block_n 128): the
    // rows' key ranges are recomputed in the rare blocks that need a mask (mask_block), only the
    // range of plain blocks stays live across the loop.
    if constexpr (T::kSerial) {
      TileWork w{tile, n_begin, n_end, 0, 0};
      plain_blocks(inner_begin, inner_end, tile.seqlen_k, w);
      for (i = n_end - 2; i >= n_begin; --i) {
        n = order.block(i);
        SM90_WATCH(consumer_wg, tile.m_block, tile.batch * 100 + tile.head, n, trace_count);
        mbar_wait(&smem.v_full[prev_stage], prev_phase);
        wgmma_fence();
        issue_pv(pa, smem.v[prev_stage]);
        wgmma_wait<0>();
        fence_registers(o);
#pragma unroll
        for (int kk = 0; kk < kN / 16; ++kk) fence_registers(pa[kk]);
        if (signals) mbar_arrive(&smem.v_empty[prev_stage]);
        mbar_wait(&smem.k_full[pipe.index], pipe.phase);
        wgmma_fence();
        issue_s(smem.k[pipe.index]);
        wgmma_wait<0>();
        fence_registers(s);
        if (signals) mbar_arrive(&smem.k_empty[pipe.index]);
        if (release_q && i == n_begin) mbar_arrive(&smem.q_empty[qs]);
        mask_block(s, p, w, n, consumer_wg);
        if constexpr (T::kAlibi) alibi_scores(s, alibi, n * kN);
        online_softmax(s, p.score_scale_log2, corr);
        rescale_o(corr);
        if constexpr (T::kDropout) dropout_scores(s, p.dropout, drop_bh, drop_i16, n * kN);
        to_a_operand(s, pa);
        prev_stage = pipe.index;
        prev_phase = pipe.phase;
        pipe.advance();
      }
    } else {
      // Steady state: S of block n and O += P v of the step before in flight together.
      for (i = n_end - 2; i >= n_begin; --i) {
        n = order.block(i);
        SM90_WATCH(consumer_wg, tile.m_block, tile.batch * 100 + tile.head, n, trace_count);
        mbar_wait(&smem.k_full[pipe.index], pipe.phase);
        mbar_wait(&smem.v_full[prev_stage], prev_phase);
        pingpong_wait<T>(consumer_wg);
        wgmma_fence();
        issue_s(smem.k[pipe.index]);
        if constexpr (T::kRescaleEarly) rescale_between_issues(corr);
        issue_pv(pa, smem.v[prev_stage]);
        pingpong_pass<T>(consumer_wg);
        wgmma_wait<1>();  // S is done; O += P v may still run
        fence_registers(s);
        // k is free once S is read, or with the optimistic softmax once S is final (below); so is q, where S
        // is issued again from shared memory.
        constexpr bool kQAfterCheck = T::kOptimisticMax && !T::kQInRegisters;
        if (signals && !T::kOptimisticMax) mbar_arrive(&smem.k_empty[pipe.index]);
        if (!kQAfterCheck && release_q && i == n_begin) mbar_arrive(&smem.q_empty[qs]);
        mask_scores(s, p, n * kN, key_begin, key_end, needs_mask(n));
        if constexpr (T::kAlibi) alibi_scores(s, alibi, n * kN);
        if constexpr (T::kOptimisticMax) {
          // The rare block whose max moved issues S again (outside the ping-pong turns, which count the
          // regular issues only) and takes the full softmax.
          if (!optimistic_softmax(s, p.score_scale_log2, corr, consumer_wg)) {
            wgmma_fence();
            issue_s(smem.k[pipe.index]);
            wgmma_wait<0>();
            fence_registers(s);
            mask_scores(s, p, n * kN, key_begin, key_end, needs_mask(n));
            online_softmax(s, p.score_scale_log2, corr);
          }
        } else {
          online_softmax(s, p.score_scale_log2, corr);
        }
        if (signals && T::kOptimisticMax) mbar_arrive(&smem.k_empty[pipe.index]);
        if (kQAfterCheck && release_q && i == n_begin) mbar_arrive(&smem.q_empty[qs]);
        // Its Philox calls, too, while O += P v of the block before runs.
        if constexpr (T::kDropout) dropout_scores(s, p.dropout, drop_bh, drop_i16, n * kN);
        wait_pv_after_softmax(smem, s, corr, pa, pipe, prev_stage, signals);
        if constexpr (!T::kRescaleEarly) rescale_o(corr);
        to_a_operand(s, pa);
        prev_stage = pipe.index;
        prev_phase = pipe.phase;
        pipe.advance();
      }
    }

    // The last O += P v.
    SM90_TRACE(p, consumer_wg, trace_count, 5);
    SM90_WATCH(consumer_wg, tile.m_block, tile.batch * 100 + tile.head, 20000, trace_count);
    mbar_wait(&smem.v_full[prev_stage], prev_phase);
    pingpong_wait<T>(consumer_wg);
    if constexpr (T::kRescaleEarly) rescale_o(corr);
    wgmma_fence();
    issue_pv(pa, smem.v[prev_stage]);
    pingpong_pass<T>(consumer_wg);
    // Traits::kInverseEarly: the row sums over the quad and their reciprocals while the last O += P v runs, so
    // that after it the epilogue needs only O; elsewhere they follow the wait (the epilogue takes the reciprocals).
    if constexpr (T::kInverseEarly) {
      quad_sums(row_sum);
      inverse_row_sums(row_sum, row_inv);
      fence_registers(row_inv);  // computed here, not after the wait
    }
    wgmma_wait<0>();
    fence_registers(o);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) fence_registers(pa[kk]);
    if (signals) mbar_arrive(&smem.v_empty[prev_stage]);
    SM90_TRACE(p, consumer_wg, trace_count, 6);
    if constexpr (!T::kInverseEarly) quad_sums(row_sum);
  }

  // The thread's parts of its two rows' sums, summed over its quad (the 4 threads of a row).
  __device__ __forceinline__ static void quad_sums(float (&sums)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      sums[i] += __shfl_xor_sync(0xffffffffu, sums[i], 1);
      sums[i] += __shfl_xor_sync(0xffffffffu, sums[i], 2);
    }
  }

  // The reciprocals of the full row sums for the epilogue: from run_tile (Traits::kInverseEarly), or computed here.
  __device__ __forceinline__ void epilogue_inverse(float (&inv)[2]) const {
    if constexpr (T::kInverseEarly) {
      inv[0] = row_inv[0], inv[1] = row_inv[1];
    } else {
      inverse_row_sums(row_sum, inv);
    }
  }

  // The key blocks [plain_begin, plain_end) of a tile that need no mask: its inner keys (tile_inner_keys)
  // cut at the sequence's end.
  __device__ __forceinline__ static void plain_blocks(int64_t inner_begin, int64_t inner_end, int32_t seqlen_k,
                                                      TileWork& w) {
    inner_end = min(inner_end, int64_t(seqlen_k));
    w.plain_begin = int32_t(min((inner_begin + kN - 1) / kN, int64_t(INT32_MAX)));
    w.plain_end = int32_t(inner_end / kN);
  }

  // The persistent loop with the tile boundaries overlapped (Traits::kTileOverlap) -------------

  // This CTA's next tile from round `round` on, planned (no waits); false when none is left.
  __device__ __forceinline__ static bool plan_next_tile(const FwdParams& p, int32_t& round, TileWork& w) {
    if (!next_tile<T::kTailSplit>(round, p, w.tile)) return false;
    const Tile& tile = w.tile;
    const Mask mask = tile_mask<T>(tile, p);
    key_block_range<T::kBlockM, kN, T::kTailSplit>(tile, mask, p, w.n_begin, w.n_end);
    int64_t inner_begin, inner_end;
    tile_inner_keys<T::kBlockM>(tile, mask, inner_begin, inner_end);
    plain_blocks(inner_begin, inner_end, tile.seqlen_k, w);
    return true;
  }

  // Waits for the q of the planned tile `w`. A tile without any visible key is finished here
  // (o = 0, lse = -inf; it loads q only) and the one after it planned. false: no tile is left.
  __device__ __forceinline__ static bool begin_tile(SharedStorage<T>& smem, const FwdParams& p, int consumer_wg,
                                                    int32_t& round, PipelineState<T::kQStages>& q_pipe,
                                                    TileWork& w, bool planned) {
    for (; planned; planned = plan_next_tile(p, round, w)) {
      mbar_wait(&smem.q_full[q_pipe.index], q_pipe.phase);
      if (w.n_end > w.n_begin) return true;
      named_barrier_sync(kEpilogueBarrier + consumer_wg, 128);  // every warp past q_full (run_tile)
      if (threadIdx.x % 128 == 0) mbar_arrive(&smem.q_empty[q_pipe.index]);
      q_pipe.advance();
      float zero_o[kD / 2], zero_stat[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < kD / 2; ++i) zero_o[i] = 0.f;
      store_tile<T>(zero_o, zero_stat, zero_stat, zero_stat, p, w.tile, consumer_wg);
    }
    return false;
  }

  // O / row_sum and lse of a finished tile to global memory (the row sums summed over the quad).
  __device__ __forceinline__ void store_finished(const float (&stat_max)[2], float (&stat_sum)[2], const Tile& tile,
                                                 const FwdParams& p, int consumer_wg) {
    quad_sums(stat_sum);
    float inv[2];
    inverse_row_sums(stat_sum, inv);
    store_tile<T>(o, stat_max, stat_sum, inv, p, tile, consumer_wg);
  }

  // All tiles of this CTA as one stream of key blocks. A step issues S of the stream's next block
  // and O += P v of the block before, as run_tile does inside a tile, across tile boundaries too:
  //   step with the next tile's first block:  S(first of i+1) + PV(last of i); softmax of the
  //                                           first block with fresh row statistics
  //   the step after:                         S(second of i+1), then tile i's epilogue from O
  //                                           (final now), then PV(first of i+1) overwriting O
  // so a tile's first S and softmax overlap the last O += P v of the tile before, and the
  // epilogue runs while the tensor cores compute an S. Only the CTA's first S and last
  // O += P v run alone.
  __device__ __forceinline__ void run(SharedStorage<T>& smem, const FwdParams& p, int consumer_wg) {
    const bool signals = threadIdx.x % 128 == 0;  // one arrival per warpgroup on the empty barriers
    PipelineState<T::kStages> pipe;
    PipelineState<T::kQStages> q_pipe;
    int32_t round = 0;
    TileWork cur, next;
    bool planned = plan_next_tile(p, round, next);
    if (!begin_tile(smem, p, consumer_wg, round, q_pipe, next, planned)) return;
    cur = next;
    const int q_offset = consumer_wg * 64 * 128;

#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
    float s[kN / 2];
    uint32_t pa[kN / 16][4];
    float corr[2];

    // The first block of the stream: S alone.
    int32_t n = cur.n_end - 1;
    mbar_wait(&smem.k_full[pipe.index], pipe.phase);
    pingpong_wait<T>(consumer_wg);
    wgmma_fence();
    issue_qk(s, smem.q[q_pipe.index] + q_offset, smem.k[pipe.index]);
    pingpong_pass<T>(consumer_wg);
    if (n == cur.n_begin) planned = plan_next_tile(p, round, next);
    wgmma_wait<0>();
    fence_registers(s);
    if (signals) {
      mbar_arrive(&smem.k_empty[pipe.index]);
      if (n == cur.n_begin) mbar_arrive(&smem.q_empty[q_pipe.index]);
    }
    if (n == cur.n_begin) q_pipe.advance();
    mask_block(s, p, cur, n, consumer_wg);
    online_softmax(s, p.score_scale_log2, corr);
    to_a_operand(s, pa);
    int prev_stage = pipe.index;
    uint32_t prev_phase = pipe.phase;
    pipe.advance();

    Tile done_tile;  // the tile whose O is final but not yet stored, and its row statistics
    float done_max[2], done_sum[2];
    bool store_due = false;
    while (true) {
      // The stream's next block: the one below n in this tile, else the next tile's first (its
      // last key block: blocks run backwards).
      const bool new_tile = n == cur.n_begin;
      if (new_tile) {
        if (!begin_tile(smem, p, consumer_wg, round, q_pipe, next, planned)) break;
      } else {
        --n;
      }
      mbar_wait(&smem.k_full[pipe.index], pipe.phase);
      mbar_wait(&smem.v_full[prev_stage], prev_phase);
      pingpong_wait<T>(consumer_wg);
      wgmma_fence();
      issue_qk(s, smem.q[q_pipe.index] + q_offset, smem.k[pipe.index]);
      if (store_due) {
        // O of the tile before is final (its last O += P v was waited for in the previous step):
        // stored while S computes; the next O += P v overwrites O instead of adding to it.
        fence_registers(o);
        store_finished(done_max, done_sum, done_tile, p, consumer_wg);
        fence_registers(o);
        wgmma_fence();
      } else if constexpr (T::kRescaleEarly) {
        rescale_between_issues(corr);
      }
      issue_pv(pa, smem.v[prev_stage], !store_due);
      pingpong_pass<T>(consumer_wg);
      // The tile before is stored (above) before its place is taken: with a one-block tile in
      // between, the store of tile i and the start of tile i + 2 fall in the same step.
      if (new_tile) {
        done_tile = cur.tile;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          done_max[i] = row_max[i];
          done_sum[i] = row_sum[i];
          row_max[i] = -INFINITY;
          row_sum[i] = 0.f;
        }
        cur = next;
        n = cur.n_end - 1;
      }
      if (n == cur.n_begin) planned = plan_next_tile(p, round, next);  // while the GEMMs run
      wgmma_wait<1>();  // S is done; O += P v may still run
      fence_registers(s);
      if (signals) {
        mbar_arrive(&smem.k_empty[pipe.index]);
        if (n == cur.n_begin) mbar_arrive(&smem.q_empty[q_pipe.index]);
      }
      if (n == cur.n_begin) q_pipe.advance();
      mask_block(s, p, cur, n, consumer_wg);
      online_softmax(s, p.score_scale_log2, corr);
      wait_pv_after_softmax(smem, s, corr, pa, pipe, prev_stage, signals);
      // A new tile's first block: O still holds the tile before (final now), no rescale.
      if constexpr (!T::kRescaleEarly) {
        if (!new_tile) rescale_o(corr);
      }
      to_a_operand(s, pa);
      store_due = new_tile;
      prev_stage = pipe.index;
      prev_phase = pipe.phase;
      pipe.advance();
    }

    // The stream's last O += P v, alone.
    mbar_wait(&smem.v_full[prev_stage], prev_phase);
    pingpong_wait<T>(consumer_wg);
    if (store_due) {
      store_finished(done_max, done_sum, done_tile, p, consumer_wg);
    } else if constexpr (T::kRescaleEarly) {
      rescale_o(corr);
    }
    wgmma_fence();
    issue_pv(pa, smem.v[prev_stage], !store_due);
    pingpong_pass<T>(consumer_wg);
    wgmma_wait<0>();
    fence_registers(o);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) fence_registers(pa[kk]);
    if (signals) mbar_arrive(&smem.v_empty[prev_stage]);
    store_finished(row_max, row_sum, cur.tile, p, consumer_wg);
  }
};

}  // namespace flashattn::cuda::sm90
