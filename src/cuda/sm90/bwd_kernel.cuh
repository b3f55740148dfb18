// FA2 backward main kernel on Hopper tensor cores (wgmma, sm_90a): the algorithm, work split,
// skipping, masking, GQA loop, deterministic order and dQ path of the sm80 2D kernel
// (sm80/bwd_kernel_2d.cuh), with every product a warpgroup MMA instead of mma.sync + ldmatrix.
//
// One CTA per (k-block of 128 keys, kv head, batch); two warpgroups, warpgroup w owns keys
// 64 w .. 64 w + 63 of the block. Per q-block i (Q_i, dO_i double-buffered by TMA, one thread issuing,
// or by cp.async where TMA cannot read them; lse_i, D_i by cp.async; all into the 128-byte-swizzled
// SmemTile layout, which is wgmma's canonical K-major layout):
//   S^T  = K_w Q_i^T     (64 x block_m)   A = K_w, B = Q_i       both K-major in shared memory
//   dP^T = V_w dO_i^T    (64 x block_m)   A = V_w, B = dO_i
//   P^T, dS^T in registers (sm80::probs_and_grads on the accumulator layout, which is mma.sync's)
//   dV_w += P^T dO_i     (64 x head_dim)  A = P^T from registers, B = dO_i MN-major
//   dK_w += dS^T Q_i     (64 x head_dim)  A = dS^T from registers, B = Q_i MN-major
//   dS^T -> shared memory; barrier
//   dQ_i  = dS K         (block_m x head_dim over both warpgroups: 64 x 64 each)
//                                         A = dS^T (MN-major: .trans), B = K MN-major
//   dQ_i -> staged in shared memory, added by bulk reductions (or ordered atomics, deterministic)
// The dV, dK products run on the tensor cores while the warpgroups store dS^T and meet at the
// barrier; the dQ product follows them in the same queue.
#pragma once

#include <type_traits>

#include "cuda/sm80/bwd_kernel_2d.cuh"
#include "cuda/sm90/primitives.cuh"
#include "cuda/sm90/launch.hpp"
#include "cuda/sm90/wgmma.cuh"

// Dev switch: the warpgroup index broadcast from lane 0 (1) or not (0).
#ifndef FLASHATTN_SM90_BWD_UNIFORM_WG
#define FLASHATTN_SM90_BWD_UNIFORM_WG 1
#endif

