// The Hopper backward for wide heads (head_dim 192 and 256): FA2's backward as in bwd_kernel.cuh (K/V blocks outer,
// P recomputed from the LSE, dQ added in fp32 across CTAs), with the warpgroups splitting the products
// instead of the keys. bwd_ws_kernel gives each consumer warpgroup 64 keys' dK and dV in registers, which at
// head_dim 256 is 2 x 64 x 256 / 128 = 256 floats a thread: more than a thread has. Here a CTA owns a k-block
// of 64 keys and runs q-blocks of 64 queries; warpgroup 0 follows P, warpgroup 1 follows dS:
//   warpgroup 0                              warpgroup 1
//   S^T  = K_j Q_i^T   (64 x 64, k = d)        dP^T = V_j dO_i^T  (64 x 64, k = d)     A, B K-major in smem
//   P^T = exp(S^T - lse), G = P^T [* softcap']  -> G (fp32) to shared memory ->   dS^T = G * (dP^T - D)
//   dV_j += P^T dO_i   (64 x d, k = 64)        dK_j += dS^T Q_i   (64 x d, k = 64)    A from registers
//                                              dS^T -> shared memory (16-bit)
//   dQ_i[:, 0 : 128] = dS K_j                  dQ_i[:, 128 : d] = dS K_j            (k = 64 keys)
// so each thread keeps 128 floats of dV (warpgroup 0) or dK (warpgroup 1), and no product is computed twice.
// dV's product runs on the tensor cores while warpgroup 1 computes dS^T. Shared memory at head_dim 256: K_j, V_j
// (64 KB), two stages of Q_i, dO_i (128 KB), dS^T (8 KB), G (16 KB), lse, D: 217 KB. dQ_i (64 x 256 fp32) has no room
// of its own: once both warpgroups are done with Q_i, dO_i it is staged over them, and the producer's bulk
// reductions free the stage for Q_{i+2}, dO_{i+2}. The producer warpgroup (loads, reductions), the task loop,
// masking, GQA loop, dropout, deterministic order and the last wave's pieces are bwd_ws_kernel's; ALiBi is this
// kernel's alone, in an instance of its own (bwd_ws_kernel leaves it to the sm80 backward).
#pragma once

#include "cuda/sm90/bwd_kernel.cuh"

// Dev switch: dV's or dK's product waited for before dQ's is issued (1), or with it (0). Waiting first frees
// P^T's or dS^T's registers for dQ's accumulator: without it ptxas serializes the wgmma (C7512) unless the
// consumers have 240 registers, and the producer's 24 then spill 216 bytes.
#ifndef FLASHATTN_SM90_BWD_WIDE_RS_WAIT
#define FLASHATTN_SM90_BWD_WIDE_RS_WAIT 1
#endif
// Dev switch: warpgroup 1 issues dP^T after warpgroup 0 has issued S^T (1), or both at once (0). The tensor cores
// take the products in issue order, so S^T is done first and P^T, G are computed while dP^T runs.
#ifndef FLASHATTN_SM90_BWD_WIDE_ISSUE_ORDER
#define FLASHATTN_SM90_BWD_WIDE_ISSUE_ORDER 1
#endif

