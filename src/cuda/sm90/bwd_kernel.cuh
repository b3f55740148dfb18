// FA2 backward main kernels on Hopper tensor cores (wgmma, sm_90a): the algorithm, work split,
// skipping, masking, GQA loop, deterministic order and dQ path of the sm80 2D kernel
// (sm80/bwd_kernel_2d.cuh), with every product a warpgroup MMA instead of mma.sync + ldmatrix.
//
// One CTA per (k-block of 128 keys, kv head, batch), or for short equal tasks a CTA an SM running them in turn
// (BwdParams::persistent_ctas); two consumer warpgroups, warpgroup w owning keys
// 64 w .. 64 w + 63 of the block, and a producer warpgroup. Per q-block i (Q_i, dO_i double-buffered by
// TMA, or by cp.async where TMA cannot read them; lse_i, D_i; all into the 128-byte-swizzled SmemTile
// layout, which is wgmma's canonical K-major layout):
//   S^T  = K_w Q_i^T     (64 x block_m)   A = K_w, B = Q_i       both K-major in shared memory
//   dP^T = V_w dO_i^T    (64 x block_m)   A = V_w, B = dO_i
//   P^T, dS^T in registers (sm80::probs_and_grads on the accumulator layout, which is mma.sync's)
//   dV_w += P^T dO_i     (64 x head_dim)  A = P^T from registers, B = dO_i MN-major
//   dK_w += dS^T Q_i     (64 x head_dim)  A = dS^T from registers, B = Q_i MN-major
//   dS^T -> shared memory; the warpgroups' barrier
//   dQ_i  = dS K         (block_m x head_dim over both warpgroups: 64 x 64 each)
//                                         A = dS^T (MN-major: .trans), B = K MN-major
//   dQ_i -> staged in shared memory, added by bulk reductions (or ordered atomics, deterministic)
// The dV, dK products run on the tensor cores while the warpgroups store dS^T and meet at the
// barrier; the dQ product follows them in the same queue. bwd_ws_kernel: the producer warpgroup loads
// K_j, V_j and the q-blocks and issues the dQ reductions, handing buffers over by mbarriers; the
// consumers meet only at the barrier before dQ, dS^T is double-buffered, and warpgroup 1 issues its
// S^T, dP^T after warpgroup 0 (IssueOrder), so that one's softmax gradient runs under the other's products;
// dK_j, dV_j leave by TMA from shared memory, staged over K_j, V_j. (A two-warpgroup kernel without the
// producer, bwd_main_kernel, ran head_dim 64 until session 58: docs/sm90_bwd.md.)
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
// Dev switch: warpgroup 1 issues S^T, dP^T after warpgroup 0 has (1), or both at once (0).
#ifndef FLASHATTN_SM90_BWD_PINGPONG
#define FLASHATTN_SM90_BWD_PINGPONG 1
#endif