namespace flashattn::cuda::sm90 {

template <class T, int kHeadDim>
struct BwdTraits {
  static constexpr int kBlockM = sm80::sm90_bwd_config(kHeadDim).block_m, kBlockN = sm80::kSm90BwdBlockN;
  static constexpr int kThreads = 256;  // two warpgroups
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  // dQ_i (block_m x head_dim): warpgroups kDqWgM over the rows (64 each) x the rest over head_dim.
  static constexpr int kDqWgM = kBlockM / 64, kDqN = kHeadDim / (2 / kDqWgM);
  static_assert(kBlockM % 64 == 0 && kBlockM <= 128 && kHeadDim % 64 == 0 && kDqN % 64 == 0,
                "tiles of whole 64-column panels (128-byte rows)");
  using TileKV = sm80::SmemTile<kBlockN, kHeadDim>;  // K_j, V_j: panels of [block_n][64]
  using TileQ = sm80::SmemTile<kBlockM, kHeadDim>;   // Q_i, dO_i: panels of [block_m][64]
  using TileDs = sm80::SmemTile<kBlockN, kBlockM>;   // dS^T: panels of [block_n][64 queries]
  static constexpr uint32_t kKVPanel = kBlockN * 128, kQPanel = kBlockM * 128, kDsPanel = kBlockN * 128;
  // K, V, 2 x (Q, dO), dS^T, 2 x (lse, D), then dq_stages fp32 dQ staging tiles [block_m][head_dim] in the
  // accumulator's layout (sm80::dq_swizzle), added by 16 bulk reductions (8 rows each at head_dim 64, 4
  // at 128): 3-10% faster than one per row; 8 about the same, 32 slower (docs/sm90_bwd.md). Issued by
  // lanes 0 of warps 0 and 1, 8 each (bulk_reduce_dq_two_warps below; +2-4% at head_dim 64 over a lane each).
  static constexpr int kDqBulkOps = 16, kDqStages = sm80::sm90_bwd_config(kHeadDim).dq_stages;
  static constexpr int kDqTileFloats = kBlockM * kHeadDim;
  // Then the two Q_i, dO_i buffers' mbarriers (TMA loads).
  static constexpr int kSmemBytes = 2 * TileKV::kBytes + 4 * TileQ::kBytes + TileDs::kBytes + 4 * kBlockM * 4 +
                                    kDqStages * kDqTileFloats * 4 + 2 * 8;
  static_assert(kSmemBytes <= 227 * 1024, "the H100's shared memory");
  static_assert(TileKV::kBytes % 1024 == 0 && TileQ::kBytes % 1024 == 0 && TileDs::kBytes % 1024 == 0,
                "every tile starts on a 1024-byte swizzle atom");
};

// Q and dO as 4D tensor maps (head_dim, rows, heads, batch; boxes of 64 columns x block_m rows, 128-byte
// swizzle; columns past head_dim and rows past the tensor zero-filled), or tma 0 where TMA cannot read them
// (BwdParams::vectorized false): then every thread loads them by cp.async. One thread issuing the TMA loads
// of a q-block instead of 256 threads' cp.async: +7-15% at head_dim 64, +2-5% at 128 (docs/sm90_bwd.md).
struct BwdMaps {
  CUtensorMap q, dout;
  int tma;
};

// x through an opaque move: the descriptors built from it inside the q-block loop are not hoisted
// out of the loop (several dozen loop-invariant 64-bit descriptors would crowd out the accumulators).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}

// sm80::bulk_reduce_dq's reductions issued by two threads, lanes 0 of warps 0 and 1, kOps / 2 each in a
// loop whose addresses stay in uniform registers (per-thread operands take a lane loop with R2UR
// conversions); one bulk group per issuing thread. Here +2-4% at head_dim 64, even at 128; the sm80 2D
// kernel read 1-2% slower with it (and 9-12% with one issuing thread), dev/sm80bwd/NOTES.md.
template <int kBlockM, int kHeadDim, int kOps, int kOp0>
__device__ __forceinline__ void bulk_reduce_dq_ops(float* dq, uint32_t smem, int rows) {
  static_assert(kBlockM % kOps == 0 && kOps % 2 == 0, "whole rows per reduction");
  constexpr int kRowsPerOp = kBlockM / kOps, kOpFloats = kRowsPerOp * kHeadDim;
  if (rows == kBlockM) {  // every q-block but a sequence's last: constant sizes and offsets
#pragma unroll
    for (int op = kOp0; op < kOp0 + kOps / 2; ++op)
      sm80::bulk_reduce_add_f32_issue(dq + op * kOpFloats, smem + op * kOpFloats * 4, kOpFloats * 4);
  } else {
#pragma unroll 1
    for (int op = kOp0; op < kOp0 + kOps / 2; ++op) {
      const int r0 = op * kRowsPerOp, r1 = min(r0 + kRowsPerOp, rows);
      if (r0 < r1) sm80::bulk_reduce_add_f32_issue(dq + r0 * kHeadDim, smem + r0 * kHeadDim * 4, uint32_t(r1 - r0) * kHeadDim * 4);
    }
  }
  sm80::bulk_commit();
}
// Lane 0 of warp 0 issues the first half, lane 0 of warp 1 the second.
template <int kBlockM, int kHeadDim, int kOps>
__device__ __forceinline__ void bulk_reduce_dq_two_warps(float* dq, uint32_t smem, int rows, int tid) {
  if (tid == 0) bulk_reduce_dq_ops<kBlockM, kHeadDim, kOps, 0>(dq, smem, rows);
  else if (tid == 32) bulk_reduce_dq_ops<kBlockM, kHeadDim, kOps, kOps / 2>(dq, smem, rows);
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(256, 1) bwd_main_kernel(const sm80::BwdParams p, const __grid_constant__ BwdMaps maps) {
  using namespace sm80;
  using Tr = BwdTraits<T, kHeadDim>;
  using TileKV = typename Tr::TileKV;
  using TileQ = typename Tr::TileQ;
  using TileDs = typename Tr::TileDs;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kThreads = Tr::kThreads;
  using MmaS = Wgmma<kBlockM, Tr::kBf16>;   // S^T, dP^T: 64 x block_m
  using MmaKV = Wgmma<kHeadDim, Tr::kBf16>; // dV, dK: 64 x head_dim
  using MmaQ = Wgmma<Tr::kDqN, Tr::kBf16>;  // dQ: 64 x kDqN

  extern __shared__ __align__(1024) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + TileKV::kElements;
  T* sQ = sV + TileKV::kElements;      // [2][block_m x head_dim]
  T* sDo = sQ + 2 * TileQ::kElements;  // [2][block_m x head_dim]
  T* sDs = sDo + 2 * TileQ::kElements;  // dS^T (block_n x block_m)
  float* sLse = reinterpret_cast<float*>(sDs + TileDs::kElements);  // [2][block_m]
  float* sD = sLse + 2 * kBlockM;                                   // [2][block_m]
  float* sDq = sD + 2 * kBlockM;                                    // [kDqStages][block_m][head_dim]
  uint64_t* q_full = reinterpret_cast<uint64_t*>(sDq + Tr::kDqStages * Tr::kDqTileFloats);  // [2]: Q_i, dO_i landed

  const BwdTask task = bwd_task(p);  // one grid dimension; the last wave's tasks may run in pieces
  const int n_block = task.n_block, head_kv = task.head_kv, b = task.b;
  // wg sets this warpgroup's k, v and dS^T descriptors: uniform_warpgroup_index keeps them in uniform registers.
  const int tid = threadIdx.x, lane = tid % 32, warp_in_wg = (tid / 32) % 4;
  const int wg = FLASHATTN_SM90_BWD_UNIFORM_WG ? uniform_warpgroup_index() : tid / 128;
  const int g = lane / 4, t = lane % 4;  // accumulator fragment coordinates (mma.sync's C layout)
  const BwdSeq seq = bwd_sequence(p, b);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  const int n0 = n_block * kBlockN, n1 = n0 + kBlockN;
  if (n0 >= seqlen_k) return;
  const bool vectorized = p.vectorized != 0;
  const Mask mask(seqlen_q, seqlen_k, p.causal != 0, p.window_left, p.window_right);

  int i_begin, i_end;
  bwd_q_block_range<kBlockM>(mask, seqlen_q, n0, n1, i_begin, i_end);
  // Iteration it: query head head_kv * group + it / m_range, q-block i_begin + it % m_range; a piece of a
  // split task runs [it_begin, it_begin + num_iters).
  const int m_range = i_end - i_begin, task_iters = p.group * m_range;
  int it_begin, num_iters;
  task.iterations(task_iters, it_begin, num_iters);
  load_kv_block<T, kBlockN, kHeadDim, kThreads>(sK, sV, p, seq, n0, head_kv);

  const bool tma = maps.tma != 0;
  if (tma) {
    if (tid == 0) {
      mbar_init(&q_full[0], 1);
      mbar_init(&q_full[1], 1);
      mbar_fence_init();
    }
    __syncthreads();  // the barriers initialized before any thread's use (racecheck: else a warning each)
  }
  const bool whole_head_dim = vectorized && p.head_dim == kHeadDim;
  auto load_q_block = [&](int h, int m_block, int buf) {
    const int m0 = m_block * kBlockM;
    if (tma) {  // panels of 64 columns; rows from the sequence's first (varlen: packed rows, batch 0)
      if (tid == 0) {
        uint64_t* bar = &q_full[buf];
        mbar_arrive_expect_tx(bar, 2 * TileQ::kBytes);
        const int row = int(seq.q_start) + m0, batch = int(seq.batch_q);
#pragma unroll
        for (int c = 0; c < kHeadDim / 64; ++c) {
          tma_load_4d(&maps.q, bar, sQ + buf * TileQ::kElements + c * kBlockM * 64, 64 * c, row, h, batch);
          tma_load_4d(&maps.dout, bar, sDo + buf * TileQ::kElements + c * kBlockM * 64, 64 * c, row, h, batch);
        }
      }
      load_lse_d<kBlockM>(sLse + buf * kBlockM, sD + buf * kBlockM, p, seq, h, m0);
      return;
    }
    const T* q_tile = static_cast<const T*>(p.q) +
                      bwd_offset(seq, seq.q_start, p.q_batch_stride, p.q_row_stride, p.q_head_stride, m0, h);
    const T* do_tile = static_cast<const T*>(p.dout) +
                       bwd_offset(seq, seq.q_start, p.do_batch_stride, p.do_row_stride, p.do_head_stride, m0, h);
    if (whole_head_dim && m0 + kBlockM <= seqlen_q) {
      load_whole_tile<T, kBlockM, kHeadDim, kThreads>(smem_addr(sQ + buf * TileQ::kElements), q_tile, p.q_row_stride);
      load_whole_tile<T, kBlockM, kHeadDim, kThreads>(smem_addr(sDo + buf * TileQ::kElements), do_tile, p.do_row_stride);
    } else {
      load_tile<T, kBlockM, kHeadDim, kThreads>(sQ + buf * TileQ::kElements, q_tile, p.q_row_stride, seqlen_q - m0,
                                                p.head_dim, vectorized);
      load_tile<T, kBlockM, kHeadDim, kThreads>(sDo + buf * TileQ::kElements, do_tile, p.do_row_stride, seqlen_q - m0,
                                                p.head_dim, vectorized);
    }
    load_lse_d<kBlockM>(sLse + buf * kBlockM, sD + buf * kBlockM, p, seq, h, m0);
  };
  int h = head_kv * p.group, m_block = i_begin;
  if (it_begin > 0) h += it_begin / m_range, m_block += it_begin % m_range;
  if (num_iters > 0) load_q_block(h, m_block, 0);
  cp_async_commit();

  // This thread's rows: keys key_row (+ 8) of S^T, dP^T, dK, dV; dQ rows dq_row (+ 8) from column dq_d0.
  const int key_row = 64 * wg + 16 * warp_in_wg + g;
  const int dq_m0 = 64 * (wg % Tr::kDqWgM), dq_d0 = Tr::kDqN * (wg / Tr::kDqWgM);
  const uint32_t k_addr = smem_addr(sK) + 64 * wg * 128, v_addr = k_addr + TileKV::kBytes;  // this warpgroup's keys
  const uint32_t q_addr = smem_addr(sQ), do_addr = smem_addr(sDo);
  const uint32_t ds_addr = smem_addr(sDs) + (dq_m0 / 64) * Tr::kDsPanel;
  const uint32_t k_dq_addr = smem_addr(sK) + (dq_d0 / 64) * Tr::kKVPanel;

  float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];
#pragma unroll
  for (int e = 0; e < kHeadDim / 2; ++e) acc_dk[e] = acc_dv[e] = 0.f;

  const bool bulk_dq = !p.deterministic;
  float* dq_pending = nullptr;
  int dq_pending_rows = 0;
  uint32_t dq_pending_smem = 0;
  auto issue_pending_dq = [&] {
    if (bulk_dq) bulk_reduce_dq_two_warps<kBlockM, kHeadDim, Tr::kDqBulkOps>(dq_pending, dq_pending_smem, dq_pending_rows, tid);
  };

  for (int it = 0; it < num_iters; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();  // lse_i, D_i (and without TMA Q_i, dO_i; K, V at it 0)
    if (!tma || it == 0) fence_proxy_async_shared();  // generic-proxy writes, before the tensor cores read them
    __syncthreads();  // lse_i, D_i landed; every warpgroup is done with iteration it - 1
    issue_pending_dq();
    const bool next_head = m_block + 1 == i_end;
    const int h_next = next_head ? h + 1 : h, m_next = next_head ? i_begin : m_block + 1;
    if (it + 1 < num_iters) load_q_block(h_next, m_next, buf ^ 1);
    cp_async_commit();

    const int m0 = m_block * kBlockM;
    const uint32_t q_buf = opaque(q_addr + buf * TileQ::kBytes), do_buf = opaque(do_addr + buf * TileQ::kBytes);
    const uint32_t k_it = opaque(k_addr), v_it = opaque(v_addr);

    // S^T = K_w Q_i^T and dP^T = V_w dO_i^T, once Q_i and dO_i landed (the buffer's (it / 2)-th load).
    if (tma) mbar_wait(&q_full[buf], (it >> 1) & 1);
    const SmemDesc desc_k = kmajor_desc(k_it), desc_q = kmajor_desc(q_buf);
    const SmemDesc desc_v = kmajor_desc(v_it), desc_do = kmajor_desc(do_buf);
    float s[kBlockM / 2], dp[kBlockM / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t off = (kk / 4) * Tr::kKVPanel + (kk % 4) * 32, qoff = (kk / 4) * Tr::kQPanel + (kk % 4) * 32;
      MmaS::template ss<0>(s, desc_k.at(off), desc_q.at(qoff), kk > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t off = (kk / 4) * Tr::kKVPanel + (kk % 4) * 32, qoff = (kk / 4) * Tr::kQPanel + (kk % 4) * 32;
      MmaS::template ss<0>(dp, desc_v.at(off), desc_do.at(qoff), kk > 0);
    }
    wgmma_commit();

    // Boundary blocks: visible iff lo <= r - c <= hi, r < rows_k, c < cols_q (block coordinates).
    const BlockBand bb = block_band<kBlockM>(mask, seqlen_q, seqlen_k, n0, n1, m0);
    const bool need_mask = bb.need_mask;
    const int band_lo = bb.lo, band_hi = bb.hi;
    const BandMask band{key_row, 2 * t, band_lo, band_hi, seqlen_k - n0, seqlen_q - m0};

    wgmma_wait<0>();
    fence_registers(s);
    fence_registers(dp);
    // P^T, dS^T in place (the accumulator is an array of n8 tiles of mma.sync's C layout).
    auto& s_tiles = reinterpret_cast<float(&)[kBlockM / 8][4]>(s);
    auto& dp_tiles = reinterpret_cast<float(&)[kBlockM / 8][4]>(dp);
    const float* lse_cols = sLse + buf * kBlockM + 2 * t;
    const float* dsum_cols = sD + buf * kBlockM + 2 * t;
    if (p.softcap > 0.f) probs_and_grads<true>(s_tiles, dp_tiles, lse_cols, dsum_cols, p, band, need_mask);
    else if (need_mask) probs_and_grads<true, kBlockM / 8, false>(s_tiles, dp_tiles, lse_cols, dsum_cols, p, band, true);
    else probs_and_grads<false>(s_tiles, dp_tiles, lse_cols, dsum_cols, p, band, false);

    // A operands of dV += P^T dO_i and dK += dS^T Q_i (k16 step kk = query columns 16 kk ..).
    uint32_t a_p[kBlockM / 16][4], a_ds[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        a_p[kk][r] = sm80::pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        a_ds[kk][r] = sm80::pack2<T>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
      }
    const SmemDesc desc_do_mn = mnmajor_desc(do_buf, Tr::kQPanel), desc_q_mn = mnmajor_desc(q_buf, Tr::kQPanel);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) MmaKV::template rs<1>(acc_dv, a_p[kk], desc_do_mn.at(kk * 2048), 1);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) MmaKV::template rs<1>(acc_dk, a_ds[kk], desc_q_mn.at(kk * 2048), 1);
    wgmma_commit();

    // dS^T to shared memory while those run: a_ds[kk][r] is row key_row + 8 (r % 2), columns
    // 16 kk + 8 (r / 2) + 2 t, + 1: the four matrices of one stmatrix, whose lane l gives row l % 16 of
    // the warp's keys, unit l / 16 of the k16 step (one instruction for four 32-bit stores: +2-3%,
    // docs/sm90_bwd.md). The lane index is read here: one kept from before the loop costs a register
    // through it.
    {
      uint32_t lane_v;
      asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_v));
      const WarpCursor<kBlockN, kBlockM> cur_ds(smem_addr(sDs), 64 * wg + 16 * warp_in_wg + lane_v % 16, lane_v / 16, 0);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
        stmatrix_x4(cur_ds.at(0, 16 * kk), a_ds[kk][0], a_ds[kk][1], a_ds[kk][2], a_ds[kk][3]);
    }
    fence_proxy_async_shared();
    bulk_wait_read<Tr::kDqStages - 1>();  // the reductions that read this iteration's sDq buffer are done
    __syncthreads();   // dS^T complete; sDq free

    // dQ_i rows dq_m0 .. + 63, columns dq_d0 .. + kDqN - 1 = dS K over the block's 128 keys.
    float acc_dq[Tr::kDqN / 2];
    const SmemDesc desc_ds = mnmajor_desc(opaque(ds_addr), Tr::kDsPanel);
    const SmemDesc desc_k_mn = mnmajor_desc(opaque(k_dq_addr), Tr::kKVPanel);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      MmaQ::template ss<1, 1>(acc_dq, desc_ds.at(kk * 2048), desc_k_mn.at(kk * 2048), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(acc_dq);
    fence_registers(acc_dv);
    fence_registers(acc_dk);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {  // read by the tensor cores until here
      fence_registers(a_p[kk]);
      fence_registers(a_ds[kk]);
    }

    const int dq_row = dq_m0 + 16 * warp_in_wg + g;
    const int64_t ws0 = int64_t(h) * p.rows_q + seq.ws_row + m0;  // the q-block's first accumulator row
    const int swz = sm80::dq_fragment_swizzle(ws0);                // rows dq_row and dq_row + 8
    if (bulk_dq) {  // stage dQ_i; the next iteration's first barrier publishes it to the reductions
      float* const stage = sDq + (it % Tr::kDqStages) * Tr::kDqTileFloats;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float* dst = stage + (dq_row + 8 * i) * kHeadDim + 2 * t;
#pragma unroll
        for (int n = 0; n < Tr::kDqN / 8; ++n)
          *reinterpret_cast<float2*>(dst + ((dq_d0 + n * 8) ^ swz)) =
              make_float2(acc_dq[4 * n + 2 * i], acc_dq[4 * n + 2 * i + 1]);
      }
      fence_proxy_async_shared();
      dq_pending = p.dq_accum + ws0 * kHeadDim;
      dq_pending_smem = smem_addr(stage);
      dq_pending_rows = min(kBlockM, seqlen_q - m0);
    } else {
      int32_t* semaphore = p.dq_semaphore + (int64_t(b) * p.num_heads + h) * p.num_m_blocks + m_block;
      const int expected = n_block - int(mask.key_begin(m0) / kBlockN);
      if (tid == 0)
        while (ld_acquire(semaphore) != expected) {
        }
      __syncthreads();
      float* acc_rows = p.dq_accum + ws0 * kHeadDim;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = dq_row + 8 * i;
        if (m0 + row >= seqlen_q) continue;
        float* dst = acc_rows + (row * kHeadDim + 2 * t);
#pragma unroll
        for (int n = 0; n < Tr::kDqN / 8; ++n)
          atomic_add2(dst + ((dq_d0 + n * 8) ^ swz), acc_dq[4 * n + 2 * i], acc_dq[4 * n + 2 * i + 1]);
      }
      __threadfence();
      __syncthreads();
      if (tid == 0) atomicAdd(semaphore, 1);
    }
    h = h_next, m_block = m_next;
  }
  if (bulk_dq) {
    __syncthreads();  // the last q-block's sDq is complete
    issue_pending_dq();
    bulk_wait_read();  // shared memory must outlive the reads (the convert kernel runs after the grid)
  }

  if (!tail_sum<kThreads>(p, acc_dk, acc_dv, tid)) return;  // a piece of a split task, not the last

  // dK_j * softmax_scale and dV_j in the dtype (rows past seqlen_k and padded columns dropped).
  T* dk = static_cast<T*>(p.dk) +
          bwd_offset(seq, seq.k_start, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, n0, head_kv);
  T* dv = static_cast<T*>(p.dv) +
          bwd_offset(seq, seq.k_start, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, n0, head_kv);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = key_row + 8 * i;
    if (n0 + row >= seqlen_k) continue;
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      const int col = 8 * n + 2 * t;
      store2<T>(dk + int64_t(row) * p.dk_row_stride, col, p.head_dim, acc_dk[4 * n + 2 * i] * p.softmax_scale,
                acc_dk[4 * n + 2 * i + 1] * p.softmax_scale, vectorized);
      store2<T>(dv + int64_t(row) * p.dv_row_stride, col, p.head_dim, acc_dv[4 * n + 2 * i],
                acc_dv[4 * n + 2 * i + 1], vectorized);
    }
  }
}

}  // namespace flashattn::cuda::sm90