namespace flashattn::cuda::sm90 {

template <class T, int kHeadDim>
struct BwdWideTraits : BwdTraitsBase<T, kHeadDim> {
  using Base = BwdTraitsBase<T, kHeadDim>;
  using typename Base::TileDs, typename Base::TileKV, typename Base::TileQ;
  using Base::kBlockM, Base::kBlockN, Base::kConfig;
  static_assert(kConfig.wide == 1 && kBlockM == 64 && kBlockN == 64, "one 64 x 64 accumulator a warpgroup");
  // dQ_i's columns: warpgroup 0 the first kDqN0, warpgroup 1 the other kDqN1 (whole 64-column panels: a wgmma
  // operand cannot start inside a swizzled row; 128 + 64 at head_dim 192).
  static constexpr int kDqN0 = 128, kDqN1 = kHeadDim - kDqN0;
  static constexpr int kTiles = kBlockM / 8;     // n8 tiles of a thread's S^T or dP^T fragment
  static_assert(kHeadDim % 64 == 0 && kDqN1 > 0 && kDqN1 <= kDqN0, "head_dim 192 or 256");
  // A stage: Q_i then dO_i; after the products, dQ_i's fp32 staging tile [block_m][head_dim] in the
  // accumulator's layout (sm80::dq_swizzle), added by 16 bulk reductions of 4 rows.
  static constexpr int kStageBytes = 2 * TileQ::kBytes, kDqBulkOps = 16;
  static_assert(kBlockM * kHeadDim * 4 == kStageBytes, "dQ_i's staging tile is the stage");
  static constexpr int kGBytes = kBlockN * kBlockM * 4;
  // The mbarriers: q_full[2], q_empty[2], dq_full[2], kv_full, kv_empty.
  static constexpr int kBarriers = 8;
  static constexpr int kSmemBytes =
      2 * TileKV::kBytes + 2 * kStageBytes + TileDs::kBytes + kGBytes + 4 * kBlockM * 4 + kBarriers * 8;
  static_assert(kSmemBytes <= 227 * 1024, "the H100's shared memory");
};

// The shared memory of BwdWideTraits: each region at its offset from the base.
template <class T, class Tr>
struct BwdWideSmem {
  unsigned char* base;
  static constexpr int kStage = 2 * Tr::TileKV::kBytes, kDs = kStage + 2 * Tr::kStageBytes;
  static constexpr int kG = kDs + Tr::TileDs::kBytes, kLse = kG + Tr::kGBytes;
  static constexpr int kD = kLse + 2 * Tr::kBlockM * 4, kBar = kD + 2 * Tr::kBlockM * 4;
  __device__ __forceinline__ T* k() const { return reinterpret_cast<T*>(base); }
  __device__ __forceinline__ T* v() const { return reinterpret_cast<T*>(base + Tr::TileKV::kBytes); }
  __device__ __forceinline__ T* q(int buf) const { return reinterpret_cast<T*>(base + kStage + buf * Tr::kStageBytes); }
  __device__ __forceinline__ T* dout(int buf) const {
    return reinterpret_cast<T*>(base + kStage + buf * Tr::kStageBytes + Tr::TileQ::kBytes);
  }
  __device__ __forceinline__ float* dq(int buf) const { return reinterpret_cast<float*>(q(buf)); }
  __device__ __forceinline__ T* ds() const { return reinterpret_cast<T*>(base + kDs); }
  __device__ __forceinline__ float* g() const { return reinterpret_cast<float*>(base + kG); }
  __device__ __forceinline__ float* lse(int buf) const { return reinterpret_cast<float*>(base + kLse) + buf * Tr::kBlockM; }
  __device__ __forceinline__ float* d(int buf) const { return reinterpret_cast<float*>(base + kD) + buf * Tr::kBlockM; }
  __device__ __forceinline__ uint64_t* bar() const { return reinterpret_cast<uint64_t*>(base + kBar); }
  static_assert(kBar + Tr::kBarriers * 8 == Tr::kSmemBytes, "the layout of kSmemBytes");
};

// Warpgroup 0 hands G to warpgroup 1 on named barrier 2 (ConsumerSync is 1), and orders the issue of S^T before
// dP^T on 3 (FLASHATTN_SM90_BWD_WIDE_ISSUE_ORDER). Neither runs ahead by an iteration: ConsumerSync follows both.
constexpr int kGReadyBarrier = 2, kIssueOrderBarrier = 3;

// S^T = K_j Q_i^T (warpgroup 0) or dP^T = V_j dO_i^T (1), 64 x 64, issued as one wgmma group.
template <class Tr>
__device__ __forceinline__ void issue_s_or_dp(float (&acc)[Tr::kBlockM / 2], uint32_t kv, uint32_t q_or_dout) {
  const SmemDesc desc_a = kmajor_desc(kv), desc_b = kmajor_desc(q_or_dout);
  wgmma_fence();
  kmajor_product<Tr>(acc, desc_a, desc_b);
  wgmma_commit();
}

// Warpgroup 0's half of sm80::probs_and_grads: P^T = exp2(S^T * scale * log2 e - bias - lse * log2 e) in place of
// s, and G = P^T [* (1 - tanh^2) with softcap] to shared memory, one float4 a (warp, n8 tile, lane): the fragment
// warpgroup 1's thread of the same warp and lane holds of dP^T. Masked elements: P = G = 0. bias: ALiBi's
// slope * |diag - (row - col)| in log2 units (band's alibi fields), in kAlibi's general path only.
template <bool kGeneral, int kTiles, bool kAlibi = false>
__device__ __forceinline__ void probs_part(float (&s)[kTiles][4], float4* g_frag, const float* lse_cols,
                                           const sm80::BwdParams& p, const sm80::BandMask& band, bool masked) {
  const float alibi_first = float(band.alibi_diag - band.row0 + band.col0);
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    const float2 l = *reinterpret_cast<const float2*>(lse_cols + nt * 8);
    const float lse_log2[2] = {l.x * sm80::kLog2e, l.y * sm80::kLog2e};
    float g[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = e & 1;
      const float bias =
          kGeneral && kAlibi ? band.alibi_slope_log2 * fabsf(alibi_first + float(nt * 8 + j - 8 * (e >> 1))) : 0.f;
      float pv, gv;
      if (kGeneral && p.softcap > 0.f) {
        const float th = cuda::softcap_tanh(s[nt][e] * p.softcap_inv);
        pv = sm80::exp2_fast(p.softcap * sm80::kLog2e * th - bias - lse_log2[j]);
        gv = pv * (1.f - th * th);
      } else {
        pv = gv = sm80::exp2_fast(s[nt][e] * p.scale_log2 - bias - lse_log2[j]);
      }
      if (kGeneral && masked && !band.visible(band.row0 + 8 * (e >> 1), band.col0 + nt * 8 + j)) pv = gv = 0.f;
      s[nt][e] = pv;
      g[e] = gv;
    }
    g_frag[nt * 32] = make_float4(g[0], g[1], g[2], g[3]);
  }
}