namespace flashattn::cuda::sm90 {

// What the traits of both Hopper backward kernels (bwd_ws_kernel here, bwd_wide_kernel) share: the config's
// tiles, two consumer warpgroups and a producer warpgroup of four warps, each one job: Q, dO (by TMA from lane
// 0, or cp.async where TMA cannot); lse, D; the dQ reductions (lane 0); K, V (likewise). setmaxnreg moves
// registers to the consumers within the 168 a thread of the launch (the config's producer_regs). The shared
// tiles are panels of 64 columns in the 128-byte swizzled layout.
template <class T, int kHeadDim>
struct BwdTraitsBase {
  static constexpr sm80::Sm90BwdConfig kConfig = sm80::sm90_bwd_config(kHeadDim);
  static constexpr int kBlockM = kConfig.block_m, kBlockN = kConfig.block_n;
  static constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  static constexpr int kConsumerThreads = 256, kThreads = 384;
  static constexpr int kProducerRegs = kConfig.producer_regs;
  static constexpr int kConsumerRegs = (168 * 384 - kProducerRegs * 128) / kConsumerThreads / 8 * 8;
  static constexpr int kDim = kHeadDim, kHeadDimSteps = kHeadDim / 16;
  using TileKV = sm80::SmemTile<kBlockN, kHeadDim>;  // K_j, V_j: panels of [block_n][64]
  using TileQ = sm80::SmemTile<kBlockM, kHeadDim>;   // Q_i, dO_i: panels of [block_m][64]
  using TileDs = sm80::SmemTile<kBlockN, kBlockM>;   // dS^T: panels of [block_n][64 queries]
  static constexpr uint32_t kKVPanel = kBlockN * 128, kQPanel = kBlockM * 128, kDsPanel = kBlockN * 128;
  static_assert(TileKV::kBytes % 1024 == 0 && TileQ::kBytes % 1024 == 0 && TileDs::kBytes % 1024 == 0,
                "every tile starts on a 1024-byte swizzle atom");
};

// bwd_ws_kernel's. Registers (ptxas -v): head_dim 128 at 40 + 2 x 232 spills 44 bytes, loads 56 (in the SASS the
// consumers' key_row and t, reloaded 4 times a q-block; at 48 + 2 x 224 the consumers spill in the products and
// the kernel read 0.7 of its speed; at 24 + 2 x 240 it read 0.95-0.97); head_dim 64 at 24 + 2 x 240 272 / 288
// (at 40 + 2 x 232 136 / 160, and 1-7% slower: session 59).
template <class T, int kHeadDim>
struct BwdTraits : BwdTraitsBase<T, kHeadDim> {
  using Base = BwdTraitsBase<T, kHeadDim>;
  using typename Base::TileDs, typename Base::TileKV, typename Base::TileQ;
  using Base::kBlockM, Base::kBlockN, Base::kConfig;
  static_assert(kConfig.wide == 0 && kBlockN == 128, "two warpgroups of 64 keys");
  // dQ_i (block_m x head_dim): warpgroups kDqWgM over the rows (64 each) x the rest over head_dim.
  static constexpr int kDqWgM = kBlockM / 64, kDqN = kHeadDim / (2 / kDqWgM);
  static_assert(kBlockM % 64 == 0 && kBlockM <= 128 && kHeadDim % 64 == 0 && kDqN % 64 == 0,
                "tiles of whole 64-column panels (128-byte rows)");
  // K, V, 2 x (Q, dO), 2 x dS^T (iteration it's dQ reads its buffer while the other warpgroup may store
  // it + 1's; the mid barrier of it + 1 orders the reuse at it + 2), 2 x (lse, D), then
  // dq_stages fp32 dQ staging tiles [block_m][head_dim] in the accumulator's layout (sm80::dq_swizzle),
  // added by 16 bulk reductions (8 rows each at head_dim 64, 4 at 128): 3-10% faster than one per row; 8
  // about the same, 32 slower (docs/sm90_bwd.md). Then the mbarriers: q_full[2], q_empty[2],
  // dq_full[dq_stages], dq_empty[dq_stages], kv_full, kv_empty.
  static constexpr int kDsBufs = 2, kDqBulkOps = 16, kDqStages = kConfig.dq_stages;
  static constexpr int kDqTileFloats = kBlockM * kHeadDim, kBarriers = 6 + 2 * kDqStages;
  static constexpr int kSmemBytes = 2 * TileKV::kBytes + 4 * TileQ::kBytes + kDsBufs * TileDs::kBytes +
                                    4 * kBlockM * 4 + kDqStages * kDqTileFloats * 4 + kBarriers * 8;
  static_assert(kSmemBytes <= 227 * 1024, "the H100's shared memory");
};

// Q and dO as 4D tensor maps (head_dim, rows, heads, batch; boxes of 64 columns x block_m rows, 128-byte
// swizzle; columns past head_dim and rows past the tensor zero-filled), or tma 0 where TMA cannot read them
// (BwdParams::vectorized false): then they are loaded by cp.async. One thread issuing the TMA loads of a
// q-block instead of 256 threads' cp.async: +7-15% at head_dim 64, +2-5% at 128 (docs/sm90_bwd.md).
struct BwdMaps {
  CUtensorMap q, dout;
  CUtensorMap k, v;    // boxes of 64 columns x block_n rows
  CUtensorMap dk, dv;  // likewise, stored from shared memory
  int tma;
};

// The shared memory of BwdTraits: each region at its offset from the base, computed where used.
template <class T, class Tr>
struct BwdSmem {
  unsigned char* base;
  static constexpr int kQ = 2 * Tr::TileKV::kBytes, kDout = kQ + 2 * Tr::TileQ::kBytes;
  static constexpr int kDs = kDout + 2 * Tr::TileQ::kBytes, kLse = kDs + Tr::kDsBufs * Tr::TileDs::kBytes;
  static constexpr int kD = kLse + 2 * Tr::kBlockM * 4, kDq = kD + 2 * Tr::kBlockM * 4;
  static constexpr int kBar = kDq + Tr::kDqStages * Tr::kDqTileFloats * 4;
  __device__ __forceinline__ T* k() const { return reinterpret_cast<T*>(base); }
  __device__ __forceinline__ T* v() const { return reinterpret_cast<T*>(base + Tr::TileKV::kBytes); }
  __device__ __forceinline__ T* q(int buf) const { return reinterpret_cast<T*>(base + kQ + buf * Tr::TileQ::kBytes); }
  __device__ __forceinline__ T* dout(int buf) const { return reinterpret_cast<T*>(base + kDout + buf * Tr::TileQ::kBytes); }
  __device__ __forceinline__ T* ds(int buf) const { return reinterpret_cast<T*>(base + kDs + buf * Tr::TileDs::kBytes); }
  __device__ __forceinline__ float* lse(int buf) const { return reinterpret_cast<float*>(base + kLse) + buf * Tr::kBlockM; }
  __device__ __forceinline__ float* d(int buf) const { return reinterpret_cast<float*>(base + kD) + buf * Tr::kBlockM; }
  __device__ __forceinline__ float* dq(int stage) const {
    return reinterpret_cast<float*>(base + kDq) + stage * Tr::kDqTileFloats;
  }
  __device__ __forceinline__ uint64_t* bar() const { return reinterpret_cast<uint64_t*>(base + kBar); }
  static_assert(kBar + Tr::kBarriers * 8 == Tr::kSmemBytes, "the layout of kSmemBytes");
};

// A consumer warpgroup's shared-memory addresses: its keys of K, V (k, v), Q, dO buffer 0, and the dS^T and K
// panels its dQ product starts in (rows dq_m0.., columns dq_d0..).
template <class T, class Tr>
struct WarpgroupAddrs {
  uint32_t k, v, q, dout, ds, k_dq;
  __device__ __forceinline__ WarpgroupAddrs(const BwdSmem<T, Tr>& sm, int wg, int dq_m0, int dq_d0)
      : k(smem_addr(sm.k()) + 64 * wg * 128),
        v(k + Tr::TileKV::kBytes),
        q(smem_addr(sm.q(0))),
        dout(smem_addr(sm.dout(0))),
        ds(smem_addr(sm.ds(0)) + (dq_m0 / 64) * Tr::kDsPanel),
        k_dq(smem_addr(sm.k()) + (dq_d0 / 64) * Tr::kKVPanel) {}
};

// x through an opaque move: the descriptors built from it inside the q-block loop are not hoisted
// out of the loop (several dozen loop-invariant 64-bit descriptors would crowd out the accumulators).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}

// sm80::bulk_reduce_dq's reductions [kOp0, kOp0 + kCount) of kOps from one thread, in a loop whose addresses
// stay in uniform registers (per-thread operands take a lane loop with R2UR conversions), as one bulk group.
template <int kBlockM, int kHeadDim, int kOps, int kOp0, int kCount>
__device__ __forceinline__ void bulk_reduce_dq_ops(float* dq, uint32_t smem, int rows) {
  static_assert(kBlockM % kOps == 0 && kOp0 + kCount <= kOps, "whole rows per reduction");
  constexpr int kRowsPerOp = kBlockM / kOps, kOpFloats = kRowsPerOp * kHeadDim;
  if (rows == kBlockM) {  // every q-block but a sequence's last: constant sizes and offsets
#pragma unroll
    for (int op = kOp0; op < kOp0 + kCount; ++op)
      sm80::bulk_reduce_add_f32_issue(dq + op * kOpFloats, smem + op * kOpFloats * 4, kOpFloats * 4);
  } else {
#pragma unroll 1
    for (int op = kOp0; op < kOp0 + kCount; ++op) {
      const int r0 = op * kRowsPerOp, r1 = min(r0 + kRowsPerOp, rows);
      if (r0 < r1) sm80::bulk_reduce_add_f32_issue(dq + r0 * kHeadDim, smem + r0 * kHeadDim * 4, uint32_t(r1 - r0) * kHeadDim * 4);
    }
  }
  sm80::bulk_commit();
}
// The consumer warpgroups' barrier in the producer kernel (named barrier 1): the producer takes no part.
struct ConsumerSync {
  static __device__ __forceinline__ void sync() { named_barrier_sync(1, 256); }
  static __device__ __forceinline__ bool sync_or(bool pred) { return named_barrier_or(1, 256, pred); }
};

// The producer kernel's consumers issue S^T, dP^T in warpgroup order (named barrier 2): the tensor cores take
// the products in issue order, so warpgroup 0's finish first and its softmax gradient runs under warpgroup 1's
// products, warpgroup 1's under warpgroup 0's dV, dK (about +1% at head_dim 128; at 64, in the two-warpgroup
// kernel, 9-12% slower: docs/sm90_bwd.md). key_row (64 wg + ...) is live through the loop where wg is not
// (testing wg spilled 100 bytes). Warpgroup 0's arrivals never run ahead of warpgroup 1's waits: the mid
// barrier (ConsumerSync) of each iteration follows both.
struct IssueOrder {
  static constexpr int kBarrier = 2;
  static __device__ __forceinline__ void before(int key_row) {
    if (FLASHATTN_SM90_BWD_PINGPONG && key_row >= 64) named_barrier_sync(kBarrier, 256);
  }
  static __device__ __forceinline__ void after(int key_row) {
    if (FLASHATTN_SM90_BWD_PINGPONG && key_row < 64) named_barrier_arrive(kBarrier, 256);
  }
};

// The q-block of iteration it, stepped one iteration at a time: query head h (of the kv head's group), q-block
// m_block (i_begin .. i_end - 1 for each head).
struct QBlockCursor {
  int h, m_block, i_begin, i_end;
  __device__ __forceinline__ void advance() {
    if (++m_block == i_end) m_block = i_begin, ++h;
  }
};

// A CTA's work: the task (k-block n_block of kv head head_kv, batch b), keys n0 .. n1 - 1 of its sequence, and
// its iterations [it_begin, it_begin + num_iters) from q-block `first`; iteration it is query head
// head_kv * group + it / m_range, q-block i_begin + it % m_range (a split task's pieces run parts).
template <int kBlockM, int kBlockN>
struct BwdWork {
  sm80::BwdTask task;
  sm80::BwdSeq seq;
  Mask mask;
  int n0, n1, num_iters;
  QBlockCursor first;
  __device__ __forceinline__ explicit BwdWork(const sm80::BwdParams& p, int cta)
      : task(sm80::bwd_task(p, cta)),
        seq(sm80::bwd_sequence(p, task.b)),
        mask(seq.seqlen_q, seq.seqlen_k, p.causal != 0, p.window_left, p.window_right),
        n0(task.n_block * kBlockN),
        n1(n0 + kBlockN) {
    int i_begin, i_end, it_begin;
    sm80::bwd_q_block_range<kBlockM>(mask, seq.seqlen_q, n0, n1, i_begin, i_end);
    const int m_range = i_end - i_begin;
    task.iterations(p.group * m_range, it_begin, num_iters);
    first = {task.head_kv * p.group, i_begin, i_begin, i_end};
    if (it_begin > 0) first.h += it_begin / m_range, first.m_block += it_begin % m_range;
  }
};

// ---------------------------------------------------------------------------------------------
// The steps of an iteration, each a warpgroup's share (the kernels below call them in order).

// acc (64 x block_m) = A B^T over head_dim, issued: A, 64 keys of K or V, and B, Q_i or dO_i, K-major in shared
// memory (k16 step kk: panel kk / 4, 32 bytes kk % 4 into its 128-byte rows). The caller fences and commits.
template <class Tr>
__device__ __forceinline__ void kmajor_product(float (&acc)[Tr::kBlockM / 2], const SmemDesc& a, const SmemDesc& b) {
  using Mma = Wgmma<Tr::kBlockM, Tr::kBf16>;
#pragma unroll
  for (int kk = 0; kk < Tr::kHeadDimSteps; ++kk) {
    const uint32_t off = (kk / 4) * Tr::kKVPanel + (kk % 4) * 32, qoff = (kk / 4) * Tr::kQPanel + (kk % 4) * 32;
    Mma::template ss<0>(acc, a.at(off), b.at(qoff), kk > 0);
  }
}

// S^T = K_w Q_i^T and dP^T = V_w dO_i^T issued (two wgmma groups); k, v: this warpgroup's keys.
template <class Tr>
__device__ __forceinline__ void issue_s_dp(float (&s)[Tr::kBlockM / 2], float (&dp)[Tr::kBlockM / 2], uint32_t k,
                                           uint32_t v, uint32_t q, uint32_t dout) {
  const SmemDesc desc_k = kmajor_desc(k), desc_q = kmajor_desc(q);
  const SmemDesc desc_v = kmajor_desc(v), desc_do = kmajor_desc(dout);
  wgmma_fence();
  kmajor_product<Tr>(s, desc_k, desc_q);
  wgmma_commit();
  kmajor_product<Tr>(dp, desc_v, desc_do);
  wgmma_commit();
}

// Once S^T, dP^T are done: P^T, dS^T in place (the accumulator is an array of n8 tiles of mma.sync's C
// layout), then packed as the A operands of dV += P^T dO_i and dK += dS^T Q_i (k16 step kk = query columns
// 16 kk ..). lse_cols, dsum_cols: lse_i, D_i from this thread's first column. kDropout: keep, the keep bits of
// query tile q (sm80::dropout_keep); dP^T's dropped elements zeroed and the kept ones scaled before the
// gradient (dS = P (dP Z - D)), P^T's dropped ones zeroed after it (dV's scale comes at the store).
template <class T, class Tr, bool kDropout>
__device__ __forceinline__ void probs_grads_operands(float (&s)[Tr::kBlockM / 2], float (&dp)[Tr::kBlockM / 2],
                                                     const float* lse_cols, const float* dsum_cols,
                                                     const sm80::BwdParams& p, const sm80::BandMask& band,
                                                     bool need_mask, const uint32_t (&keep)[Tr::kBlockM / 16],
                                                     uint32_t (&a_p)[Tr::kBlockM / 16][4],
                                                     uint32_t (&a_ds)[Tr::kBlockM / 16][4]) {
  constexpr int kBlockM = Tr::kBlockM;
  wgmma_wait<0>();
  fence_registers(s);
  fence_registers(dp);
  auto& s_tiles = reinterpret_cast<float(&)[kBlockM / 8][4]>(s);
  auto& dp_tiles = reinterpret_cast<float(&)[kBlockM / 8][4]>(dp);
  if constexpr (kDropout) sm80::dropout_dp<kBlockM / 8>(dp_tiles, keep, p.dropout.scale);
  if (p.softcap > 0.f) sm80::probs_and_grads<true>(s_tiles, dp_tiles, lse_cols, dsum_cols, p, band, need_mask);
  else if (need_mask) sm80::probs_and_grads<true, kBlockM / 8, false>(s_tiles, dp_tiles, lse_cols, dsum_cols, p, band, true);
  else sm80::probs_and_grads<false>(s_tiles, dp_tiles, lse_cols, dsum_cols, p, band, false);
  if constexpr (kDropout) sm80::dropout_p<kBlockM / 8>(s_tiles, keep);
#pragma unroll
  for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      a_p[kk][r] = sm80::pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
      a_ds[kk][r] = sm80::pack2<T>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
    }
}

