// FA2 backward on mma.sync (FlashAttention-2, Algorithm 2), recomputing P from the forward's lse.
//
//   1. bwd_preprocess_kernel: D_i = rowsum(dO_i * O_i) in fp32; zeroes the fp32 dQ accumulator (and,
//      deterministic, the semaphores).
//   2. bwd_main_kernel: K/V blocks outer. A CTA keeps K_j, V_j (block_n x head_dim) in shared memory
//      and loops over the query heads of its kv head (GQA: dK, dV sum over the group in registers,
//      no workspace) and over the q-blocks i that see key block j (masked-out blocks skipped; only
//      boundary blocks apply the element mask), with Q_i, dO_i, lse_i, D_i double-buffered by cp.async:
//        S^T  = K_j Q_i^T                  P^T  = exp2(S^T * scale * log2e - lse * log2e)
//        dP^T = V_j dO_i^T                 dS^T = P^T * (dP^T - D)  [* (1 - tanh^2) with softcap]
//        dV_j += P^T dO_i                  dK_j += dS^T Q_i          (A operands straight from registers)
//        dQ_i += dS K_j                    (dS^T through shared memory, fp32 atomics into the accumulator)
//      dK_j * softmax_scale and dV_j are written in the dtype at the end.
//      Dropout (an instance of its own): with Z the kept elements' mask, dV_j += (P^T Z^T) dO_i,
//      dS^T = P^T * (dP^T Z^T / (1 - p) - D), and dV_j scaled by 1 / (1 - p) at the end (D = rowsum(dO O)
//      with O the dropped forward's output).
//   3. bwd_convert_dq_kernel: dq = dQ accumulator * softmax_scale in the dtype.
// Computing S^T (keys as mma rows) instead of S lets each warp own whole key rows: the C fragments of
// S^T and dS^T are the A fragments of the dV and dK products, so only dS makes a shared-memory trip.
//
// Deterministic mode: the dQ adds of the k-blocks that see q-block i happen in k-block order: a CTA
// waits until the semaphore of (batch, head, i, d part) counts the k-blocks before it that visit i,
// adds, then increments it. CTAs are dispatched in blockIdx order, lower k-blocks first, so the wait
// always ends. fp32 adds in a fixed order give bit-identical dQ; dK, dV never use atomics.
#pragma once

#include <cstdint>

#include "common/last_round_split.hpp"
#include "common/mask.hpp"
#include "common/status.hpp"
#include "cuda/common.cuh"
#include "cuda/sm80/bwd_config.cuh"
#include "cuda/sm80/bwd_tail_split.hpp"
#include "cuda/sm80/mma.cuh"

namespace flashattn::sm80 {

// ---------------------------------------------------------------------------------------------
// Backward-only primitives (mma.cuh has the shared ones).

// cp.async of 4 bytes (lse, D), zero-filled when !valid.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(valid ? 4 : 0));
}

// dQ accumulator += (a, b) at addr (8-byte aligned): one vector atomic on sm_90.
__device__ __forceinline__ void atomic_add2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(addr), make_float2(a, b));
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
#endif
}