// Warpgroup 1's half: dS^T = G * (dP^T - D) in place of dp (dP^T already dropout-scaled).
template <int kTiles>
__device__ __forceinline__ void grads_part(float (&dp)[kTiles][4], const float4* g_frag, const float* dsum_cols) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    const float2 dd = *reinterpret_cast<const float2*>(dsum_cols + nt * 8);
    const float4 g = g_frag[nt * 32];
    dp[nt][0] = g.x * (dp[nt][0] - dd.x);
    dp[nt][1] = g.y * (dp[nt][1] - dd.y);
    dp[nt][2] = g.z * (dp[nt][2] - dd.x);
    dp[nt][3] = g.w * (dp[nt][3] - dd.y);
  }
}

// dV_j += P^T dO_i (warpgroup 0) or dK_j += dS^T Q_i (warpgroup 1): A from registers (k16 step kk = queries
// 16 kk ..), B = dO_i or Q_i MN-major over all head_dim columns.
template <class Tr>
__device__ __forceinline__ void issue_rs_64xd(float (&acc)[Tr::kDim / 2], const uint32_t (&a)[Tr::kBlockM / 16][4],
                                              uint32_t b) {
  using Mma = Wgmma<Tr::kDim, Tr::kBf16>;
  const SmemDesc desc_b = mnmajor_desc(b, Tr::kQPanel);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockM / 16; ++kk) Mma::template rs<1>(acc, a[kk], desc_b.at(kk * 2048), 1);
  wgmma_commit();
}

// Every product issued so far done (acc and a read by the tensor cores until here).
template <class Tr>
__device__ __forceinline__ void wait_products(float (&acc)[Tr::kDim / 2], uint32_t (&a)[Tr::kBlockM / 16][4]) {
  wgmma_wait<0>();
  fence_registers(acc);
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockM / 16; ++kk) fence_registers(a[kk]);
}

// The traits of a warpgroup's part of dQ_i, kN columns, for bwd_kernel.cuh's stage_dq and add_dq_atomics.
template <class Tr, int kN>
struct DqPart {
  static constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kDim = Tr::kDim, kDqN = kN;
};