// dV_w += P^T dO_i and dK_w += dS^T Q_i issued (one wgmma group; B operands MN-major).
template <class Tr>
__device__ __forceinline__ void issue_dv_dk(float (&acc_dv)[Tr::kDim / 2], float (&acc_dk)[Tr::kDim / 2],
                                            const uint32_t (&a_p)[Tr::kBlockM / 16][4],
                                            const uint32_t (&a_ds)[Tr::kBlockM / 16][4], uint32_t q, uint32_t dout) {
  using MmaKV = Wgmma<Tr::kDim, Tr::kBf16>;  // 64 x head_dim
  const SmemDesc desc_do_mn = mnmajor_desc(dout, Tr::kQPanel), desc_q_mn = mnmajor_desc(q, Tr::kQPanel);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockM / 16; ++kk) MmaKV::template rs<1>(acc_dv, a_p[kk], desc_do_mn.at(kk * 2048), 1);
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockM / 16; ++kk) MmaKV::template rs<1>(acc_dk, a_ds[kk], desc_q_mn.at(kk * 2048), 1);
  wgmma_commit();
}

// dS^T to the shared tile at ds (while dV, dK run), then fenced for the tensor cores: a_ds[kk][r] is row
// key_row + 8 (r % 2), columns 16 kk + 8 (r / 2) + 2 t, + 1: the four matrices of one stmatrix, whose lane l
// gives row l % 16 of the warp's keys, unit l / 16 of the k16 step (one instruction for four 32-bit stores:
// +2-3%, docs/sm90_bwd.md). The lane index is read here: one kept from before the loop costs a register.
template <class Tr>
__device__ __forceinline__ void store_ds_t(uint32_t ds, int wg, int warp_in_wg,
                                           const uint32_t (&a_ds)[Tr::kBlockM / 16][4]) {
  uint32_t lane_v;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_v));
  const sm80::WarpCursor<Tr::kBlockN, Tr::kBlockM> cur_ds(ds, 64 * wg + 16 * warp_in_wg + lane_v % 16, lane_v / 16, 0);
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockM / 16; ++kk)
    stmatrix_x4(cur_ds.at(0, 16 * kk), a_ds[kk][0], a_ds[kk][1], a_ds[kk][2], a_ds[kk][3]);
  sm80::fence_proxy_async_shared();
}