__device__ __forceinline__ int ld_acquire(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Byte offsets into a SmemTile for one lane's ldmatrix row address: the lane part (row_t, 8 * unit_t
// with unit_t 0 or 1) is fixed at construction, the rest (row_c a multiple of 8, col_c a multiple of
// 16) is added by at(), where it is usually a compile-time constant. Both swizzles of SmemTile depend
// only on row % 8, so swizzle(row_t + row_c) = swizzle(row_t) and the unit of (row, col) is
// (col_c unit) ^ x with x = unit_t ^ swizzle(row_t).
template <int kRows, int kCols>
struct TileCursor {
  using Tile = SmemTile<kRows, kCols>;
  int row_off, x;
  __device__ __forceinline__ TileCursor(int row_t, int unit_t)
      : row_off(row_t * Tile::kChunk), x((Tile::offset(row_t, 8 * unit_t) - row_t * Tile::kChunk) / 8) {}
  __device__ __forceinline__ uint32_t at(int row_c, int col_c) const {
    const int chunk = col_c / Tile::kChunk, unit = (col_c % Tile::kChunk) / 8;
    return uint32_t(2 * ((chunk * kRows + row_c) * Tile::kChunk + row_off + ((unit ^ x) << 3)));
  }
};

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two adjacent elements (col, col + 1) of a row whose first cols_valid columns exist.
template <class T>
__device__ __forceinline__ void store2(T* row, int col, int cols_valid, float a, float b, bool vectorized) {
  if (vectorized) {  // head_dim % 8 == 0 and col even: both or neither are valid; 4-byte aligned
    if (col < cols_valid) *reinterpret_cast<uint32_t*>(row + col) = pack2<T>(a, b);
    return;
  }
  if (col < cols_valid) row[col] = from_float<T>(a);
  if (col + 1 < cols_valid) row[col + 1] = from_float<T>(b);
}

// One sequence of the batch: first rows in the packed tensors, lengths, and where its q rows sit in
// the (num_heads, rows_q) workspace arrays.
struct BwdSeq {
  int64_t q_start = 0, k_start = 0;  // varlen: packed row of the first token; else 0
  int64_t batch_q = 0;               // non-varlen: the batch index (for batch strides); varlen: 0
  int64_t ws_row = 0;                // row of token 0 in the workspace arrays
  int32_t seqlen_q = 0, seqlen_k = 0;
};

__device__ __forceinline__ BwdSeq bwd_sequence(const BwdParams& p, int b) {
  BwdSeq s;
  if (p.cu_seqlens_q) {
    s.q_start = p.cu_seqlens_q[b];
    s.k_start = p.cu_seqlens_k[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - int32_t(s.q_start);
    s.seqlen_k = p.cu_seqlens_k[b + 1] - int32_t(s.k_start);
    s.ws_row = s.q_start;
  } else {
    s.batch_q = b;
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    s.ws_row = int64_t(b) * p.seqlen_q;
  }
  return s;
}

// The CTA's task (k-block, kv head, batch) from the one-dimensional grid (k-block fastest, as the other
// kernels' 3D grids), and for a split task of the last wave (BwdParams' tail fields) its slot and piece.
struct BwdTask {
  int n_block, head_kv, b;
  int slot;    // split tasks: the index into tail_dkv / tail_done; -1: a whole task
  int piece;   // 0 .. pieces - 1
  int pieces;  // CTAs sharing the task's iterations (1: whole)

  // This CTA's share [it_begin, it_begin + num_iters) of the task's task_iters iterations (the host splits
  // only tasks with 64 * task_iters < 2^31).
  __device__ __forceinline__ void iterations(int task_iters, int& it_begin, int& num_iters) const {
    it_begin = 0, num_iters = task_iters;
    if (slot >= 0) {
      int it_end;
      piece_range(piece, pieces, task_iters, it_begin, it_end);
      num_iters = it_end - it_begin;
    }
  }
};
// (Divisions by multiply-high: the ~20-instruction divisions of a CTA's first instructions cost the short
// calls 2%, dev/sm80bwd/NOTES.md.)
__device__ __forceinline__ BwdTask bwd_task(const BwdParams& p, int cta) {
  BwdTask t{0, 0, 0, -1, 0, 1};
  int task = cta, rest;
  if (task >= p.tail_begin) {
    t.piece = p.tail_pieces_div.divmod(task - p.tail_begin, t.slot), t.pieces = p.tail_pieces;
    task = p.tail_begin + t.slot;
  }
  rest = task_pair(task, p.task_group, p.task_pairs, p.n_blocks_div, p.task_group_div, p.group_pairs_div, t.n_block);
  t.head_kv = p.heads_kv_div.divmod(rest, t.b);
  return t;
}
__device__ __forceinline__ BwdTask bwd_task(const BwdParams& p) { return bwd_task(p, int(blockIdx.x)); }

// CTAs of the task grid: every task once, the split ones tail_pieces times.
inline Status bwd_task_ctas(const BwdParams& bp, const char* impl, unsigned* ctas) {
  const int64_t tasks = int64_t(bp.num_n_blocks) * bp.num_heads_kv * bp.batch;
  const int64_t n = tasks + int64_t(bp.tail_tasks) * (bp.tail_pieces - 1);
  if (n > INT32_MAX)
    return unsupported("%s backward: %lld k-blocks x kv heads x batch exceed a grid", impl,
                       static_cast<long long>(tasks));
  *ctas = unsigned(n);
  return {};
}

// Whether this CTA writes its task's dK, dV: a whole task does; a piece of a split task adds this
// thread's partials (kN floats of each) into the task's slot of tail_dkv ([dK, dV][float2 e][thread]:
// coalesced), and only the piece that finishes last writes, with the sums in dk, dv. The CTA index is read
// again here (volatile): the slot kept from the prologue stayed live through the main loop, and ptxas
// spilled (the Hopper kernel at head_dim 128: 28 bytes).
// The CTA's barriers (Sync: the barriers of the threads holding dK, dV; the Hopper kernel's consumers).
struct CtaSync {
  static __device__ __forceinline__ void sync() { __syncthreads(); }
  static __device__ __forceinline__ bool sync_or(bool pred) { return __syncthreads_or(pred); }
};
// cta: the task grid's CTA index where it is not the launch's (the persistent Hopper kernel), -1: %ctaid.x.
template <int kThreads, int kN, class Sync = CtaSync>
__device__ __forceinline__ bool tail_sum(const BwdParams& p, float (&dk)[kN], float (&dv)[kN], int tid, int cta = -1) {
  static_assert(kN % 2 == 0);
  if (cta < 0) asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(cta));
  if (cta < p.tail_begin) return true;
  int slot;
  p.tail_pieces_div.divmod(cta - p.tail_begin, slot);
  float2* at = reinterpret_cast<float2*>(p.tail_dkv) + int64_t(slot) * kN * kThreads + tid;
#pragma unroll
  for (int e = 0; e < kN / 2; ++e) {
    atomic_add2(reinterpret_cast<float*>(at + e * kThreads), dk[2 * e], dk[2 * e + 1]);
    atomic_add2(reinterpret_cast<float*>(at + (kN / 2 + e) * kThreads), dv[2 * e], dv[2 * e + 1]);
  }
  __threadfence();
  Sync::sync();
  if (!Sync::sync_or(tid == 0 && atomicAdd(p.tail_done + slot, 1) == p.tail_pieces - 1)) return false;
  __threadfence();
#pragma unroll
  for (int e = 0; e < kN / 2; ++e) {
    const float2 k = __ldcg(at + e * kThreads), v = __ldcg(at + (kN / 2 + e) * kThreads);
    dk[2 * e] = k.x, dk[2 * e + 1] = k.y, dv[2 * e] = v.x, dv[2 * e + 1] = v.y;
  }
  return true;
}

// Index of query head h's first lse entry of sequence s: lse is (batch, num_heads, seqlen_q), or with
// varlen (num_heads, total_q).
__device__ __forceinline__ int64_t lse_row0(const BwdParams& p, const BwdSeq& s, int h) {
  return p.cu_seqlens_q ? int64_t(h) * p.rows_q + s.q_start : (s.batch_q * p.num_heads + h) * p.seqlen_q;
}

// Element offset of (row, head) of a tensor in sequence s (q side rows start at q_start).
__device__ __forceinline__ int64_t bwd_offset(const BwdSeq& s, int64_t start, int64_t batch_stride, int64_t row_stride,
                                              int64_t head_stride, int64_t row, int head) {
  return s.batch_q * batch_stride + (start + row) * row_stride + int64_t(head) * head_stride;
}

// 16-byte unit u of a [kRows][kCols] tile of rows [0, rows_valid) x columns [0, cols_valid) of a strided
// tensor into a swizzled shared tile, zero-filled outside them. Vectorized: cp.async; else element loads.
template <class T, int kRows, int kCols>
__device__ __forceinline__ void load_tile_unit(T* smem, const T* gmem, int64_t row_stride, int rows_valid,
                                               int cols_valid, bool vectorized, int u) {
  using Tile = SmemTile<kRows, kCols>;
  constexpr int kUnitsPerRow = kCols / 8;
  const int r = u / kUnitsPerRow, c = (u % kUnitsPerRow) * 8;
  T* dst = smem + Tile::offset(r, c);
  const bool row_ok = r < rows_valid;
  if (vectorized) {
    const bool valid = row_ok && c < cols_valid;
    cp_async_16(dst, valid ? gmem + r * row_stride + c : gmem, valid);
  } else {
    T vals[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      vals[e] = (row_ok && c + e < cols_valid) ? gmem[r * row_stride + c + e] : from_float<T>(0.f);
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
  }
}

// The whole tile, by the CTA's first kThreads threads (load_tile_unit's units in turn).
// Not the forward's load_tile (one offset per thread, compile-time unit steps): in its place the
// layout-0 kernels spilled more (sm_90: head_dim 192 8 -> 176 bytes, 96 28 -> 52, 256 16 -> 64).
template <class T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile(T* smem, const T* gmem, int64_t row_stride, int rows_valid, int cols_valid,
                                          bool vectorized) {
  constexpr int kUnits = kRows * kCols / 8;
  static_assert(kUnits % kThreads == 0, "every thread loads the same number of 16-byte units");
#pragma unroll
  for (int u = threadIdx.x; u < kUnits; u += kThreads)
    load_tile_unit<T, kRows, kCols>(smem, gmem, row_stride, rows_valid, cols_valid, vectorized, u);
}

// ---------------------------------------------------------------------------------------------
// The first i in [lo, hi) with pred(i), else hi; pred is false, then true over the range.
template <class Pred>
__device__ __forceinline__ int first_block_where(int lo, int hi, Pred pred) {
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pred(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// The q-blocks that see key block [n0, n1): a contiguous range [i_begin, i_end), since the visible
// key range of a row grows with the row. Both ends by binary search (a scan from block 0 was
// n_block steps of serial uniform code at the start of every CTA of a long causal problem).
template <int kBlockM>
__device__ __forceinline__ void bwd_q_block_range(const Mask& mask, int seqlen_q, int n0, int n1, int& i_begin,
                                                  int& i_end) {
  const int num_m = (seqlen_q + kBlockM - 1) / kBlockM;
  // The first block whose last row sees a key at or past n0; from there, the first whose first row
  // sees no key before n1.
  i_begin = first_block_where(0, num_m, [&](int m) { return mask.key_end(min((m + 1) * kBlockM, seqlen_q) - 1) > n0; });
  i_end = first_block_where(i_begin, num_m, [&](int m) { return mask.key_begin(int64_t(m) * kBlockM) >= n1; });
}

// K_j, V_j (keys n0 .., kv head head_kv) into their resident shared tiles.
template <class T, int kBlockN, int kHeadDim, int kThreads>
__device__ __forceinline__ void load_kv_block(T* sK, T* sV, const BwdParams& p, const BwdSeq& seq, int n0,
                                              int head_kv) {
  const bool vectorized = p.vectorized != 0;
  const T* k_tile = static_cast<const T*>(p.k) +
                    bwd_offset(seq, seq.k_start, p.k_batch_stride, p.k_row_stride, p.k_head_stride, n0, head_kv);
  const T* v_tile = static_cast<const T*>(p.v) +
                    bwd_offset(seq, seq.k_start, p.v_batch_stride, p.v_row_stride, p.v_head_stride, n0, head_kv);
  load_tile<T, kBlockN, kHeadDim, kThreads>(sK, k_tile, p.k_row_stride, seq.seqlen_k - n0, p.head_dim, vectorized);
  load_tile<T, kBlockN, kHeadDim, kThreads>(sV, v_tile, p.v_row_stride, seq.seqlen_k - n0, p.head_dim, vectorized);
}

// lse and D of q-block rows m0 .. m0 + kBlockM - 1 of query head h into sLse, sD (threads 0 ..
// 2 * kBlockM - 1, one value each; rows past the sequence read as 0).
template <int kBlockM>
__device__ __forceinline__ void load_lse_d(float* sLse, float* sD, const BwdParams& p, const BwdSeq& seq, int h,
                                           int m0) {
  const int tid = threadIdx.x;
  const int64_t lse_row = lse_row0(p, seq, h) + m0;
  const int64_t d_row = int64_t(h) * p.rows_q + seq.ws_row + m0;
  if (tid < kBlockM) {
    const bool valid = m0 + tid < seq.seqlen_q;
    cp_async_4(sLse + tid, p.lse + (valid ? lse_row + tid : 0), valid);
  } else if (tid < 2 * kBlockM) {
    const int r = tid - kBlockM;
    const bool valid = m0 + r < seq.seqlen_q;
    cp_async_4(sD + r, p.d_sum + (valid ? d_row + r : 0), valid);
  }
}

// The row kernels (1 and 3): kBwdRowThreads threads per (q row, head), 8 columns (16 bytes of
// 16-bit data) each (a power of two: rows never straddle a warp; at head_dim 96 and 192 the last
// threads of a row idle), 256 / kBwdRowThreads rows per block. Memory-bound passes over O, dO and the
// fp32 accumulator, which one warp per row with 2- and 4-byte accesses ran far below bandwidth.
constexpr int bwd_pow2_ceil(int x) { return x <= 1 ? 1 : 2 * bwd_pow2_ceil((x + 1) / 2); }
template <int kHeadDim>
constexpr int kBwdRowThreads = bwd_pow2_ceil(kHeadDim / 8);
template <int kHeadDim>
constexpr int kBwdRowsPerBlock = 256 / kBwdRowThreads<kHeadDim>;

// Element offsets of workspace row `row` (batch and position flattened) of head h in a (batch,
// seqlen, heads, head_dim) or varlen (total, heads, head_dim) tensor.
__device__ __forceinline__ int64_t bwd_row_offset(const BwdParams& p, int64_t row, int h, int64_t batch_stride,
                                                  int64_t row_stride, int64_t head_stride) {
  if (p.cu_seqlens_q) return row * row_stride + int64_t(h) * head_stride;
  const int64_t b = row / p.seqlen_q, i = row % p.seqlen_q;
  return b * batch_stride + i * row_stride + int64_t(h) * head_stride;
}

// 8 consecutive 16-bit values as fp32; columns >= cols_valid read as 0.
template <class T>
__device__ __forceinline__ void load8(const T* src, int cols_valid, bool vectorized, float (&x)[8]) {
  if (vectorized && cols_valid >= 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    const T* v = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = to_float<T>(v[e]);
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = e < cols_valid ? to_float<T>(src[e]) : 0.f;
}

// 1. D = rowsum(dO * O), zero the dQ accumulator and the semaphores.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) bwd_preprocess_kernel(const BwdParams p, int32_t num_semaphores) {
  constexpr int kRowThreads = kBwdRowThreads<kHeadDim>;
  const int c0 = int(threadIdx.x % kRowThreads) * 8;
  const int64_t row = int64_t(blockIdx.x) * kBwdRowsPerBlock<kHeadDim> + threadIdx.x / kRowThreads;
  const int h = blockIdx.y;
  if (blockIdx.x == 0 && blockIdx.y == 0 && p.dq_semaphore)
    for (int i = threadIdx.x; i < num_semaphores; i += blockDim.x) p.dq_semaphore[i] = 0;
  if (p.tail_floats > 0) {  // the split tasks' dK, dV sums and counters, spread over the whole grid
    const int64_t threads = int64_t(gridDim.x) * gridDim.y * blockDim.x;
    const int64_t first = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    for (int64_t i = first; i < p.tail_floats / 4; i += threads)
      reinterpret_cast<float4*>(p.tail_dkv)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t i = first; i < p.tail_tasks; i += threads) p.tail_done[i] = 0;
  }
  const bool valid = row < p.rows_q;  // no early return: the row's threads reduce with shuffles
  float sum = 0.f;
  if (valid && c0 < p.head_dim) {
    const T* o = static_cast<const T*>(p.o) + bwd_row_offset(p, row, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
    const T* dout =
        static_cast<const T*>(p.dout) + bwd_row_offset(p, row, h, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
    float x[8], y[8];
    load8<T>(o + c0, p.head_dim - c0, p.vectorized != 0, x);
    load8<T>(dout + c0, p.head_dim - c0, p.vectorized != 0, y);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum = fmaf(x[e], y[e], sum);
  }
#pragma unroll
  for (int m = kRowThreads / 2; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (!valid || c0 >= kHeadDim) return;
  const int64_t ws = int64_t(h) * p.rows_q + row;
  if (c0 == 0) p.d_sum[ws] = sum;
  float4* acc = reinterpret_cast<float4*>(p.dq_accum + ws * kHeadDim + c0);
  acc[0] = acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// 3. dq = dQ accumulator * softmax_scale in the dtype.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) bwd_convert_dq_kernel(const BwdParams p) {
  constexpr int kRowThreads = kBwdRowThreads<kHeadDim>;
  const int c0 = int(threadIdx.x % kRowThreads) * 8;
  const int64_t row = int64_t(blockIdx.x) * kBwdRowsPerBlock<kHeadDim> + threadIdx.x / kRowThreads;
  const int h = blockIdx.y;
  if (row >= p.rows_q || c0 >= p.head_dim) return;
  T* dq = static_cast<T*>(p.dq) + bwd_row_offset(p, row, h, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride) + c0;
  const int64_t ws = int64_t(h) * p.rows_q + row;
  const float4* acc = reinterpret_cast<const float4*>(p.dq_accum + ws * kHeadDim + (c0 ^ dq_swizzle(ws)));
  const float4 a = acc[0], b = acc[1];
  const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  if (p.vectorized && c0 + 8 <= p.head_dim) {
    uint4 u;
    uint32_t* w = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = pack2<T>(x[2 * e] * p.softmax_scale, x[2 * e + 1] * p.softmax_scale);
    *reinterpret_cast<uint4*>(dq) = u;
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e)
    if (c0 + e < p.head_dim) dq[e] = from_float<T>(x[e] * p.softmax_scale);
}

// The launches of kernels 1 and 3 on bp's stream (shared by the sm80 and the sm90 backward).
template <class T, int kHeadDim>
Status launch_bwd_preprocess(const BwdParams& bp, cudaStream_t stream, int32_t num_semaphores) {
  if (bp.rows_q == 0) return {};
  const dim3 grid(unsigned((bp.rows_q + kBwdRowsPerBlock<kHeadDim> - 1) / kBwdRowsPerBlock<kHeadDim>),
                  unsigned(bp.num_heads));
  bwd_preprocess_kernel<T, kHeadDim><<<grid, 256, 0, stream>>>(bp, num_semaphores);
  FA_CUDA_CHECK_LAUNCH("backward preprocess");
  return {};
}
template <class T, int kHeadDim>
Status launch_bwd_convert_dq(const BwdParams& bp, cudaStream_t stream) {
  if (bp.rows_q == 0) return {};
  const dim3 grid(unsigned((bp.rows_q + kBwdRowsPerBlock<kHeadDim> - 1) / kBwdRowsPerBlock<kHeadDim>),
                  unsigned(bp.num_heads));
  bwd_convert_dq_kernel<T, kHeadDim><<<grid, 256, 0, stream>>>(bp);
  FA_CUDA_CHECK_LAUNCH("backward convert dq");
  return {};
}

// ---------------------------------------------------------------------------------------------
// 2. The main kernel.

// The element mask of a boundary block for one thread's fragment: key row row0 (+8), query column
// col0 + nt * 8 (+1) in block coordinates; visible iff lo <= row - col <= hi, row < rows_k, col < cols_q.
// ALiBi (alibi_slope_log2 != 0; in the general path of the kScoreMod instances): the scores get
// -slope * |alibi_diag - (row - col)|, alibi_diag the block's diagonal (seqlen_k - seqlen_q - (n0 - m0)).
struct BandMask {
  int row0, col0, lo, hi, rows_k, cols_q;
  int alibi_diag = 0;
  float alibi_slope_log2 = 0.f;  // slope * log2 e
  __device__ __forceinline__ bool visible(int row, int col) const {
    return row - col >= lo && row - col <= hi && row < rows_k && col < cols_q;
  }
};

// The mask of the pair (k-block [n0, n1), q-block [m0, m0 + kBlockM)): whether it is a boundary block
// (need_mask), and then the band lo <= key row - query column <= hi of Mask in block coordinates,
// clamped to 32 bits.
struct BlockBand {
  bool need_mask;
  int lo, hi;
};
template <int kBlockM>
__device__ __forceinline__ BlockBand block_band(const Mask& mask, int seqlen_q, int seqlen_k, int n0, int n1, int m0) {
  const int mlast = min(m0 + kBlockM, seqlen_q) - 1;
  BlockBand band{!(mask.key_begin(mlast) <= n0 && mask.key_end(m0) >= n1 && m0 + kBlockM <= seqlen_q && n1 <= seqlen_k),
                 -(1 << 30), 1 << 30};
  if (band.need_mask) {
    const int64_t diag = int64_t(seqlen_k) - seqlen_q - (n0 - m0);  // key row - query column on the diagonal
    if (mask.left >= 0) band.lo = int(max(int64_t(band.lo), diag - mask.left));
    if (mask.right >= 0) band.hi = int(min(int64_t(band.hi), diag + mask.right));
  }
  return band;
}

// P^T = exp2(S^T * scale * log2 e - lse * log2 e) and dS^T = P^T * (dP^T - D) [* (1 - tanh^2)] in place
// of s and dp (n8 tiles x 4 fragment elements: element e is row row0 + 8 (e / 2), column + e % 2).
// kGeneral = false is the common path (no softcap, interior block): no per-element branch.
// kScoreMod = false leaves the softcap and ALiBi out of the general path (the mask alone).
// lse_cols, dsum_cols: lse and D of the thread's columns (shared memory, + nt * 8 + {0, 1}).
template <bool kGeneral, int kTiles, bool kScoreMod = true>
__device__ __forceinline__ void probs_and_grads(float (&s)[kTiles][4], float (&dp)[kTiles][4], const float* lse_cols,
                                                const float* dsum_cols, const BwdParams& p, const BandMask& band,
                                                bool masked) {
  // ALiBi's distance |diag - (row - col)| at the fragment's first element; the others differ by constants.
  const float alibi_first = float(band.alibi_diag - band.row0 + band.col0);
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    const float2 l = *reinterpret_cast<const float2*>(lse_cols + nt * 8);
    const float2 dd = *reinterpret_cast<const float2*>(dsum_cols + nt * 8);
    const float lse_log2[2] = {l.x * kLog2e, l.y * kLog2e}, dsum[2] = {dd.x, dd.y};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = e & 1;
      // ALiBi's bias in log2 units, 0 without it (a constant: dS keeps its formula).
      const float bias = kGeneral && kScoreMod && band.alibi_slope_log2 != 0.f
                             ? band.alibi_slope_log2 * fabsf(alibi_first + float(nt * 8 + j - 8 * (e >> 1)))
                             : 0.f;
      float pv, ds;
      if (kGeneral && kScoreMod && p.softcap > 0.f) {
        const float th = cuda::softcap_tanh(s[nt][e] * p.softcap_inv);
        pv = exp2_fast(p.softcap * kLog2e * th - bias - lse_log2[j]);
        ds = pv * (dp[nt][e] - dsum[j]) * (1.f - th * th);
      } else {
        pv = exp2_fast(s[nt][e] * p.scale_log2 - bias - lse_log2[j]);
        ds = pv * (dp[nt][e] - dsum[j]);
      }
      if (kGeneral && masked && !band.visible(band.row0 + 8 * (e >> 1), band.col0 + nt * 8 + j)) pv = ds = 0.f;
      s[nt][e] = pv;
      dp[nt][e] = ds;
    }
  }
}

// The keep bits of a thread's fragment of a 16 x 16 dropout tile held transposed (keys x queries: S^T):
// one Philox call, its partner lane (lane ^ 4) sent the halves it needs by two shuffles
// (DropoutMask::transposed_*). The whole warp calls it.
__device__ __forceinline__ uint32_t keep_bits_transposed_shared(const DropoutMask& d, int32_t bh, int32_t i16, int32_t j16,
                                                                int g, int t) {
  const Philox4 o = d.call(bh, i16, j16, DropoutMask::transposed_lane(g, t));
  uint32_t send[2];
  DropoutMask::transposed_send(o, g, send);
  const uint32_t recv[2] = {__shfl_xor_sync(0xffffffffu, send[0], 4), __shfl_xor_sync(0xffffffffu, send[1], 4)};
  return d.transposed_keep_bits(o, recv, g);
}

// Dropout on a thread's fragments of S^T and dP^T (keys x queries, kTiles n8 tiles of queries from a
// multiple of 16): keep[q] the bits of query tile q (bit 4 (nt % 2) + e). Before probs_and_grads dP^T's
// dropped elements are zeroed and the kept ones scaled (so dS = P (dP Z - D)); after it P^T's dropped
// ones are zeroed (dV's scale comes at the end).
template <int kTiles>
__device__ __forceinline__ void dropout_keep(const DropoutMask& d, uint32_t (&keep)[kTiles / 2], int bh, int i16, int j16,
                                             int g, int t) {
#pragma unroll
  for (int q = 0; q < kTiles / 2; ++q) keep[q] = keep_bits_transposed_shared(d, bh, i16 + q, j16, g, t);
}
template <int kTiles>
__device__ __forceinline__ void dropout_dp(float (&dp)[kTiles][4], const uint32_t (&keep)[kTiles / 2], float scale) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[nt][e] = (keep[nt / 2] >> (4 * (nt % 2) + e)) & 1u ? dp[nt][e] * scale : 0.f;
}
template <int kTiles>
__device__ __forceinline__ void dropout_p(float (&s)[kTiles][4], const uint32_t (&keep)[kTiles / 2]) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = (keep[nt / 2] >> (4 * (nt % 2) + e)) & 1u ? s[nt][e] : 0.f;
}

template <class T, int kHeadDim>
struct BwdTraits {
  static constexpr BwdConfig kConfig = bwd_config(kHeadDim);
  static_assert(kConfig.head_dim == kHeadDim, "no backward config for this head_dim");
  static constexpr int kBlockM = kConfig.block_m, kBlockN = kConfig.block_n, kWarps = kConfig.warps;
  static constexpr int kChunkM = kConfig.chunk_m;
  static constexpr int kThreads = 32 * kWarps, kSplitD = kConfig.split_d, kDimPart = kHeadDim / kSplitD;
  // dQ_i (block_m x kDimPart) per iteration: warps tile it kDqWarpsM x kDqWarpsN, 16 x kDqCols each.
  static constexpr int kDqWarpsM = kBlockM / 16, kDqWarpsN = kWarps / kDqWarpsM, kDqCols = kDimPart / kDqWarpsN;
  using TileKV = SmemTile<kBlockN, kHeadDim>;  // K_j, V_j
  using TileQ = SmemTile<kBlockM, kHeadDim>;   // Q_i, dO_i
  using TileDs = SmemTile<kBlockN, kBlockM>;   // dS^T
  static constexpr int kSmemBytes = bwd_smem_bytes(kConfig);
  static_assert(kSmemBytes == 2 * TileKV::kBytes + 2 * 2 * TileQ::kBytes + TileDs::kBytes + 2 * 2 * kBlockM * 4);
};

// kScoreMod: the instance for softcapped or ALiBi scores (bp.softcap > 0 or bp.alibi_slopes), whose every
// block takes the general path; the other one's general path is the mask alone. kDropout (with kScoreMod):
// dropout's instance, with or without the others (in the score-mod instance it cost softcap 1-10%, H200).
template <class T, int kHeadDim, bool kScoreMod, bool kDropout>
__global__ void __launch_bounds__(BwdTraits<T, kHeadDim>::kThreads, BwdTraits<T, kHeadDim>::kConfig.ctas_per_sm)
    bwd_main_kernel(const BwdParams p) {
  using Tr = BwdTraits<T, kHeadDim>;
  using TileKV = typename Tr::TileKV;
  using TileQ = typename Tr::TileQ;
  using TileDs = typename Tr::TileDs;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kThreads = Tr::kThreads, kDimPart = Tr::kDimPart;
  constexpr int kChunkM = Tr::kChunkM;
  constexpr int kMTiles = kChunkM / 8;    // n8 tiles of a chunk of S^T's q columns
  constexpr int kDTiles = kDimPart / 8;   // n8 tiles of a warp's dK, dV columns
  constexpr int kDqTiles = Tr::kDqCols / 8;

  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + TileKV::kElements;
  T* sQ = sV + TileKV::kElements;      // [2][block_m x head_dim]
  T* sDo = sQ + 2 * TileQ::kElements;  // [2][block_m x head_dim]
  T* sDs = sDo + 2 * TileQ::kElements; // dS^T (block_n x block_m)
  float* sLse = reinterpret_cast<float*>(sDs + TileDs::kElements);  // [2][block_m]
  float* sD = sLse + 2 * kBlockM;                                   // [2][block_m]

  const int part = blockIdx.x % Tr::kSplitD, n_block = blockIdx.x / Tr::kSplitD;
  const int head_kv = blockIdx.y, b = blockIdx.z;
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
  const int m_range = i_end - i_begin, num_iters = p.group * m_range;
  load_kv_block<T, kBlockN, kHeadDim, kThreads>(sK, sV, p, seq, n0, head_kv);

  // Iteration it: query head head_kv * group + it / m_range, q-block i_begin + it % m_range.
  auto load_q_block = [&](int it, int buf) {
    const int h = head_kv * p.group + it / m_range, m0 = (i_begin + it % m_range) * kBlockM;
    const T* q_tile = static_cast<const T*>(p.q) +
                      bwd_offset(seq, seq.q_start, p.q_batch_stride, p.q_row_stride, p.q_head_stride, m0, h);
    const T* do_tile = static_cast<const T*>(p.dout) +
                       bwd_offset(seq, seq.q_start, p.do_batch_stride, p.do_row_stride, p.do_head_stride, m0, h);
    load_tile<T, kBlockM, kHeadDim, kThreads>(sQ + buf * TileQ::kElements, q_tile, p.q_row_stride, seqlen_q - m0,
                                              p.head_dim, vectorized);
    load_tile<T, kBlockM, kHeadDim, kThreads>(sDo + buf * TileQ::kElements, do_tile, p.do_row_stride, seqlen_q - m0,
                                              p.head_dim, vectorized);
    load_lse_d<kBlockM>(sLse + buf * kBlockM, sD + buf * kBlockM, p, seq, h, m0);
  };
  if (num_iters > 0) load_q_block(0, 0);
  cp_async_commit();

  float acc_dk[kDTiles][4], acc_dv[kDTiles][4];
#pragma unroll
  for (int nt = 0; nt < kDTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nt][e] = acc_dv[nt][e] = 0.f;

  const int warp_row = warp * 16;                     // this warp's first key row in the block
  const int d0 = Tr::kSplitD == 1 ? 0 : part * kDimPart;  // first head_dim column of this CTA's dK, dV, dQ
  const int wm = warp % Tr::kDqWarpsM, wn = warp / Tr::kDqWarpsM, dq_col0 = d0 + wn * Tr::kDqCols;

  // ldmatrix lane addresses (patterns in mma.cuh): A of K/V rows, B of Q/dO [q][d], B^T of Q/dO and
  // of K [row][d], A^T of dS^T [key][q].
  const uint32_t sK_addr = smem_addr(sK), sV_addr = smem_addr(sV), sQ_addr = smem_addr(sQ),
                 sDo_addr = smem_addr(sDo), sDs_addr = smem_addr(sDs);
  const TileCursor<kBlockN, kHeadDim> cur_kv_a(warp_row + lane % 16, lane / 16);
  const TileCursor<kBlockM, kHeadDim> cur_q_b(8 * (lane / 16) + lane % 8, (lane / 8) % 2);
  const TileCursor<kBlockM, kHeadDim> cur_q_bt(8 * ((lane / 8) % 2) + lane % 8, lane / 16);
  const TileCursor<kBlockN, kHeadDim> cur_kv_bt(8 * ((lane / 8) % 2) + lane % 8, lane / 16);
  const TileCursor<kBlockN, kBlockM> cur_ds_at(lane % 8 + 8 * (lane / 16), (lane / 8) % 2);

  for (int it = 0; it < num_iters; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; every warp is done with iteration it - 1 (its buffers, dS^T)
    if (it + 1 < num_iters) load_q_block(it + 1, buf ^ 1);
    cp_async_commit();

    const int h = head_kv * p.group + it / m_range, m_block = i_begin + it % m_range, m0 = m_block * kBlockM;
    const uint32_t q_s = sQ_addr + buf * TileQ::kBytes, do_s = sDo_addr + buf * TileQ::kBytes;

    // Boundary blocks: the element mask in block coordinates (key row r, query column c), 32-bit:
    // visible iff lo <= r - c <= hi, r < rows_k, c < cols_q (the band of Mask, clamped).
    const BlockBand bb = block_band<kBlockM>(mask, seqlen_q, seqlen_k, n0, n1, m0);
    const bool need_mask = bb.need_mask;
    const int band_lo = bb.lo, band_hi = bb.hi;
    const int rows_k = seqlen_k - n0, cols_q = seqlen_q - m0;
    // ALiBi: query head h's slope (0: none).
    float alibi_slope_log2 = 0.f;
    if constexpr (kScoreMod)
      if (p.alibi_slopes) alibi_slope_log2 = p.alibi_slopes[b * p.alibi_slopes_batch_stride + h] * kLog2e;
    const float* lse_s = sLse + buf * kBlockM;
    const float* dsum_s = sD + buf * kBlockM;

    // The q-block in chunks of chunk_m query columns: S^T and dP^T of a chunk are all the
    // per-iteration registers (dV, dK sum over the chunks; dS^T collects the whole block).
#pragma unroll
    for (int c0 = 0; c0 < kBlockM; c0 += kChunkM) {
      // S^T = K_w Q^T and dP^T = V_w dO^T: (16 keys x chunk_m queries) per warp.
      // Dropout's keep bits (its instance) first, while S^T and dP^T hold no registers.
      uint32_t keep[kMTiles / 2];
      const bool dropout = kDropout && p.dropout.on();
      if (dropout) dropout_keep<kMTiles>(p.dropout, keep, b * p.num_heads + h, (m0 + c0) / 16, (n0 + warp_row) / 16, g, t);
      float s[kMTiles][4], dp[kMTiles][4];
#pragma unroll
      for (int nt = 0; nt < kMTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
      constexpr int kNp = kChunkM / 16;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a_k[4], a_v[4];
        ldsm_x4(a_k, sK_addr + cur_kv_a.at(0, kk * 16));
        ldsm_x4(a_v, sV_addr + cur_kv_a.at(0, kk * 16));
#pragma unroll
        for (int np = 0; np < kNp; ++np) {
          uint32_t b_q[4], b_do[4];
          ldsm_x4(b_q, q_s + cur_q_b.at(c0 + np * 16, kk * 16));
          ldsm_x4(b_do, do_s + cur_q_b.at(c0 + np * 16, kk * 16));
          mma_16816<T>(s[2 * np], a_k, b_q[0], b_q[1]);
          mma_16816<T>(s[2 * np + 1], a_k, b_q[2], b_q[3]);
          mma_16816<T>(dp[2 * np], a_v, b_do[0], b_do[1]);
          mma_16816<T>(dp[2 * np + 1], a_v, b_do[2], b_do[3]);
        }
      }

      // P^T and dS^T in place of S^T and dP^T.
      BandMask band{warp_row + g, c0 + 2 * t, band_lo, band_hi, rows_k, cols_q};
      if constexpr (kScoreMod)  // ALiBi's diagonal: key row - query column at distance 0
        band.alibi_diag = seqlen_k - seqlen_q - (n0 - m0), band.alibi_slope_log2 = alibi_slope_log2;
      const float* lse_cols = lse_s + c0 + 2 * t;  // this thread's query columns: + nt * 8 + {0, 1}
      const float* dsum_cols = dsum_s + c0 + 2 * t;
      // The score mods' general path in their instance; dropout's runs it only with them.
      if (dropout) dropout_dp(dp, keep, p.dropout.scale);
      if (kScoreMod && (!kDropout || p.softcap > 0.f || p.alibi_slopes)) {
        if constexpr (kScoreMod) probs_and_grads<true>(s, dp, lse_cols, dsum_cols, p, band, need_mask);
      } else if (need_mask) {
        probs_and_grads<true, kMTiles, false>(s, dp, lse_cols, dsum_cols, p, band, true);
      } else {
        probs_and_grads<false>(s, dp, lse_cols, dsum_cols, p, band, false);
      }
      if (dropout) dropout_p(s, keep);

      // Packed once: A fragments of dV += P^T dO_i and dK += dS^T Q_i, and dS^T for dQ in shared memory.
      uint32_t a_p[kNp][4], a_ds[kNp][4];
#pragma unroll
      for (int ks = 0; ks < kNp; ++ks) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int nt = 2 * ks + half;
          a_p[ks][2 * half] = pack2<T>(s[nt][0], s[nt][1]);
          a_p[ks][2 * half + 1] = pack2<T>(s[nt][2], s[nt][3]);
          a_ds[ks][2 * half] = pack2<T>(dp[nt][0], dp[nt][1]);
          a_ds[ks][2 * half + 1] = pack2<T>(dp[nt][2], dp[nt][3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kMTiles; ++nt) {
        const int row = warp_row + g;
        *reinterpret_cast<uint32_t*>(sDs + TileDs::offset(row, c0 + nt * 8) + 2 * t) = a_ds[nt / 2][2 * (nt % 2)];
        *reinterpret_cast<uint32_t*>(sDs + TileDs::offset(row + 8, c0 + nt * 8) + 2 * t) =
            a_ds[nt / 2][2 * (nt % 2) + 1];
      }

      // dV += P^T dO_i and dK += dS^T Q_i, B = dO_i / Q_i [q][d] (.trans), the next step's B loading
      // while this step's mma run.
      constexpr int kDNp = kDimPart / 16, kKvSteps = kNp * kDNp;
      uint32_t b_dot[2][4], b_qt[2][4];
      auto load_kv = [&](int step, int st) {
        const int ks = step / kDNp, np = step % kDNp;
        ldsm_x4_trans(b_dot[st], do_s + cur_q_bt.at(c0 + ks * 16, d0 + np * 16));
        ldsm_x4_trans(b_qt[st], q_s + cur_q_bt.at(c0 + ks * 16, d0 + np * 16));
      };
      load_kv(0, 0);
#pragma unroll
      for (int step = 0; step < kKvSteps; ++step) {
        if (step + 1 < kKvSteps) load_kv(step + 1, (step + 1) % 2);
        const int ks = step / kDNp, np = step % kDNp, st = step % 2;
        mma_16816<T>(acc_dv[2 * np], a_p[ks], b_dot[st][0], b_dot[st][1]);
        mma_16816<T>(acc_dv[2 * np + 1], a_p[ks], b_dot[st][2], b_dot[st][3]);
        mma_16816<T>(acc_dk[2 * np], a_ds[ks], b_qt[st][0], b_qt[st][1]);
        mma_16816<T>(acc_dk[2 * np + 1], a_ds[ks], b_qt[st][2], b_qt[st][3]);
      }
    }
    __syncthreads();  // dS^T complete

    // dQ_i (block_m x kDimPart) += dS K_j: warp (wm, wn) owns rows 16 wm, columns kDqCols wn.
    // A = dS from dS^T [key][q] (.trans), B = K_j [key][d] (.trans).
    float acc_dq[kDqTiles][4];
#pragma unroll
    for (int nt = 0; nt < kDqTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dq[nt][e] = 0.f;
    {
      constexpr int kNq = kDqTiles / 2, kDqSteps = kBlockN / 16 * kNq;
      uint32_t a_ds[2][4], b_k[2][4];
      ldsm_x4_trans(a_ds[0], sDs_addr + cur_ds_at.at(0, wm * 16));
      ldsm_x4_trans(b_k[0], sK_addr + cur_kv_bt.at(0, dq_col0));
#pragma unroll
      for (int step = 0; step < kDqSteps; ++step) {
        const int next = step + 1;
        if (next < kDqSteps) {  // the next step's fragments load while this step's mma run
          if (next % kNq == 0) ldsm_x4_trans(a_ds[(next / kNq) % 2], sDs_addr + cur_ds_at.at(next / kNq * 16, wm * 16));
          ldsm_x4_trans(b_k[next % 2], sK_addr + cur_kv_bt.at(next / kNq * 16, dq_col0 + next % kNq * 16));
        }
        const int ks = step / kNq, np = step % kNq;
        mma_16816<T>(acc_dq[2 * np], a_ds[ks % 2], b_k[step % 2][0], b_k[step % 2][1]);
        mma_16816<T>(acc_dq[2 * np + 1], a_ds[ks % 2], b_k[step % 2][2], b_k[step % 2][3]);
      }
    }

    int32_t* semaphore = nullptr;
    if (p.deterministic) {  // wait for the k-blocks before this one that visit q-block m_block
      semaphore = p.dq_semaphore + ((int64_t(b) * p.num_heads + h) * p.num_m_blocks + m_block) * Tr::kSplitD + part;
      const int expected = n_block - int(mask.key_begin(m0) / kBlockN);
      if (tid == 0)
        while (ld_acquire(semaphore) != expected) {
        }
      __syncthreads();
    }
    const int64_t ws0 = int64_t(h) * p.rows_q + seq.ws_row + m0;  // the q-block's first accumulator row
    float* acc_rows = p.dq_accum + ws0 * kHeadDim;
    const int row = wm * 16 + g, swz = dq_swizzle(ws0 + row);  // rows row and row + 8: the same swizzle
#pragma unroll
    for (int nt = 0; nt < kDqTiles; ++nt) {
      const int col = (dq_col0 + nt * 8 + 2 * t) ^ swz;
      if (m0 + row < seqlen_q) atomic_add2(acc_rows + int64_t(row) * kHeadDim + col, acc_dq[nt][0], acc_dq[nt][1]);
      if (m0 + row + 8 < seqlen_q)
        atomic_add2(acc_rows + int64_t(row + 8) * kHeadDim + col, acc_dq[nt][2], acc_dq[nt][3]);
    }
    if (p.deterministic) {
      __threadfence();
      __syncthreads();
      if (tid == 0) atomicAdd(semaphore, 1);
    }
  }
  cp_async_wait<0>();  // nothing in flight at exit (a k-block that no q-block sees still loads K_j, V_j)

  // dK_j * softmax_scale and dV_j (* dropout's 1 / (1 - p)) in the dtype (rows past seqlen_k and padded
  // columns dropped).
  T* dk = static_cast<T*>(p.dk) +
          bwd_offset(seq, seq.k_start, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, n0, head_kv);
  T* dv = static_cast<T*>(p.dv) +
          bwd_offset(seq, seq.k_start, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, n0, head_kv);
  const float dv_scale = kDropout ? p.dropout.scale : 1.f;
#pragma unroll
  for (int nt = 0; nt < kDTiles; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row + g + 8 * half, col = d0 + nt * 8 + 2 * t;
      if (n0 + row >= seqlen_k) continue;
      store2<T>(dk + int64_t(row) * p.dk_row_stride, col, p.head_dim, acc_dk[nt][2 * half] * p.softmax_scale,
                acc_dk[nt][2 * half + 1] * p.softmax_scale, vectorized);
      store2<T>(dv + int64_t(row) * p.dv_row_stride, col, p.head_dim, acc_dv[nt][2 * half] * dv_scale,
                acc_dv[nt][2 * half + 1] * dv_scale, vectorized);
    }
  }
}

}  // namespace flashattn::sm80