// This warpgroup's part of dQ_i = dS K_j (64 x kN from column k's panel, over the 64 keys), waited for with
// every product (acc, a: fenced, read by the tensor cores until here).
template <class Tr, int kN>
__device__ __forceinline__ void dq_part_product(float (&acc_dq)[kN / 2], uint32_t ds, uint32_t k,
                                                float (&acc)[Tr::kDim / 2], uint32_t (&a)[Tr::kBlockM / 16][4]) {
  using Mma = Wgmma<kN, Tr::kBf16>;
  const SmemDesc desc_ds = mnmajor_desc(ds, Tr::kDsPanel), desc_k = mnmajor_desc(k, Tr::kKVPanel);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockN / 16; ++kk)
    Mma::template ss<1, 1>(acc_dq, desc_ds.at(kk * 2048), desc_k.at(kk * 2048), kk > 0);
  wgmma_commit();
  wait_products<Tr>(acc, a);
  fence_registers(acc_dq);
}

// dV_j (warpgroup 0) or dK_j (warpgroup 1) times scale, staged over V_j or K_j (tile) in the tiles' layout by
// stmatrix; the caller stores both tiles by TMA.
template <class T, class Tr>
__device__ __forceinline__ void stage_dkv(T* tile, int warp_in_wg, const float (&acc)[Tr::kDim / 2], float scale) {
  uint32_t lane_v;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_v));
  const sm80::WarpCursor<Tr::kBlockN, Tr::kDim> cur(smem_addr(tile), 16 * warp_in_wg + lane_v % 16, lane_v / 16, 0);
#pragma unroll
  for (int kk = 0; kk < Tr::kDim / 16; ++kk) {
    const float* a8 = acc + 8 * kk;
    stmatrix_x4(cur.at(0, 16 * kk), sm80::pack2<T>(a8[0] * scale, a8[1] * scale), sm80::pack2<T>(a8[2] * scale, a8[3] * scale),
                sm80::pack2<T>(a8[4] * scale, a8[5] * scale), sm80::pack2<T>(a8[6] * scale, a8[7] * scale));
  }
}

// dV_j or dK_j times scale from registers: rows key_row, key_row + 8 of dst (rows past seqlen_k and padded
// columns dropped).
template <class T, class Tr>
__device__ __forceinline__ void store_dkv_rows(T* dst, int64_t row_stride, int rows_valid, const sm80::BwdParams& p,
                                               int key_row, int t, const float (&acc)[Tr::kDim / 2], float scale) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = key_row + 8 * i;
    if (row >= rows_valid) continue;
#pragma unroll
    for (int n = 0; n < Tr::kDim / 8; ++n)
      sm80::store2<T>(dst + int64_t(row) * row_stride, 8 * n + 2 * t, p.head_dim, acc[4 * n + 2 * i] * scale,
                      acc[4 * n + 2 * i + 1] * scale, p.vectorized != 0);
  }
}