// After the barrier: this warpgroup's dQ_i rows dq_m0 .. + 63, columns dq_d0 .. + kDqN - 1 = dS K over the
// block's 128 keys (ds, k: the dS^T panel and K panel they start in), waited for with every product.
template <class Tr>
__device__ __forceinline__ void dq_product(float (&acc_dq)[Tr::kDqN / 2], uint32_t ds, uint32_t k,
                                           float (&acc_dv)[Tr::kDim / 2], float (&acc_dk)[Tr::kDim / 2],
                                           uint32_t (&a_p)[Tr::kBlockM / 16][4], uint32_t (&a_ds)[Tr::kBlockM / 16][4]) {
  using MmaQ = Wgmma<Tr::kDqN, Tr::kBf16>;  // 64 x kDqN
  const SmemDesc desc_ds = mnmajor_desc(ds, Tr::kDsPanel), desc_k_mn = mnmajor_desc(k, Tr::kKVPanel);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockN / 16; ++kk)
    MmaQ::template ss<1, 1>(acc_dq, desc_ds.at(kk * 2048), desc_k_mn.at(kk * 2048), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(acc_dq);
  fence_registers(acc_dv);
  fence_registers(acc_dk);
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockM / 16; ++kk) {  // read by the tensor cores until here
    fence_registers(a_p[kk]);
    fence_registers(a_ds[kk]);
  }
}

// This thread's dQ_i fragment (rows dq_row, dq_row + 8; columns from dq_d0 + 2 t, swizzled by swz) into the
// staging tile, fenced for the bulk reductions (async proxy).
template <class Tr>
__device__ __forceinline__ void stage_dq(float* tile, int dq_row, int dq_d0, int t, int swz,
                                         const float (&acc_dq)[Tr::kDqN / 2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float* dst = tile + (dq_row + 8 * i) * Tr::kDim + 2 * t;
#pragma unroll
    for (int n = 0; n < Tr::kDqN / 8; ++n)
      *reinterpret_cast<float2*>(dst + ((dq_d0 + n * 8) ^ swz)) = make_float2(acc_dq[4 * n + 2 * i], acc_dq[4 * n + 2 * i + 1]);
  }
  sm80::fence_proxy_async_shared();
}

// Deterministic: dQ_i added by atomics in k-block order. DqTurn: the q-block's semaphore counts the k-blocks
// done; wait() returns when this k-block's turn has come, done() passes it on (both: every consumer thread).
struct DqTurn {
  int32_t* semaphore;
  int expected;
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static DqTurn of(const sm80::BwdParams& p, const Mask& mask, int b, int h, int m_block,
                                              int n_block) {
    return {p.dq_semaphore + (int64_t(b) * p.num_heads + h) * p.num_m_blocks + m_block,
            n_block - int(mask.key_begin(m_block * kBlockM) / kBlockN)};
  }
  __device__ __forceinline__ void wait(int tid) const {
    if (tid == 0)
      while (sm80::ld_acquire(semaphore) != expected) {
      }
    ConsumerSync::sync();
  }
  __device__ __forceinline__ void done(int tid) const {
    __threadfence();
    ConsumerSync::sync();
    if (tid == 0) atomicAdd(semaphore, 1);
  }
};

