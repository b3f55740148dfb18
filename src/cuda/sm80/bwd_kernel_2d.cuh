// FA2 backward main kernel with 2D warp tiles (config layout 1), the FlashAttention-2 work split:
// same algorithm, skipping, masking, GQA and deterministic order as bwd_main_kernel (bwd_kernel.cuh),
// but every product is tiled over all the warps in 32- or 64-row warp tiles, and P^T, dS^T both go
// through shared memory:
//   S^T, dP^T (block_n x block_m)  warps (block_n / s_keys) x rest, A = K_j, V_j, B = Q_i, dO_i
//   P^T, dS^T -> shared memory (16-bit, swizzled)
//   dV, dK (block_n x head_dim)    warps (block_n / 32) x rest, A = P^T, dS^T, B = dO_i, Q_i (.trans)
//   dQ (block_m x head_dim)        warps (block_m / 32) x rest, A = dS (dS^T .trans), B = K_j (.trans)
// Each ldmatrix fragment feeds 2 or more mma (32-row A tiles), and a warp holds 1 / warps of each
// accumulator instead of 16 whole key rows.
#pragma once

#include "cuda/sm80/bwd_kernel.cuh"

namespace flashattn::sm80 {

// On sm_90 the dQ partial of a q-block leaves through shared memory and bulk reductions
// (cp.reduce.async.bulk ... add.f32 of a few rows each, issued by the TMA unit) instead of fp32 atomics
// from registers: ncu showed the 16 vector atomics per thread and iteration holding their address
// registers until the congested LSU read them (12% of stall samples). Deterministic mode keeps the
// ordered atomics. The host adds the staging tile to the shared memory when the device is sm_90.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FLASHATTN_BWD_BULK_DQ 1
#else
#define FLASHATTN_BWD_BULK_DQ 0
#endif

// global[0, bytes) += shared[0, bytes) in fp32, asynchronously (bytes a multiple of 16, both
// 16-byte aligned), into this thread's open bulk group; bulk_commit closes the group.
__device__ __forceinline__ void bulk_reduce_add_f32_issue(float* gmem, uint32_t smem, uint32_t bytes) {
#if FLASHATTN_BWD_BULK_DQ
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem), "r"(smem),
               "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if FLASHATTN_BWD_BULK_DQ
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// The same, one bulk group per call.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, uint32_t smem, uint32_t bytes) {
  bulk_reduce_add_f32_issue(gmem, smem, bytes);
  bulk_commit();
}
// dq[rows x kHeadDim] += the staging tile's first `rows` rows (both in the accumulator's swizzled
// layout) in kOps bulk reductions of ceil(kBlockM / kOps) rows each, issued by threads 0 .. kOps - 1.
template <int kBlockM, int kHeadDim, int kOps>
__device__ __forceinline__ void bulk_reduce_dq(float* dq, uint32_t smem, int rows, int tid) {
  constexpr int kRowsPerOp = (kBlockM + kOps - 1) / kOps;
  const int r0 = tid * kRowsPerOp, r1 = min(r0 + kRowsPerOp, rows);
  if (tid < kOps && r0 < r1)
    bulk_reduce_add_f32(dq + r0 * kHeadDim, smem + r0 * kHeadDim * 4, uint32_t(r1 - r0) * kHeadDim * 4);
}
// dq_swizzle of this thread's mma fragment rows (lane / 4, + multiples of 4) of a q-block whose first
// accumulator row is ws0. The lane index is read here (volatile): one derived from threadIdx before the
// loop stayed live through the products and made ptxas spill (sm90 head_dim 64: 216 bytes, not 100).
__device__ __forceinline__ int dq_fragment_swizzle(int64_t ws0) {
  uint32_t lane;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
  return dq_swizzle(ws0 + lane / 4);
}
// This thread's bulk groups but the newest kPending have read their shared memory (.read).
template <int kPending = 0>
__device__ __forceinline__ void bulk_wait_read() {
#if FLASHATTN_BWD_BULK_DQ
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Orders this thread's ordinary shared-memory writes before later reads by the async (TMA) proxy.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if FLASHATTN_BWD_BULK_DQ
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

template <class T, int kHeadDim>
struct Bwd2dTraits {
  static constexpr BwdConfig kConfig = bwd_config(kHeadDim);
  static_assert(kConfig.head_dim == kHeadDim && kConfig.layout == 1 && bwd_config_ok(kConfig), "not a layout-1 config");
  static constexpr int kBlockM = kConfig.block_m, kBlockN = kConfig.block_n, kWarps = kConfig.warps;
  static constexpr int kThreads = 32 * kWarps;
  // dK, dV: kWarpsN warps over the keys (32 each) x kWarpsX over head_dim.
  static constexpr int kWarpsN = kBlockN / 32, kWarpsX = kWarps / kWarpsN;
  static constexpr int kKvCols = kHeadDim / kWarpsX;
  // S^T, dP^T: kSWarpsN warps over the keys (kSKeys each, kSMi m16 tiles) x kSWarpsX over queries.
  // head_dim 64 takes 64 x 32 warp tiles (FA2's 32 x 64 of S, transposed): a k-step's 6 ldmatrix
  // feed 16 mma, where two passes of a 32 x 64 tile needed 8 (K, V fragments loaded twice); +1-2.5%
  // (dev/sm80bwd/NOTES.md, session 17).
  static constexpr int kSKeys = kConfig.s_keys, kSMi = kSKeys / 16;
  static constexpr int kSWarpsN = kBlockN / kSKeys, kSWarpsX = kWarps / kSWarpsN;
  static constexpr int kSCols = kBlockM / kSWarpsX;
  // S^T and dP^T of the warp tile in registers beside dK, dV: a 32 x 64 tile spilled 120 bytes
  // (head_dim 64; it ran in two passes of 32 query columns until session 17).
  static_assert(kSCols <= 32, "S^T, dP^T warp tiles of at most 32 query columns");
  // P^T, dS^T stored at one per-thread offset and compile-time XOR / add steps (bwd_main_2d_kernel)
  // instead of the swizzled offset per fragment (~110 integer instructions a warp and iteration at
  // head_dim 64, ncu): +5% at head_dim 64 (16 fragments a warp). At head_dim 128 (8) ptxas spills
  // with it (72 bytes beside the incremental tile offsets) and it gained nothing (dev/sm80bwd/NOTES.md).
  static constexpr bool kXorStores = kSMi * kSCols / 8 >= 16;
  // dQ: kDqWarpsM warps over the queries (32 each) x kDqWarpsD over head_dim.
  static constexpr int kDqWarpsM = kBlockM / 32, kDqWarpsD = kWarps / kDqWarpsM, kDqCols = kHeadDim / kDqWarpsD;
  using TileKV = SmemTile<kBlockN, kHeadDim>;  // K_j, V_j
  using TileQ = SmemTile<kBlockM, kHeadDim>;   // Q_i, dO_i
  using TileP = SmemTile<kBlockN, kBlockM>;    // P^T, dS^T
  // Q_i, dO_i, lse_i, D_i buffers: 2, q-block i + 1 loading while i computes; 1 where two do not fit the A100
  // (head_dim 256), q-block i + 1 then loading once every warp is past dK += dS^T Q_i, under dQ_i = dS K.
  static constexpr int kQStages = kConfig.stages;
  static constexpr int kSmemBytes = bwd_smem_bytes(kConfig);
  static_assert(kSmemBytes ==
                2 * TileKV::kBytes + 2 * kQStages * TileQ::kBytes + 2 * TileP::kBytes + 2 * kQStages * kBlockM * 4);
  // sm_90 dQ staging tiles [block_m][head_dim] fp32 after those, in the accumulator's layout (dq_swizzle),
  // added by 64 bulk reductions (2 rows each at head_dim 64, 1 at 128): 1-3% faster than 128 one-row
  // ones (before the swizzle), 3-5% faster than 8 or 16, about 5% faster than one (dev/sm80bwd/NOTES.md).
  // Warps 0-1 issue them (a lane at a time), while the other warps wait at the next barrier.
  // One tile (head_dim 128): iteration it + 1 issues the reductions of it after its first barrier, and
  //   they have read the tile by its mid barrier, after which it is staged again.
  // Two tiles, dq_late (head_dim 64): issued after the mid barrier, where every warp's ldmatrix
  //   burst of dV, dK, dQ stalls on the MIO queue anyway (ncu: the barrier wait they caused was 6% of
  //   the samples), with a whole iteration to read their tile: +3-4% at head_dim 64; 2% slower at 128
  //   (dev/sm80bwd/NOTES.md, session 18). Two tiles with the early issue read even or slower at 128
  //   (16k -2%) and 2-4% slower at 64 (session 19).
  static constexpr int kDqStages = kConfig.dq_stages, kDqTileFloats = kBlockM * kHeadDim;
  static constexpr bool kDqIssueLate = kConfig.dq_late != 0;
  static constexpr int kDqStageBytes = kDqStages * kDqTileFloats * 4, kDqBulkOps = 64;
  static_assert(kSmemBytes + kDqStageBytes <= 227 * 1024, "the staging tile must fit the H100's shared memory");
};

template <class T, int kHeadDim, bool kScoreMod, bool kDropout>
__global__ void __launch_bounds__(Bwd2dTraits<T, kHeadDim>::kThreads, Bwd2dTraits<T, kHeadDim>::kConfig.ctas_per_sm)
    bwd_main_2d_kernel(const BwdParams p) {
  using Tr = Bwd2dTraits<T, kHeadDim>;
  using TileKV = typename Tr::TileKV;
  using TileQ = typename Tr::TileQ;
  using TileP = typename Tr::TileP;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kThreads = Tr::kThreads;
  constexpr int kSNp = Tr::kSCols / 16, kKvNp = Tr::kKvCols / 16, kDqNp = Tr::kDqCols / 16;

  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + TileKV::kElements;
  constexpr int kQStages = Tr::kQStages;
  T* sQ = sV + TileKV::kElements;             // [kQStages][block_m x head_dim]
  T* sDo = sQ + kQStages * TileQ::kElements;  // [kQStages][block_m x head_dim]
  T* sP = sDo + kQStages * TileQ::kElements;  // P^T (block_n x block_m)
  T* sDs = sP + TileP::kElements;             // dS^T (block_n x block_m)
  float* sLse = reinterpret_cast<float*>(sDs + TileP::kElements);  // [kQStages][block_m]
  float* sD = sLse + kQStages * kBlockM;                           // [kQStages][block_m]
  float* sDq = sD + kQStages * kBlockM;  // sm_90: [kDqStages][block_m][head_dim] dQ partials (Tr::kDqStageBytes)

  const BwdTask task = bwd_task(p);
  const int n_block = task.n_block, head_kv = task.head_kv, b = task.b;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates
  const BwdSeq seq = bwd_sequence(p, b);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  const int n0 = n_block * kBlockN, n1 = n0 + kBlockN;
  if (n0 >= seqlen_k) return;
  const bool vectorized = p.vectorized != 0;
  const Mask mask(seqlen_q, seqlen_k, p.causal != 0, p.window_left, p.window_right);

  int i_begin, i_end;
  bwd_q_block_range<kBlockM>(mask, seqlen_q, n0, n1, i_begin, i_end);
  // The task's iterations it (query head head_kv * group + it / m_range, q-block i_begin + it % m_range);
  // a piece of a split task runs [it_begin, it_begin + num_iters) of them.
  const int m_range = i_end - i_begin, task_iters = p.group * m_range;
  int it_begin, num_iters;
  task.iterations(task_iters, it_begin, num_iters);
  const bool whole_head_dim = vectorized && p.head_dim == kHeadDim;
  // K_j, V_j: whole tiles take load_whole_tile (the generic load_tile's per-unit index math was ~40
  // instructions a unit, 8% of a short causal call's instructions at head_dim 128, ncu).
  const T* k_tile = static_cast<const T*>(p.k) +
                    bwd_offset(seq, seq.k_start, p.k_batch_stride, p.k_row_stride, p.k_head_stride, n0, head_kv);
  const T* v_tile = static_cast<const T*>(p.v) +
                    bwd_offset(seq, seq.k_start, p.v_batch_stride, p.v_row_stride, p.v_head_stride, n0, head_kv);
  if (whole_head_dim && n1 <= seqlen_k) {
    load_whole_tile<T, kBlockN, kHeadDim, kThreads>(smem_addr(sK), k_tile, p.k_row_stride);
    load_whole_tile<T, kBlockN, kHeadDim, kThreads>(smem_addr(sV), v_tile, p.v_row_stride);
  } else {
    load_tile<T, kBlockN, kHeadDim, kThreads>(sK, k_tile, p.k_row_stride, seqlen_k - n0, p.head_dim, vectorized);
    load_tile<T, kBlockN, kHeadDim, kThreads>(sV, v_tile, p.v_row_stride, seqlen_k - n0, p.head_dim, vectorized);
  }

  // Element offsets of the next q-block's Q and dO tiles: one q-block further each iteration (a
  // constant step), recomputed only at a change of head (the 64-bit index math of every iteration
  // was ~45 instructions a warp, ncu).
  int64_t q_off = 0, do_off = 0;
  auto tile_offsets = [&](int h, int m_block) {
    q_off = bwd_offset(seq, seq.q_start, p.q_batch_stride, p.q_row_stride, p.q_head_stride, m_block * kBlockM, h);
    do_off = bwd_offset(seq, seq.q_start, p.do_batch_stride, p.do_row_stride, p.do_head_stride, m_block * kBlockM, h);
  };
  // Q_i, dO_i, lse_i, D_i of query head h, q-block m_block (at q_off, do_off) into buffer buf. Whole
  // tiles of a vectorized problem (all but the last q-block) take load_whole_tile.
  auto load_q_block = [&](int h, int m_block, int buf) {
    const int m0 = m_block * kBlockM;
    const T* q_tile = static_cast<const T*>(p.q) + q_off;
    const T* do_tile = static_cast<const T*>(p.dout) + do_off;
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
  // The iteration's (h, m_block), kept as two counters and their successors (h_next, m_next) instead of
  // divisions.
  int h = head_kv * p.group, m_block = i_begin;
  if (it_begin > 0) h += it_begin / m_range, m_block += it_begin % m_range;
  tile_offsets(h, m_block);
  if (num_iters > 0) load_q_block(h, m_block, 0);
  cp_async_commit();

  // The q-blocks [plain_begin, plain_end) see every key of this k-block, unmasked, and are whole:
  // block_band's test per q-block, once per CTA. Its three conditions are monotone in the q-block
  // (key_end(m0) >= n1 from some block on; key_begin(last row) <= n0 and the block whole up to some
  // block), so the plain blocks are one range, found by two binary searches (per iteration the test
  // was ~60 uniform-datapath instructions a warp, ncu).
  int plain_begin = i_begin, plain_end = i_begin;
  if (n1 <= seqlen_k) {
    // The first block with key_end(m0) >= n1; from there, the first that is partial or has
    // key_begin(last row) > n0.
    plain_begin = first_block_where(i_begin, i_end, [&](int m) { return mask.key_end(int64_t(m) * kBlockM) >= n1; });
    plain_end = first_block_where(plain_begin, i_end, [&](int m) {
      return (m + 1) * kBlockM > seqlen_q || mask.key_begin(min((m + 1) * kBlockM, seqlen_q) - 1) > n0;
    });
  }

  // Warp tiles: keys skey0 .. skey0 + kSKeys - 1 of S^T, dP^T (query columns sq0 ..), keys key0 ..
  // key0 + 31 of dK, dV (head_dim columns kv_d0 ..); dQ rows dq_m0 .. dq_m0 + 31, columns dq_d0 ...
  const int key0 = (warp % Tr::kWarpsN) * 32, kv_d0 = (warp / Tr::kWarpsN) * Tr::kKvCols;
  const int skey0 = (warp % Tr::kSWarpsN) * Tr::kSKeys, sq0 = (warp / Tr::kSWarpsN) * Tr::kSCols;
  const int dq_m0 = (warp % Tr::kDqWarpsM) * 32, dq_d0 = (warp / Tr::kDqWarpsM) * Tr::kDqCols;

  float acc_dk[2][2 * kKvNp][4], acc_dv[2][2 * kKvNp][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int nt = 0; nt < 2 * kKvNp; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mi][nt][e] = acc_dv[mi][nt][e] = 0.f;

  // ldmatrix lane addresses (patterns in mma.cuh): A of K/V rows and of P^T/dS^T rows, B of Q/dO
  // [q][d], B^T of Q/dO and K ([row][d], .trans), A^T of dS^T [key][q] (.trans).
  const WarpCursor<kBlockN, kHeadDim> cur_k_a(smem_addr(sK), skey0 + lane % 16, lane / 16, 0);
  const WarpCursor<kBlockM, kHeadDim> cur_q_b(smem_addr(sQ), sq0 + 8 * (lane / 16) + lane % 8, (lane / 8) % 2, 0);
  const WarpCursor<kBlockN, kBlockM> cur_p_a(smem_addr(sP), key0 + lane % 16, lane / 16, 0);
  const WarpCursor<kBlockM, kHeadDim> cur_q_bt(smem_addr(sQ), 8 * ((lane / 8) % 2) + lane % 8, lane / 16, kv_d0);
  const WarpCursor<kBlockN, kBlockM> cur_ds_at(smem_addr(sDs), lane % 8 + 8 * (lane / 16), (lane / 8) % 2, dq_m0);
  const WarpCursor<kBlockN, kHeadDim> cur_k_bt(smem_addr(sK), 8 * ((lane / 8) % 2) + lane % 8, lane / 16, dq_d0);
  // Offsets from Q to dO, from P^T to dS^T (same tile shapes, same lane patterns).
  constexpr uint32_t kDoOff = kQStages * TileQ::kBytes, kDsOff = TileP::kBytes, kVOff = TileKV::kBytes;
  static_assert(kVOff % 128 == 0 && kDoOff % 128 == 0 && kDsOff % 128 == 0 && TileQ::kBytes % 128 == 0);

  // Bulk dQ path: iteration it stages its dQ in sDq; iteration it + 1 (after its first barrier) or the
  // end of the kernel issues the reductions into dq_pending (dq_pending_rows rows).
  const bool bulk_dq = FLASHATTN_BWD_BULK_DQ && !p.deterministic;
  float* dq_pending = nullptr;
  int dq_pending_rows = 0;
  uint32_t dq_pending_smem = 0;
  auto issue_pending_dq = [&] {
    if (bulk_dq) bulk_reduce_dq<kBlockM, kHeadDim, Tr::kDqBulkOps>(dq_pending, dq_pending_smem, dq_pending_rows, tid);
  };

  for (int it = 0; it < num_iters; ++it) {
    const int buf = kQStages == 2 ? it & 1 : 0;
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; every warp is done with iteration it - 1 (its buffers, P^T, dS^T, sDq)
    if constexpr (!Tr::kDqIssueLate) issue_pending_dq();
    const bool next_head = m_block + 1 == i_end;
    const int h_next = next_head ? h + 1 : h, m_next = next_head ? i_begin : m_block + 1;
    if (next_head) tile_offsets(h_next, m_next);
    else q_off += int64_t(kBlockM) * p.q_row_stride, do_off += int64_t(kBlockM) * p.do_row_stride;
    if constexpr (kQStages == 2) {
      if (it + 1 < num_iters) load_q_block(h_next, m_next, buf ^ 1);
      cp_async_commit();
    }

    const int m0 = m_block * kBlockM;
    const uint32_t q_buf = buf * TileQ::kBytes;  // + the Q / dO cursors: this iteration's tiles

    // Boundary blocks: visible iff lo <= r - c <= hi, r < rows_k, c < cols_q (block coordinates).
    const bool need_mask = m_block < plain_begin || m_block >= plain_end;
    int band_lo = -(1 << 30), band_hi = 1 << 30;
    if (need_mask) {
      const BlockBand bb = block_band<kBlockM>(mask, seqlen_q, seqlen_k, n0, n1, m0);
      band_lo = bb.lo, band_hi = bb.hi;
    }
    const int rows_k = seqlen_k - n0, cols_q = seqlen_q - m0;

    // S^T = K Q_i^T and dP^T = V dO_i^T on the warp's kSKeys keys x kSCols queries (in registers
    // beside dK, dV).
    constexpr int kSMi = Tr::kSMi;
    float s[kSMi][2 * kSNp][4], dp[kSMi][2 * kSNp][4];
#pragma unroll
    for (int mi = 0; mi < kSMi; ++mi)
#pragma unroll
      for (int nt = 0; nt < 2 * kSNp; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][nt][e] = dp[mi][nt][e] = 0.f;
    // One product at a time: fewer fragments live next to the accumulators.
    auto gemm_st = [&](float (&acc)[kSMi][2 * kSNp][4], uint32_t a_off, uint32_t b_off) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[kSMi][4];
#pragma unroll
        for (int mi = 0; mi < kSMi; ++mi) ldsm_x4(a[mi], cur_k_a.at(mi * 16, kk * 16) + a_off);
#pragma unroll
        for (int np = 0; np < kSNp; ++np) {
          uint32_t bf[4];
          ldsm_x4(bf, cur_q_b.at(np * 16, kk * 16) + b_off);
#pragma unroll
          for (int mi = 0; mi < kSMi; ++mi) {
            mma_16816<T>(acc[mi][2 * np], a[mi], bf[0], bf[1]);
            mma_16816<T>(acc[mi][2 * np + 1], a[mi], bf[2], bf[3]);
          }
        }
      }
    };
    // Dropout's keep bits (its instance), drawn before S^T and dP^T take their registers:
    // tile (16 keys from skey0 + 16 mi, 16 queries from sq0 + 16 q) in keep[mi][q].
    uint32_t keep[kSMi][kSNp];
    const bool dropout = kDropout && p.dropout.on();
    if (dropout)
#pragma unroll
      for (int mi = 0; mi < kSMi; ++mi)
        dropout_keep<2 * kSNp>(p.dropout, keep[mi], b * p.num_heads + h, (m0 + sq0) / 16, (n0 + skey0) / 16 + mi, g, t);
    gemm_st(s, 0, q_buf);
    gemm_st(dp, kVOff, q_buf + kDoOff);

    // ALiBi (the softcap instance only): query head h's slope (0: none), the block's diagonal.
    float alibi_slope_log2 = 0.f;
    if constexpr (kScoreMod)
      if (p.alibi_slopes) alibi_slope_log2 = p.alibi_slopes[b * p.alibi_slopes_batch_stride + h] * kLog2e;
    const int alibi_diag = seqlen_k - seqlen_q - (n0 - m0);
    // P^T, dS^T in place, then to shared memory as 16-bit.
    const float* lse_cols = sLse + buf * kBlockM + sq0 + 2 * t;  // + nt * 8 + {0, 1}
    const float* dsum_cols = sD + buf * kBlockM + sq0 + 2 * t;
#pragma unroll
    for (int mi = 0; mi < kSMi; ++mi) {
      const BandMask band{skey0 + mi * 16 + g, sq0 + 2 * t, band_lo, band_hi, rows_k, cols_q, alibi_diag, alibi_slope_log2};
      // Softcap is a kernel instance of its own: with the softcap test inside the masked blocks' body
      // (a branch per element), causal 512-2k keys measured 3-9% slower; a third body in the same
      // kernel cost the unmasked loop 1-2.5% (dev/sm80bwd/NOTES.md, session 11). ALiBi runs there too.
      // Dropout there as well; its instance runs the score mods' general path only with them.
      if (dropout) dropout_dp(dp[mi], keep[mi], p.dropout.scale);
      if (kScoreMod && (!kDropout || p.softcap > 0.f || p.alibi_slopes)) {
        if constexpr (kScoreMod) probs_and_grads<true>(s[mi], dp[mi], lse_cols, dsum_cols, p, band, need_mask);
      } else if (need_mask) {
        probs_and_grads<true, 2 * kSNp, false>(s[mi], dp[mi], lse_cols, dsum_cols, p, band, true);
      } else {
        probs_and_grads<false>(s[mi], dp[mi], lse_cols, dsum_cols, p, band, false);
      }
      if (dropout) dropout_p(s[mi], keep[mi]);
    }
    if constexpr (Tr::kXorStores) {
      // Byte offset of (skey0 + g, sq0 + 2t) in P^T; the other fragments' offsets differ by constants:
      // rows + 8 and + 16 mi keep the swizzle (row % 8), and the n8 tiles' units only in the low bits
      // that nt sets (sq0 is a multiple of the warp's power-of-two count of units): one XOR, no index
      // math.
      static_assert(TileP::kChunk % Tr::kSCols == 0 && is_pow2(Tr::kSCols / 8), "XOR-able n8 tiles");
      const uint32_t st0 = uint32_t(2 * TileP::offset(skey0 + g, sq0) + 4 * t);
      char* const p_bytes = reinterpret_cast<char*>(sP);
      char* const ds_bytes = reinterpret_cast<char*>(sDs);
#pragma unroll
      for (int mi = 0; mi < kSMi; ++mi)
#pragma unroll
        for (int nt = 0; nt < 2 * kSNp; ++nt) {
          const uint32_t off = (st0 ^ uint32_t(nt << 4)) + uint32_t(2 * mi * 16 * TileP::kChunk);
          constexpr uint32_t kRow8 = 2 * 8 * TileP::kChunk;
          *reinterpret_cast<uint32_t*>(p_bytes + off) = pack2<T>(s[mi][nt][0], s[mi][nt][1]);
          *reinterpret_cast<uint32_t*>(p_bytes + off + kRow8) = pack2<T>(s[mi][nt][2], s[mi][nt][3]);
          *reinterpret_cast<uint32_t*>(ds_bytes + off) = pack2<T>(dp[mi][nt][0], dp[mi][nt][1]);
          *reinterpret_cast<uint32_t*>(ds_bytes + off + kRow8) = pack2<T>(dp[mi][nt][2], dp[mi][nt][3]);
        }
    } else {
#pragma unroll
      for (int mi = 0; mi < kSMi; ++mi)
#pragma unroll
        for (int nt = 0; nt < 2 * kSNp; ++nt) {
          const int row = skey0 + mi * 16 + g, col = sq0 + nt * 8;
          *reinterpret_cast<uint32_t*>(sP + TileP::offset(row, col) + 2 * t) = pack2<T>(s[mi][nt][0], s[mi][nt][1]);
          *reinterpret_cast<uint32_t*>(sP + TileP::offset(row + 8, col) + 2 * t) =
              pack2<T>(s[mi][nt][2], s[mi][nt][3]);
          *reinterpret_cast<uint32_t*>(sDs + TileP::offset(row, col) + 2 * t) =
              pack2<T>(dp[mi][nt][0], dp[mi][nt][1]);
          *reinterpret_cast<uint32_t*>(sDs + TileP::offset(row + 8, col) + 2 * t) =
              pack2<T>(dp[mi][nt][2], dp[mi][nt][3]);
        }
    }
    bulk_wait_read();  // the reductions issued so far (those that read this iteration's sDq tile) have read it
    __syncthreads();   // P^T, dS^T complete; sDq free
    if constexpr (Tr::kDqIssueLate) issue_pending_dq();

    // dV += P^T dO_i, then dK += dS^T Q_i, on the warp's 32 keys x kKvCols head_dim columns.
    auto gemm_kv = [&](float (&acc)[2][2 * kKvNp][4], uint32_t a_off, uint32_t b_off) {
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) {
        uint32_t a[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) ldsm_x4(a[mi], cur_p_a.at(mi * 16, ks * 16) + a_off);
#pragma unroll
        for (int np = 0; np < kKvNp; ++np) {
          uint32_t bf[4];
          ldsm_x4_trans(bf, cur_q_bt.at(ks * 16, np * 16) + b_off);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            mma_16816<T>(acc[mi][2 * np], a[mi], bf[0], bf[1]);
            mma_16816<T>(acc[mi][2 * np + 1], a[mi], bf[2], bf[3]);
          }
        }
      }
    };
    gemm_kv(acc_dv, 0, q_buf + kDoOff);
    gemm_kv(acc_dk, kDsOff, q_buf);
    if constexpr (kQStages == 1) {  // one buffer: the next q-block loads once every warp is done with this one's
      __syncthreads();
      if (it + 1 < num_iters) load_q_block(h_next, m_next, 0);
      cp_async_commit();
    }

    // dQ_i += dS K_j on the warp's 32 query rows x kDqCols head_dim columns.
    float acc_dq[2][2 * kDqNp][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < 2 * kDqNp; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[mi][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
      uint32_t a_ds[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) ldsm_x4_trans(a_ds[mi], cur_ds_at.at(ks * 16, mi * 16));
#pragma unroll
      for (int np = 0; np < kDqNp; ++np) {
        uint32_t b_k[4];
        ldsm_x4_trans(b_k, cur_k_bt.at(ks * 16, np * 16));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816<T>(acc_dq[mi][2 * np], a_ds[mi], b_k[0], b_k[1]);
          mma_16816<T>(acc_dq[mi][2 * np + 1], a_ds[mi], b_k[2], b_k[3]);
        }
      }
    }

    // The thread's dQ rows dq_m0 + 16 mi + 8 half + g all have the swizzle of row g (dq_m0 % 4 == 0).
    const int64_t ws0 = int64_t(h) * p.rows_q + seq.ws_row + m0;  // the q-block's first accumulator row
    const int swz = dq_fragment_swizzle(ws0);
    if (bulk_dq) {  // stage dQ_i; the next iteration's first barrier publishes it to the reductions
      float* const stage = sDq + (it % Tr::kDqStages) * Tr::kDqTileFloats;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float* dst = stage + (dq_m0 + mi * 16 + 8 * half + g) * kHeadDim + 2 * t;
#pragma unroll
          for (int nt = 0; nt < 2 * kDqNp; ++nt)
            *reinterpret_cast<float2*>(dst + ((dq_d0 + nt * 8) ^ swz)) =
                make_float2(acc_dq[mi][nt][2 * half], acc_dq[mi][nt][2 * half + 1]);
        }
      fence_proxy_async_shared();
      dq_pending = p.dq_accum + ws0 * kHeadDim;
      dq_pending_smem = smem_addr(stage);
      dq_pending_rows = min(kBlockM, seqlen_q - m0);
    } else {
      int32_t* semaphore = nullptr;
      if (p.deterministic) {  // wait for the k-blocks before this one that visit q-block m_block
        semaphore = p.dq_semaphore + (int64_t(b) * p.num_heads + h) * p.num_m_blocks + m_block;
        const int expected = n_block - int(mask.key_begin(m0) / kBlockN);
        if (tid == 0)
          while (ld_acquire(semaphore) != expected) {
          }
        __syncthreads();
      }
      // One address per fragment row, the n8 tiles at constant offsets from it; one row test per
      // fragment row, none in whole q-blocks.
      float* acc_rows = p.dq_accum + ws0 * kHeadDim;
      const bool whole_m = m0 + kBlockM <= seqlen_q;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = dq_m0 + mi * 16 + 8 * half + g;
          if (!whole_m && m0 + row >= seqlen_q) continue;
          float* dst = acc_rows + (row * kHeadDim + 2 * t);
#pragma unroll
          for (int nt = 0; nt < 2 * kDqNp; ++nt)
            atomic_add2(dst + ((dq_d0 + nt * 8) ^ swz), acc_dq[mi][nt][2 * half], acc_dq[mi][nt][2 * half + 1]);
        }
      if (p.deterministic) {
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicAdd(semaphore, 1);
      }
    }
    h = h_next, m_block = m_next;
  }
  cp_async_wait<0>();  // (a k-block that no q-block sees still has K_j, V_j in flight)
  __syncthreads();     // every warp is done with the loop's tiles (K in dQ = dS K); the last sDq is complete
  issue_pending_dq();

  // dK_j * softmax_scale and dV_j (* dropout's 1 / (1 - p)) in the dtype (rows past seqlen_k and padded
  // columns dropped).
  const float dv_scale = kDropout ? p.dropout.scale : 1.f;
  T* dk = static_cast<T*>(p.dk) +
          bwd_offset(seq, seq.k_start, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, n0, head_kv);
  T* dv = static_cast<T*>(p.dv) +
          bwd_offset(seq, seq.k_start, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, n0, head_kv);
  // f(mi, nt, half) for each of the thread's fp32 pairs of dK and dV: key row key0 + mi * 16 + g + 8 * half,
  // head_dim columns kv_d0 + nt * 8 + 2t, + 1.
  auto for_each_kv_pair = [&](auto&& f) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < 2 * kKvNp; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) f(mi, nt, half);
  };
  if (!tail_sum<kThreads>(p, reinterpret_cast<float(&)[16 * kKvNp]>(acc_dk), reinterpret_cast<float(&)[16 * kKvNp]>(acc_dv),
                          tid)) {  // a piece of a split task, not the last
    bulk_wait_read();
    return;
  }
  if (whole_head_dim) {
    // Through shared memory (over K_j, V_j), then 16-byte pieces of whole rows: 4-byte stores from
    // the fragments touch 8 rows per warp instruction (dev/sm80bwd/NOTES.md, session 10). The
    // fragments' offsets: one per thread, the others by compile-time XOR / add steps (rows + 8, + 16
    // keep row % 8; the n8 tiles differ only in the unit bits the warp's power-of-two column span sets).
    static_assert(TileKV::kChunk == 64 && Tr::kKvCols <= 64 && is_pow2(Tr::kKvCols / 8), "XOR-able n8 tiles");
    const uint32_t st0 = uint32_t(TileKV::offset(key0 + g, kv_d0) + 2 * t);
    for_each_kv_pair([&](int mi, int nt, int half) {
      const uint32_t off = (st0 ^ uint32_t(nt * 8)) + uint32_t((mi * 16 + 8 * half) * TileKV::kChunk);
      *reinterpret_cast<uint32_t*>(sK + off) =
          pack2<T>(acc_dk[mi][nt][2 * half] * p.softmax_scale, acc_dk[mi][nt][2 * half + 1] * p.softmax_scale);
      *reinterpret_cast<uint32_t*>(sV + off) =
          pack2<T>(acc_dv[mi][nt][2 * half] * dv_scale, acc_dv[mi][nt][2 * half + 1] * dv_scale);
    });
    __syncthreads();
    store_whole_tile<T, kBlockN, kHeadDim, kThreads>(dk, p.dk_row_stride, sK, seqlen_k - n0);
    store_whole_tile<T, kBlockN, kHeadDim, kThreads>(dv, p.dv_row_stride, sV, seqlen_k - n0);
  } else {
    for_each_kv_pair([&](int mi, int nt, int half) {
      const int row = key0 + mi * 16 + g + 8 * half, col = kv_d0 + nt * 8 + 2 * t;
      if (n0 + row >= seqlen_k) return;
      store2<T>(dk + int64_t(row) * p.dk_row_stride, col, p.head_dim, acc_dk[mi][nt][2 * half] * p.softmax_scale,
                acc_dk[mi][nt][2 * half + 1] * p.softmax_scale, vectorized);
      store2<T>(dv + int64_t(row) * p.dv_row_stride, col, p.head_dim, acc_dv[mi][nt][2 * half] * dv_scale,
                acc_dv[mi][nt][2 * half + 1] * dv_scale, vectorized);
    });
  }
  // The dQ reductions must have read sDq before the CTA's shared memory goes; their writes need no
  // wait (the convert kernel runs after this grid has completed).
  bulk_wait_read();
}

}  // namespace flashattn::sm80