// The producer as in bwd_ws_kernel (Q_i, dO_i; lse_i, D_i; K_j, V_j), except that the dQ warp frees a stage
// (q_empty, one arrival) once its reductions have read dQ_i staged there, or at once in deterministic mode
// (the consumers added dQ_i themselves). The consumers' barriers each iteration: G ready (warpgroup 0 to 1), dS^T
// stored, both done with the stage. kDropout, kAlibi: the instances for dropout and for ALiBi (p.alibi_slopes;
// sm90 does not take both), each in a translation unit of its own, so that the plain kernel's code stays as it is.
template <class T, int kHeadDim, bool kDropout, bool kAlibi>
__global__ void __launch_bounds__(384, 1)
    bwd_wide_kernel(const sm80::BwdParams p, const __grid_constant__ BwdMaps maps, int ctas) {
  static_assert(!(kDropout && kAlibi), "dropout with ALiBi runs the sm80 backward");
  using namespace sm80;
  using Tr = BwdWideTraits<T, kHeadDim>;
  using Work = BwdWork<Tr::kBlockM, Tr::kBlockN>;
  constexpr int kBlockM = Tr::kBlockM;

  extern __shared__ __align__(1024) unsigned char smem[];
  const BwdWideSmem<T, Tr> sm{smem};
  uint64_t* q_full = sm.bar();       // [2]: Q_i, dO_i, lse_i, D_i in
  uint64_t* q_empty = q_full + 2;    // [2]: dQ_i staged there has been read (or added by the consumers)
  uint64_t* dq_full = q_empty + 2;   // [2]: dQ_i staged (or added)
  uint64_t* kv_full = dq_full + 2;   // K_j, V_j in
  uint64_t* kv_empty = kv_full + 1;  // every consumer thread done with them

  const int tid = threadIdx.x, lane = tid % 32, warp_in_wg = (tid / 32) % 4;
  const int wg = uniform_warpgroup_index();
  const bool tma = maps.tma != 0, bulk_dq = !p.deterministic;

  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(&q_full[s], 32 + 32);  // the Q, dO warp (lane 0 with the TMA bytes) and the lse / D warp
      mbar_init(&q_empty[s], 1);
      mbar_init(&dq_full[s], Tr::kConsumerThreads);
    }
    mbar_init(kv_full, 32);
    mbar_init(kv_empty, Tr::kConsumerThreads);
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 2) {  // the producer
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp_in_wg == 0) {  // Q_j, dO_j into stage j % 2 once dQ_{j-2} staged there has been read
      produce_q_do<T, Tr>(p, maps, sm, q_full, q_empty, ctas, lane, tma);
    } else if (warp_in_wg == 1) {
      produce_lse_d<Tr>(p, sm, q_full, q_empty, ctas, lane);
    } else if (warp_in_wg == 2 && lane == 0) {  // dQ_i added from its stage, then the stage freed
      int i = 0;
      for (int cta = blockIdx.x; cta < ctas; cta += gridDim.x) {
        const Work w(p, cta);
        if (w.n0 >= w.seq.seqlen_k) continue;
        QBlockCursor reduce = w.first;
        for (int it = 0; it < w.num_iters; ++it, ++i, reduce.advance()) {
          const int buf = i & 1, m0 = reduce.m_block * kBlockM;
          mbar_wait(&dq_full[buf], (i >> 1) & 1);
          if (bulk_dq) {
            const int64_t ws0 = int64_t(reduce.h) * p.rows_q + w.seq.ws_row + m0;
            bulk_reduce_dq_ops<kBlockM, kHeadDim, Tr::kDqBulkOps, 0, Tr::kDqBulkOps>(
                p.dq_accum + ws0 * kHeadDim, smem_addr(sm.dq(buf)), min(kBlockM, w.seq.seqlen_q - m0));
            bulk_wait_read<0>();
          }
          mbar_arrive(&q_empty[buf]);
        }
      }
    } else if (warp_in_wg == 3) {
      produce_kv<T, Tr>(p, maps, sm, kv_full, kv_empty, ctas, lane, tma);
    }
    return;
  }

  setmaxnreg_inc<Tr::kConsumerRegs>();
  const int g = lane / 4, t = lane % 4;
  // This thread's rows: keys key_row (+ 8) of S^T or dP^T and of dV or dK; queries key_row (+ 8) of dQ_i, its
  // warpgroup's columns from dq_d0.
  const int key_row = 16 * warp_in_wg + g, dq_d0 = Tr::kDqN0 * wg;
  const uint32_t a_kv = smem_addr(wg == 0 ? sm.k() : sm.v());  // S^T's A, or dP^T's
  const uint32_t k_dq = smem_addr(sm.k()) + (dq_d0 / 64) * Tr::kKVPanel;
  const uint32_t stage0 = smem_addr(sm.q(0)), ds_addr = smem_addr(sm.ds());
  float4* const g_frag = reinterpret_cast<float4*>(sm.g()) + warp_in_wg * Tr::kTiles * 32 + lane;
  int itg = 0, n = 0;  // the CTA's q-blocks so far (stage itg % 2) and tasks
  for (int cta = blockIdx.x; cta < ctas; cta += gridDim.x) {
    const Work w(p, cta);
    const BwdSeq& seq = w.seq;
    const int seqlen_q = seq.seqlen_q, n0 = w.n0;
    if (n0 >= seq.seqlen_k) continue;
    mbar_wait(kv_full, n & 1);

    float acc[kHeadDim / 2];  // dV_j (warpgroup 0) or dK_j (1): rows key_row, + 8
#pragma unroll
    for (int e = 0; e < kHeadDim / 2; ++e) acc[e] = 0.f;

    QBlockCursor cur = w.first;
    for (int it = 0; it < w.num_iters; ++it, ++itg) {
      const int buf = itg & 1, m0 = cur.m_block * kBlockM;
      const uint32_t q_buf = opaque(stage0 + buf * Tr::kStageBytes), do_buf = q_buf + Tr::TileQ::kBytes;

      // S^T (warpgroup 0) or dP^T (1) once the q-block landed.
      mbar_wait(&q_full[buf], (itg >> 1) & 1);
      float sp[kBlockM / 2];
      if (FLASHATTN_SM90_BWD_WIDE_ISSUE_ORDER && wg == 1) named_barrier_sync(kIssueOrderBarrier, Tr::kConsumerThreads);
      issue_s_or_dp<Tr>(sp, opaque(a_kv), wg == 0 ? q_buf : do_buf);
      if (FLASHATTN_SM90_BWD_WIDE_ISSUE_ORDER && wg == 0) named_barrier_arrive(kIssueOrderBarrier, Tr::kConsumerThreads);
      uint32_t keep[kBlockM / 16];
      if constexpr (kDropout)
        dropout_keep<kBlockM / 8>(p.dropout, keep, w.task.b * p.num_heads + cur.h, m0 / 16, (n0 + key_row - g) / 16, g, t);
      wgmma_wait<0>();
      fence_registers(sp);
      auto& tiles = reinterpret_cast<float(&)[Tr::kTiles][4]>(sp);
      if (wg == 0) {  // P^T, and G for warpgroup 1
        const BlockBand bb = block_band<kBlockM>(w.mask, seqlen_q, seq.seqlen_k, n0, w.n1, m0);
        BandMask band{key_row, 2 * t, bb.lo, bb.hi, seq.seqlen_k - n0, seqlen_q - m0};
        if constexpr (kAlibi) {  // the slope of (sequence, query head), the block's diagonal; every block general
          band.alibi_slope_log2 = p.alibi_slopes[w.task.b * p.alibi_slopes_batch_stride + cur.h] * kLog2e;
          band.alibi_diag = seq.seqlen_k - seqlen_q - (n0 - m0);
          probs_part<true, Tr::kTiles, true>(tiles, g_frag, sm.lse(buf) + 2 * t, p, band, bb.need_mask);
        } else if (bb.need_mask || p.softcap > 0.f) {
          probs_part<true>(tiles, g_frag, sm.lse(buf) + 2 * t, p, band, bb.need_mask);
        } else {
          probs_part<false>(tiles, g_frag, sm.lse(buf) + 2 * t, p, band, false);
        }
        named_barrier_arrive(kGReadyBarrier, Tr::kConsumerThreads);
        if constexpr (kDropout) dropout_p<Tr::kTiles>(tiles, keep);
      } else {  // dS^T
        if constexpr (kDropout) dropout_dp<Tr::kTiles>(tiles, keep, p.dropout.scale);
        named_barrier_sync(kGReadyBarrier, Tr::kConsumerThreads);
        grads_part<Tr::kTiles>(tiles, g_frag, sm.d(buf) + 2 * t);
      }
      uint32_t a16[kBlockM / 16][4];  // P^T or dS^T as the A operand (k16 step kk: queries 16 kk ..)
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) a16[kk][r] = sm80::pack2<T>(sp[8 * kk + 2 * r], sp[8 * kk + 2 * r + 1]);
      issue_rs_64xd<Tr>(acc, a16, wg == 0 ? do_buf : q_buf);  // dV += P^T dO_i, or dK += dS^T Q_i
      if (wg == 1) store_ds_t<Tr>(ds_addr, 0, warp_in_wg, a16);
      if (FLASHATTN_SM90_BWD_WIDE_RS_WAIT) wait_products<Tr>(acc, a16);
      ConsumerSync::sync();  // dS^T stored

      // This warpgroup's columns of dQ_i (kDqN0 or kDqN1: two instances where they differ, the barriers outside
      // them, each one instruction for every consumer thread), staged over the stage once both are done with
      // Q_i, dO_i, or added in this k-block's turn.
      float acc_dq[Tr::kDqN0 / 2];
      auto& acc_dq1 = reinterpret_cast<float(&)[Tr::kDqN1 / 2]>(acc_dq[0]);
      const bool part0 = Tr::kDqN1 == Tr::kDqN0 || wg == 0;
      if (part0) dq_part_product<Tr, Tr::kDqN0>(acc_dq, opaque(ds_addr), opaque(k_dq), acc, a16);
      else dq_part_product<Tr, Tr::kDqN1>(acc_dq1, opaque(ds_addr), opaque(k_dq), acc, a16);
      const int64_t ws0 = int64_t(cur.h) * p.rows_q + seq.ws_row + m0;
      const int swz = sm80::dq_fragment_swizzle(ws0);
      if (bulk_dq) {
        ConsumerSync::sync();  // both warpgroups done with Q_i, dO_i: the stage takes dQ_i
        if (part0) stage_dq<DqPart<Tr, Tr::kDqN0>>(sm.dq(buf), key_row, dq_d0, t, swz, acc_dq);
        else stage_dq<DqPart<Tr, Tr::kDqN1>>(sm.dq(buf), key_row, dq_d0, t, swz, acc_dq1);
      } else {
        float* const dq_rows = p.dq_accum + ws0 * kHeadDim;
        const DqTurn turn = DqTurn::of<kBlockM, Tr::kBlockN>(p, w.mask, w.task.b, cur.h, cur.m_block, w.task.n_block);
        turn.wait(tid);
        if (part0) add_dq_atomics<DqPart<Tr, Tr::kDqN0>>(dq_rows, seqlen_q - m0, key_row, dq_d0, t, swz, acc_dq);
        else add_dq_atomics<DqPart<Tr, Tr::kDqN1>>(dq_rows, seqlen_q - m0, key_row, dq_d0, t, swz, acc_dq1);
        turn.done(tid);
      }
      mbar_arrive(&dq_full[buf]);
      cur.advance();
    }
    // dV_j, dK_j out: by TMA where the task is whole and may write every row of the tile (as bwd_ws_kernel).
    const int tid_e = int(opaque(tid)), key_row_e = int(opaque(key_row)), t_e = int(opaque(t));
    const float scale = wg == 0 ? (kDropout ? p.dropout.scale : 1.f) : p.softmax_scale;
    const bool by_tma = tma && cta < p.tail_begin && (p.cu_seqlens_k == nullptr || n0 + Tr::kBlockN <= seq.seqlen_k);
    if (by_tma) {
      ConsumerSync::sync();  // every product is done with K_j, V_j
      stage_dkv<T, Tr>(wg == 0 ? sm.v() : sm.k(), int(opaque(warp_in_wg)), acc, scale);
      fence_proxy_async_shared();
      ConsumerSync::sync();
      if (tid_e == 0) {
        const int row = int(seq.k_start) + n0, batch = int(seq.batch_q);
#pragma unroll
        for (int c = 0; c < kHeadDim / 64; ++c) {
          tma_store_4d(&maps.dk, sm.k() + c * Tr::kBlockN * 64, 64 * c, row, w.task.head_kv, batch);
          tma_store_4d(&maps.dv, sm.v() + c * Tr::kBlockN * 64, 64 * c, row, w.task.head_kv, batch);
        }
        bulk_commit_group();
        bulk_wait_group_0<true>();
      }
      mbar_arrive(kv_empty);
    } else {
      mbar_arrive(kv_empty);
      // A piece of a split task adds its partials; the last to finish stores the sums.
      auto& lo = reinterpret_cast<float(&)[kHeadDim / 4]>(acc[0]);
      auto& hi = reinterpret_cast<float(&)[kHeadDim / 4]>(acc[kHeadDim / 4]);
      if (tail_sum<Tr::kConsumerThreads, kHeadDim / 4, ConsumerSync>(p, lo, hi, tid_e, cta)) {
        const int head_kv = w.task.head_kv;
        T* dst = wg == 0 ? static_cast<T*>(p.dv) + bwd_offset(seq, seq.k_start, p.dv_batch_stride, p.dv_row_stride,
                                                               p.dv_head_stride, n0, head_kv)
                         : static_cast<T*>(p.dk) + bwd_offset(seq, seq.k_start, p.dk_batch_stride, p.dk_row_stride,
                                                               p.dk_head_stride, n0, head_kv);
        store_dkv_rows<T, Tr>(dst, wg == 0 ? p.dv_row_stride : p.dk_row_stride, seq.seqlen_k - n0, p, key_row_e, t_e,
                              acc, scale);
      }
    }
    ++n;
  }
}

}  // namespace flashattn::cuda::sm90