// This thread's dQ_i fragment added by atomics (in its turn): acc_rows, the q-block's accumulator rows, valid rows
// m0 .. seqlen_q - 1.
template <class Tr>
__device__ __forceinline__ void add_dq_atomics(float* acc_rows, int rows_valid, int dq_row, int dq_d0, int t, int swz,
                                               const float (&acc_dq)[Tr::kDqN / 2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = dq_row + 8 * i;
    if (row >= rows_valid) continue;
    float* dst = acc_rows + (row * Tr::kDim + 2 * t);
#pragma unroll
    for (int n = 0; n < Tr::kDqN / 8; ++n)
      sm80::atomic_add2(dst + ((dq_d0 + n * 8) ^ swz), acc_dq[4 * n + 2 * i], acc_dq[4 * n + 2 * i + 1]);
  }
}

// dK_j * softmax_scale and dV_j * dv_scale (dropout's 1 / (1 - p), or 1) in the dtype: this thread's rows key_row,
// key_row + 8 (rows past seqlen_k and padded columns dropped).
template <class T, class Tr>
__device__ __forceinline__ void store_dk_dv(const sm80::BwdParams& p, const sm80::BwdSeq& seq, int n0, int head_kv,
                                            int key_row, int t, const float (&acc_dk)[Tr::kDim / 2],
                                            const float (&acc_dv)[Tr::kDim / 2], float dv_scale) {
  using sm80::bwd_offset;
  const bool vectorized = p.vectorized != 0;
  T* dk = static_cast<T*>(p.dk) + bwd_offset(seq, seq.k_start, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, n0, head_kv);
  T* dv = static_cast<T*>(p.dv) + bwd_offset(seq, seq.k_start, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, n0, head_kv);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = key_row + 8 * i;
    if (n0 + row >= seq.seqlen_k) continue;
#pragma unroll
    for (int n = 0; n < Tr::kDim / 8; ++n) {
      const int col = 8 * n + 2 * t;
      sm80::store2<T>(dk + int64_t(row) * p.dk_row_stride, col, p.head_dim, acc_dk[4 * n + 2 * i] * p.softmax_scale,
                      acc_dk[4 * n + 2 * i + 1] * p.softmax_scale, vectorized);
      sm80::store2<T>(dv + int64_t(row) * p.dv_row_stride, col, p.head_dim, acc_dv[4 * n + 2 * i] * dv_scale,
                      acc_dv[4 * n + 2 * i + 1] * dv_scale, vectorized);
    }
  }
}

// dK_j * softmax_scale and dV_j * dv_scale through shared memory: both warpgroups done with K, V (first barrier), each stages
// its keys' rows over them in the tiles' layout (stmatrix, as dS^T), and one thread stores the tiles by TMA, then
// waits until they are read (K, V's next load must not overwrite them). Rows past the tensor are not written;
// a varlen k-block that ends past its sequence would write the next one's rows, so it stores from registers.
template <class T, class Tr>
__device__ __forceinline__ void store_dk_dv_tma(const sm80::BwdParams& p, const BwdMaps& maps, T* sk, T* sv,
                                                const sm80::BwdSeq& seq, int n0, int head_kv, int wg,
                                                int warp_in_wg, int tid, const float (&acc_dk)[Tr::kDim / 2],
                                                const float (&acc_dv)[Tr::kDim / 2], float dv_scale) {
  ConsumerSync::sync();  // every dQ product has read K
  uint32_t lane_v;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_v));
  const int row_t = 64 * wg + 16 * warp_in_wg + lane_v % 16;
  const sm80::WarpCursor<Tr::kBlockN, Tr::kDim> cur_k(smem_addr(sk), row_t, lane_v / 16, 0);
  const sm80::WarpCursor<Tr::kBlockN, Tr::kDim> cur_v(smem_addr(sv), row_t, lane_v / 16, 0);
#pragma unroll
  for (int kk = 0; kk < Tr::kDim / 16; ++kk) {
    const float* k8 = acc_dk + 8 * kk;
    const float* v8 = acc_dv + 8 * kk;
    const float sc = p.softmax_scale;
    stmatrix_x4(cur_k.at(0, 16 * kk), sm80::pack2<T>(k8[0] * sc, k8[1] * sc), sm80::pack2<T>(k8[2] * sc, k8[3] * sc),
                sm80::pack2<T>(k8[4] * sc, k8[5] * sc), sm80::pack2<T>(k8[6] * sc, k8[7] * sc));
    const float vs = dv_scale;
    stmatrix_x4(cur_v.at(0, 16 * kk), sm80::pack2<T>(v8[0] * vs, v8[1] * vs), sm80::pack2<T>(v8[2] * vs, v8[3] * vs),
                sm80::pack2<T>(v8[4] * vs, v8[5] * vs), sm80::pack2<T>(v8[6] * vs, v8[7] * vs));
  }
  sm80::fence_proxy_async_shared();  // written by the generic proxy, read by the TMA
  ConsumerSync::sync();
  if (tid == 0) {
    const int row = int(seq.k_start) + n0, batch = int(seq.batch_q);
#pragma unroll
    for (int c = 0; c < Tr::kDim / 64; ++c) {
      tma_store_4d(&maps.dk, sk + c * Tr::kBlockN * 64, 64 * c, row, head_kv, batch);
      tma_store_4d(&maps.dv, sv + c * Tr::kBlockN * 64, 64 * c, row, head_kv, batch);
    }
    bulk_commit_group();
    bulk_wait_group_0<true>();
  }
}

// Q_i, dO_i of q-block (h, m_block) by TMA from one thread: panels of 64 columns, rows from the sequence's first
// (varlen: packed rows, batch 0), completing on bar with their bytes.
template <class T, class Tr>
__device__ __forceinline__ void tma_load_q_block(const BwdMaps& maps, uint64_t* bar, T* q, T* dout,
                                                 const sm80::BwdSeq& seq, int h, int m_block) {
  mbar_arrive_expect_tx(bar, 2 * Tr::TileQ::kBytes);
  const int row = int(seq.q_start) + m_block * Tr::kBlockM, batch = int(seq.batch_q);
#pragma unroll
  for (int c = 0; c < Tr::kDim / 64; ++c) {
    tma_load_4d(&maps.q, bar, q + c * Tr::kBlockM * 64, 64 * c, row, h, batch);
    tma_load_4d(&maps.dout, bar, dout + c * Tr::kBlockM * 64, 64 * c, row, h, batch);
  }
}

// K_j, V_j of the k-block from key n0 by TMA from one thread, likewise.
template <class T, class Tr>
__device__ __forceinline__ void tma_load_kv_block(const BwdMaps& maps, uint64_t* bar, T* k, T* v,
                                                  const sm80::BwdSeq& seq, int n0, int head_kv) {
  mbar_arrive_expect_tx(bar, 2 * Tr::TileKV::kBytes);
  const int row = int(seq.k_start) + n0, batch = int(seq.batch_q);
#pragma unroll
  for (int c = 0; c < Tr::kDim / 64; ++c) {
    tma_load_4d(&maps.k, bar, k + c * Tr::kBlockN * 64, 64 * c, row, head_kv, batch);
    tma_load_4d(&maps.v, bar, v + c * Tr::kBlockN * 64, 64 * c, row, head_kv, batch);
  }
}

// A [kRows][kHeadDim] tile by one warp's lanes' cp.async (committed by the caller), rows past rows_valid
// zero-filled. Rolled, a unit at a time: the producer warps have few registers.
template <class T, int kRows, int kHeadDim>
__device__ __forceinline__ void warp_load_tile(T* smem, const T* gmem, int64_t row_stride, int rows_valid,
                                               const sm80::BwdParams& p, int lane) {
#pragma unroll 1
  for (int u = lane; u < kRows * kHeadDim / 8; u += 32)
    sm80::load_tile_unit<T, kRows, kHeadDim>(smem, gmem, row_stride, rows_valid, p.head_dim, p.vectorized != 0, u);
}

// ---------------------------------------------------------------------------------------------
// The producer warpgroup's loads, one warp each, shared by bwd_ws_kernel and bwd_wide_kernel (Smem: their
// shared-memory views). Each role runs the CTA's tasks blockIdx.x, + gridDim.x, .. < ctas (one, unless the grid
// is persistent) and counts its q-blocks or tasks over them, so the mbarriers' phases run on from task to task.

// Q_j, dO_j into buffer j % 2 (the j-th q-block of the CTA) once q_empty[j % 2] has completed its (j / 2 - 1)-th
// phase: by TMA from lane 0, or by cp.async from the warp's lanes.
template <class T, class Tr, class Smem>
__device__ __forceinline__ void produce_q_do(const sm80::BwdParams& p, const BwdMaps& maps, const Smem& sm,
                                             uint64_t* q_full, uint64_t* q_empty, int ctas, int lane, bool tma) {
  using Work = BwdWork<Tr::kBlockM, Tr::kBlockN>;
  int j = 0;  // the CTA's q-blocks so far: buffer j % 2, its (j / 2)-th load
  for (int cta = blockIdx.x; cta < ctas; cta += gridDim.x) {
    const Work w(p, cta);
    const sm80::BwdSeq& seq = w.seq;
    if (w.n0 >= seq.seqlen_k) continue;
    QBlockCursor load = w.first;
    for (int it = 0; it < w.num_iters; ++it, ++j, load.advance()) {
      const int buf = j & 1, m0 = load.m_block * Tr::kBlockM;
      if (j >= 2) mbar_wait(&q_empty[buf], ((j >> 1) - 1) & 1);
      if (tma) {
        if (lane == 0)
          tma_load_q_block<T, Tr>(maps, &q_full[buf], sm.q(buf), sm.dout(buf), seq, load.h, load.m_block);
        else
          mbar_arrive(&q_full[buf]);
        continue;
      }
      const T* q_tile = static_cast<const T*>(p.q) +
                        sm80::bwd_offset(seq, seq.q_start, p.q_batch_stride, p.q_row_stride, p.q_head_stride, m0, load.h);
      warp_load_tile<T, Tr::kBlockM, Tr::kDim>(sm.q(buf), q_tile, p.q_row_stride, seq.seqlen_q - m0, p, lane);
      const T* do_tile = static_cast<const T*>(p.dout) + sm80::bwd_offset(seq, seq.q_start, p.do_batch_stride,
                                                                          p.do_row_stride, p.do_head_stride, m0, load.h);
      warp_load_tile<T, Tr::kBlockM, Tr::kDim>(sm.dout(buf), do_tile, p.do_row_stride, seq.seqlen_q - m0, p, lane);
      sm80::cp_async_commit();
      sm80::cp_async_wait<0>();
      sm80::fence_proxy_async_shared();  // Q_j, dO_j written by the generic proxy, read by the tensor cores
      mbar_arrive(&q_full[buf]);
    }
  }
}

// lse_j, D_j into buffer j % 2 likewise (rows past the sequence read as 0).
template <class Tr, class Smem>
__device__ __forceinline__ void produce_lse_d(const sm80::BwdParams& p, const Smem& sm, uint64_t* q_full,
                                              uint64_t* q_empty, int ctas, int lane) {
  using Work = BwdWork<Tr::kBlockM, Tr::kBlockN>;
  int j = 0;
  for (int cta = blockIdx.x; cta < ctas; cta += gridDim.x) {
    const Work w(p, cta);
    const sm80::BwdSeq& seq = w.seq;
    if (w.n0 >= seq.seqlen_k) continue;
    QBlockCursor load = w.first;
    const float *lse_head = nullptr, *d_head = nullptr;
    for (int it = 0; it < w.num_iters; ++it, ++j) {
      const int buf = j & 1, m0 = load.m_block * Tr::kBlockM;
      if (j >= 2) mbar_wait(&q_empty[buf], ((j >> 1) - 1) & 1);
      if (it == 0 || load.m_block == load.i_begin) {  // a new query head: its rows of lse and D
        lse_head = p.lse + sm80::lse_row0(p, seq, load.h);
        d_head = p.d_sum + int64_t(load.h) * p.rows_q + seq.ws_row;
      }
#pragma unroll
      for (int r = lane; r < Tr::kBlockM; r += 32) {
        const bool valid = m0 + r < seq.seqlen_q;
        sm.lse(buf)[r] = valid ? lse_head[m0 + r] : 0.f;
        sm.d(buf)[r] = valid ? d_head[m0 + r] : 0.f;
      }
      mbar_arrive(&q_full[buf]);
      load.advance();
    }
  }
}

// Each task's K, V once the consumers are done with the last task's (kv_empty), by TMA from lane 0 or by the
// warp's cp.async (rows past the sequence zero-filled).
template <class T, class Tr, class Smem>
__device__ __forceinline__ void produce_kv(const sm80::BwdParams& p, const BwdMaps& maps, const Smem& sm,
                                           uint64_t* kv_full, uint64_t* kv_empty, int ctas, int lane, bool tma) {
  using Work = BwdWork<Tr::kBlockM, Tr::kBlockN>;
  int n = 0;  // the CTA's tasks so far
  for (int cta = blockIdx.x; cta < ctas; cta += gridDim.x) {
    const Work w(p, cta);
    const sm80::BwdSeq& seq = w.seq;
    if (w.n0 >= seq.seqlen_k) continue;
    if (n >= 1) mbar_wait(kv_empty, (n - 1) & 1);
    if (tma) {
      if (lane == 0)
        tma_load_kv_block<T, Tr>(maps, kv_full, sm.k(), sm.v(), seq, w.n0, w.task.head_kv);
      else
        mbar_arrive(kv_full);
    } else {
      const T* k_tile = static_cast<const T*>(p.k) + sm80::bwd_offset(seq, seq.k_start, p.k_batch_stride,
                                                                      p.k_row_stride, p.k_head_stride, w.n0, w.task.head_kv);
      const T* v_tile = static_cast<const T*>(p.v) + sm80::bwd_offset(seq, seq.k_start, p.v_batch_stride,
                                                                      p.v_row_stride, p.v_head_stride, w.n0, w.task.head_kv);
      warp_load_tile<T, Tr::kBlockN, Tr::kDim>(sm.k(), k_tile, p.k_row_stride, seq.seqlen_k - w.n0, p, lane);
      warp_load_tile<T, Tr::kBlockN, Tr::kDim>(sm.v(), v_tile, p.v_row_stride, seq.seqlen_k - w.n0, p, lane);
      sm80::cp_async_commit();
      sm80::cp_async_wait<0>();
      sm80::fence_proxy_async_shared();  // K, V written by the generic proxy, read by the tensor cores
      mbar_arrive(kv_full);
    }
    ++n;
  }
}

// ---------------------------------------------------------------------------------------------
// The producer schedule: warpgroup 2 loads iteration j's q-block once the consumers are done with j - 2
// (q_full, q_empty) and, from another warp, adds dQ_i once staged (dq_full, dq_empty): a q-block's load never
// waits for a reduction's reads. The consumers' only barrier is the one before dQ.
// K_j, V_j come from the producer too (kv_full, kv_empty). The CTA runs the task grid's CTAs blockIdx.x,
// + gridDim.x, .. < ctas: one, unless the grid is persistent (BwdParams::persistent_ctas); every role
// counts its q-blocks and tasks over them, so the mbarriers' phases run on from task to task.
template <class T, int kHeadDim, bool kDropout>
__global__ void __launch_bounds__(384, 1)
    bwd_ws_kernel(const sm80::BwdParams p, const __grid_constant__ BwdMaps maps, int ctas) {
  using namespace sm80;
  using Tr = BwdTraits<T, kHeadDim>;
  using TileQ = typename Tr::TileQ;
  using Work = BwdWork<Tr::kBlockM, Tr::kBlockN>;
  constexpr int kBlockM = Tr::kBlockM, kDqStages = Tr::kDqStages;
  static_assert(Tr::kThreads == 384);

  extern __shared__ __align__(1024) unsigned char smem[];
  const BwdSmem<T, Tr> sm{smem};
  uint64_t* q_full = sm.bar();                 // [2]: Q_i, dO_i, lse_i, D_i in
  uint64_t* q_empty = q_full + 2;            // [2]: every consumer thread done with them
  uint64_t* dq_full = q_empty + 2;           // [kDqStages]: dQ_i staged
  uint64_t* dq_empty = dq_full + kDqStages;  // [kDqStages]: its reductions have read it
  uint64_t* kv_full = dq_empty + kDqStages;  // K_j, V_j in
  uint64_t* kv_empty = kv_full + 1;          // every consumer thread done with them

  const int tid = threadIdx.x, lane = tid % 32, warp_in_wg = (tid / 32) % 4;
  const int wg = FLASHATTN_SM90_BWD_UNIFORM_WG ? uniform_warpgroup_index() : tid / 128;
  const bool tma = maps.tma != 0, bulk_dq = !p.deterministic;

  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(&q_full[s], 32 + 32);  // the Q, dO warp (lane 0 with the TMA bytes) and the lse / D warp
      mbar_init(&q_empty[s], Tr::kConsumerThreads);
    }
    for (int s = 0; s < kDqStages; ++s) {
      mbar_init(&dq_full[s], Tr::kConsumerThreads);
      mbar_init(&dq_empty[s], 1);
    }
    mbar_init(kv_full, 32);  // the K, V warp's lanes (lane 0 with the bytes)
    mbar_init(kv_empty, Tr::kConsumerThreads);
    mbar_fence_init();
  }
  __syncthreads();  // the barriers initialized before any use; the last CTA-wide barrier

  if (wg == 2) {  // the producer
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp_in_wg == 0) {
      produce_q_do<T, Tr>(p, maps, sm, q_full, q_empty, ctas, lane, tma);
    } else if (warp_in_wg == 1) {
      produce_lse_d<Tr>(p, sm, q_full, q_empty, ctas, lane);
    } else if (warp_in_wg == 2 && lane == 0) {  // dQ_i added once staged (a warp of its own: no load waits on it)
      if (bulk_dq) {
        int i = 0;  // the CTA's q-blocks so far
        for (int cta = blockIdx.x; cta < ctas; cta += gridDim.x) {
          const Work w(p, cta);
          if (w.n0 >= w.seq.seqlen_k) continue;
          QBlockCursor reduce = w.first;
          for (int it = 0; it < w.num_iters; ++it, ++i, reduce.advance()) {
            const int stage = i % kDqStages, m0 = reduce.m_block * kBlockM;
            mbar_wait(&dq_full[stage], (i / kDqStages) & 1);
            const int64_t ws0 = int64_t(reduce.h) * p.rows_q + w.seq.ws_row + m0;
            bulk_reduce_dq_ops<kBlockM, kHeadDim, Tr::kDqBulkOps, 0, Tr::kDqBulkOps>(
                p.dq_accum + ws0 * kHeadDim, smem_addr(sm.dq(stage)), min(kBlockM, w.seq.seqlen_q - m0));
            bulk_wait_read<kDqStages - 1>();  // q-block i - (kDqStages - 1)'s tile read: free it
            if (i >= kDqStages - 1) mbar_arrive(&dq_empty[(i - (kDqStages - 1)) % kDqStages]);
          }
        }
        bulk_wait_read();  // shared memory must outlive the reads
      }
    } else if (warp_in_wg == 3) {
      produce_kv<T, Tr>(p, maps, sm, kv_full, kv_empty, ctas, lane, tma);
    }
    return;
  }

  setmaxnreg_inc<Tr::kConsumerRegs>();
  const int g = lane / 4, t = lane % 4;  // accumulator fragment coordinates (mma.sync's C layout)
  // This thread's rows: keys key_row (+ 8) of S^T, dP^T, dK, dV; dQ rows dq_row (+ 8) from column dq_d0.
  const int key_row = 64 * wg + 16 * warp_in_wg + g;
  const int dq_m0 = 64 * (wg % Tr::kDqWgM), dq_d0 = Tr::kDqN * (wg / Tr::kDqWgM);
  const WarpgroupAddrs<T, Tr> a(sm, wg, dq_m0, dq_d0);
  int itg = 0, n = 0;  // the CTA's q-blocks so far (buffer itg % 2, staging tile itg % kDqStages) and tasks
  for (int cta = blockIdx.x; cta < ctas; cta += gridDim.x) {
    const Work w(p, cta);
    const BwdSeq& seq = w.seq;
    const int seqlen_q = seq.seqlen_q, n0 = w.n0;
    if (n0 >= seq.seqlen_k) continue;
    mbar_wait(kv_full, n & 1);

    float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];
#pragma unroll
    for (int e = 0; e < kHeadDim / 2; ++e) acc_dk[e] = acc_dv[e] = 0.f;

    QBlockCursor cur = w.first;
    for (int it = 0; it < w.num_iters; ++it, ++itg) {
      const int buf = itg & 1, m0 = cur.m_block * kBlockM;
      const uint32_t q_buf = opaque(a.q + buf * TileQ::kBytes), do_buf = opaque(a.dout + buf * TileQ::kBytes);
      const uint32_t k_it = opaque(a.k), v_it = opaque(a.v);

      // S^T, dP^T once the q-block landed (the buffer's (itg / 2)-th load).
      mbar_wait(&q_full[buf], (itg >> 1) & 1);
      float s[kBlockM / 2], dp[kBlockM / 2];
      IssueOrder::before(key_row);
      issue_s_dp<Tr>(s, dp, k_it, v_it, q_buf, do_buf);
      IssueOrder::after(key_row);
      // Dropout's keep bits while S^T, dP^T compute: query tiles m0 / 16 + q of (sequence, query head), this
      // warp's key tile (one Philox call a tile, shared with the partner lane: sm80::dropout_keep).
      uint32_t keep[kBlockM / 16];
      if constexpr (kDropout)
        dropout_keep<kBlockM / 8>(p.dropout, keep, w.task.b * p.num_heads + cur.h, m0 / 16, (n0 + key_row - g) / 16, g, t);
      const BlockBand bb = block_band<kBlockM>(w.mask, seqlen_q, seq.seqlen_k, n0, w.n1, m0);
      const BandMask band{key_row, 2 * t, bb.lo, bb.hi, seq.seqlen_k - n0, seqlen_q - m0};
      uint32_t a_p[kBlockM / 16][4], a_ds[kBlockM / 16][4];
      probs_grads_operands<T, Tr, kDropout>(s, dp, sm.lse(buf) + 2 * t, sm.d(buf) + 2 * t, p, band, bb.need_mask, keep,
                                            a_p, a_ds);
      issue_dv_dk<Tr>(acc_dv, acc_dk, a_p, a_ds, q_buf, do_buf);
      store_ds_t<Tr>(smem_addr(sm.ds(buf)), wg, warp_in_wg, a_ds);
      ConsumerSync::sync();  // dS^T complete (both warpgroups' keys)

      float acc_dq[Tr::kDqN / 2];
      dq_product<Tr>(acc_dq, opaque(a.ds + buf * Tr::TileDs::kBytes), opaque(a.k_dq), acc_dv, acc_dk, a_p, a_ds);
      mbar_arrive(&q_empty[buf]);  // this thread is done with Q_i, dO_i (its warpgroup's products) and lse_i, D_i

      const int dq_row = dq_m0 + 16 * warp_in_wg + g;
      const int64_t ws0 = int64_t(cur.h) * p.rows_q + seq.ws_row + m0;  // the q-block's first accumulator row
      const int swz = sm80::dq_fragment_swizzle(ws0);                   // rows dq_row and dq_row + 8
      if (bulk_dq) {  // stage dQ_i for the producer's reductions, once they have read the stage's last tile
        const int stage = itg % kDqStages;
        if (itg >= kDqStages) mbar_wait(&dq_empty[stage], ((itg / kDqStages) - 1) & 1);
        stage_dq<Tr>(sm.dq(stage), dq_row, dq_d0, t, swz, acc_dq);
        mbar_arrive(&dq_full[stage]);
      } else {
        float* const dq_rows = p.dq_accum + ws0 * kHeadDim;
        const DqTurn turn = DqTurn::of<kBlockM, Tr::kBlockN>(p, w.mask, w.task.b, cur.h, cur.m_block, w.task.n_block);
        turn.wait(tid);
        add_dq_atomics<Tr>(dq_rows, seqlen_q - m0, dq_row, dq_d0, t, swz, acc_dq);
        turn.done(tid);
      }
      cur.advance();
    }
    // A piece of a split task writes dK, dV only if it finishes last. The thread's indices through an opaque
    // move: the addresses computed from them are the same for every task, and hoisted out of the task loop they
    // would stay live through the q-block loop (312 bytes of spills at 232 registers).
    const int tid_e = int(opaque(tid)), key_row_e = int(opaque(key_row)), t_e = int(opaque(t));
    // Whole tasks (not a split task's pieces) by TMA where it may write every row of the tile: +2-15% at 512-16k
    // keys against 64 four-byte stores a thread; skipping the stores (a diagnostic) read at most 6% more at 512-2k.
    const bool by_tma = tma && cta < p.tail_begin && (p.cu_seqlens_k == nullptr || n0 + Tr::kBlockN <= seq.seqlen_k);
    if (by_tma) {
      store_dk_dv_tma<T, Tr>(p, maps, sm.k(), sm.v(), seq, n0, w.task.head_kv, int(opaque(wg)),
                             int(opaque(warp_in_wg)), tid_e, acc_dk, acc_dv, kDropout ? p.dropout.scale : 1.f);
      mbar_arrive(kv_empty);  // (thread 0 once its stores have read K, V's tiles)
    } else {
      mbar_arrive(kv_empty);  // this thread's products are done with K, V (the last dQ product waited for)
      if (tail_sum<Tr::kConsumerThreads, kHeadDim / 2, ConsumerSync>(p, acc_dk, acc_dv, tid_e, cta))
        store_dk_dv<T, Tr>(p, seq, n0, w.task.head_kv, key_row_e, t_e, acc_dk, acc_dv, kDropout ? p.dropout.scale : 1.f);
    }
    ++n;
  }
}

}  // namespace flashattn::cuda::sm90
