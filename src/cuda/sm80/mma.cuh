// Device primitives for the sm_80+ kernels (forward and backward): cp.async, ldmatrix,
// mma.sync m16n8k16 with fp32 accumulation, the shared-memory swizzle, fp32 -> 16-bit packing,
// exp2 and quad reductions over the mma accumulator layout.
//
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16").
// In a warp, lane = 4 * g + t with g = lane / 4 (0..7, the "group") and t = lane % 4.
//   A (16 x 16, row major, 4 x b32 regs of 2 x 16-bit):
//     a[0] = A[g    ][2t, 2t+1]      a[1] = A[g + 8][2t, 2t+1]
//     a[2] = A[g    ][2t+8, 2t+9]    a[3] = A[g + 8][2t+8, 2t+9]
//   B (16 x 8, k x n, "col": stored n-major like K in S = Q K^T; 2 x b32 regs):
//     b[0] = B[2t, 2t+1][g]          b[1] = B[2t+8, 2t+9][g]
//   C / D (16 x 8, fp32, 4 regs):
//     c[0], c[1] = C[g    ][2t, 2t+1]
//     c[2], c[3] = C[g + 8][2t, 2t+1]
// So a C row is spread over the 4 lanes of a quad (same g): row reductions are two xor-shuffles
// (lane ^ 1, lane ^ 2). Two C tiles side by side (n = 0..7 and 8..15) are, after packing each
// pair of fp32 to 16 bits, exactly the A fragment of a 16 x 16 tile:
//     a[0] = pack(c_left[0..1]), a[1] = pack(c_left[2..3]), a[2] = pack(c_right[0..1]), a[3] = pack(c_right[2..3])
// which is how P = softmax(S) feeds O += P V without going through shared memory.
//
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses (16 bytes each) of 8 x 8 matrix i; register
// i of every lane then holds matrix i's row g, columns 2t, 2t+1 (the .trans form gives the
// transpose: row 2t and 2t+1 of column g). Address patterns used by the kernels:
//   A from a row-major [m][k] tile:    lane -> row (lane % 16), k-column 8 * (lane / 16)
//   B from an [n][k] tile (K):          lane -> n-row 8 * (lane / 16) + lane % 8, k-column 8 * ((lane / 8) % 2)
//                                       registers: {b[0], b[1]} of n-tile 0, {b[0], b[1]} of n-tile 1
//   B from a [k][n] tile (V), .trans:   lane -> k-row 8 * ((lane / 8) % 2) + lane % 8, n-column 8 * (lane / 16)
//                                       registers: {b[0], b[1]} of n-tile 0, {b[0], b[1]} of n-tile 1
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashattn::sm80 {

// ---------------------------------------------------------------------------------------------
// Shared-memory tile layout with an XOR swizzle.
//
// A tile of `rows` x `cols` 16-bit elements is stored as cols / kChunk column chunks, each a
// [rows][kChunk] block. Inside a row of a chunk, the 16-byte unit u (8 elements) is stored at
// u ^ f(row). With 128-byte rows (kChunk = 64, 8 units) f(row) = row % 8; with 64-byte rows
// (kChunk = 32, 4 units, used when cols is not a multiple of 64) f(row) = (row / 2) % 4. Either
// way the 8 rows read by one ldmatrix 8 x 8 matrix (same logical unit, 8 consecutive rows) and
// 8 consecutive 16-byte cp.async writes of one row land in 8 distinct 16-byte bank groups:
// no bank conflicts.
template <int kRows, int kCols>
struct SmemTile {
  static constexpr int kChunk = (kCols % 64 == 0) ? 64 : 32;  // elements per chunk row
  static constexpr int kUnits = kChunk / 8;                  // 16-byte units per chunk row
  static_assert(kCols % kChunk == 0 && kRows % 8 == 0, "tile shape must be whole chunks of 8 rows");
  static constexpr int kElements = kRows * kCols;
  static constexpr int kBytes = kElements * 2;

  // Element offset of (row, col); col must be a multiple of 8 (a 16-byte unit).
  __device__ __forceinline__ static int offset(int row, int col) {
    const int chunk = col / kChunk, unit = (col % kChunk) / 8;
    const int swz = kUnits == 8 ? (row & 7) : ((row >> 1) & 3);
    return (chunk * kRows + row) * kChunk + ((unit ^ swz) * 8);
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------------------------
// cp.async: 16 bytes global -> shared, bypassing L1 (.cg). When !valid nothing is read and the 16
// bytes are zero-filled (src-size 0): out-of-range rows and padded head_dim columns become 0.
// `src` must still be a mapped address; callers pass the tensor base when !valid.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most n of this thread's committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

// Whether load_whole_tile / store_whole_tile can split a [kRows][kCols] tile over kThreads threads:
// whole 16-byte units per row across the threads, row steps of a multiple of 8 (the swizzle period).
template <int kRows, int kCols, int kThreads>
constexpr bool whole_tile_split() {
  constexpr int units = kCols / 8;
  return kThreads % units == 0 && kThreads / units % 8 == 0 && kRows % (kThreads / units) == 0;
}

// cp.async of a whole [kRows][kCols] tile (every row inside the sequence, head_dim == kCols, 16-byte
// aligned rows): thread tid loads rows tid / kUnitsPerRow + j * kRowStep, 16-byte unit tid % kUnitsPerRow.
// kRowStep is a multiple of 8 and the swizzle depends only on row % 8, so unit j's shared offset is the
// first one plus a constant and its global offset the first plus j row steps: per unit one 64-bit add,
// no per-unit index math or predicate (the generic load_tile spent ~25 instructions a unit, ncu).
template <class T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_whole_tile(uint32_t smem_tile, const T* gmem_tile, int64_t row_stride) {
  using Tile = SmemTile<kRows, kCols>;
  constexpr int kUnitsPerRow = kCols / 8, kRowStep = kThreads / kUnitsPerRow, kSteps = kRows / kRowStep;
  static_assert(whole_tile_split<kRows, kCols, kThreads>(), "whole-tile split");
  const int r = threadIdx.x / kUnitsPerRow, c = (threadIdx.x % kUnitsPerRow) * 8;
  const T* src = gmem_tile + (r * row_stride + c);
  const uint32_t dst = smem_tile + uint32_t(2 * Tile::offset(r, c));
#pragma unroll
  for (int j = 0; j < kSteps; ++j)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + j * kRowStep * Tile::kChunk * 2),
                 "l"(src + j * kRowStep * row_stride));
}

// The reverse of load_whole_tile: rows [0, rows_valid) of a swizzled [kRows][kCols] tile to global
// memory as 16-byte stores, with the same per-thread split (one 64-bit add per unit, one row test).
template <class T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void store_whole_tile(T* gmem_tile, int64_t row_stride, const T* smem_tile, int rows_valid) {
  using Tile = SmemTile<kRows, kCols>;
  constexpr int kUnitsPerRow = kCols / 8, kRowStep = kThreads / kUnitsPerRow, kSteps = kRows / kRowStep;
  static_assert(whole_tile_split<kRows, kCols, kThreads>(), "whole-tile split");
  const int r = threadIdx.x / kUnitsPerRow, c = (threadIdx.x % kUnitsPerRow) * 8;
  T* dst = gmem_tile + (r * row_stride + c);
  const T* src = smem_tile + Tile::offset(r, c);
#pragma unroll
  for (int j = 0; j < kSteps; ++j)
    if (r + j * kRowStep < rows_valid)
      *reinterpret_cast<uint4*>(dst + j * kRowStep * row_stride) =
          *reinterpret_cast<const uint4*>(src + j * kRowStep * Tile::kChunk);
}

// ---------------------------------------------------------------------------------------------
// ldmatrix: four 8 x 8 matrices of 16-bit elements (layouts in the header comment), from a 32-bit
// shared-memory address (a WarpCursor's, below).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// One lane's ldmatrix row address in a SmemTile, as a shared-memory byte address: the lane part
// (row_t, unit_t in {0, 1}) and a per-warp column offset col_w are folded in at construction; at()
// adds a compile-time (row_c a multiple of 8, col_c a multiple of 16) part. Rows are 64 or 128 bytes
// and tiles start 128-byte aligned, so the 16-byte unit sits in address bits 4..6 and the swizzled
// unit (unit_c | unit_w | unit_t) ^ swizzle(row_t) is the lane address XOR (unit_c << 4): one logic op.
// Needs the unit bits of col_w % chunk, of col_c and unit_t disjoint (power-of-two warp column spans).
template <int kRows, int kCols>
struct WarpCursor {
  using Tile = SmemTile<kRows, kCols>;
  uint32_t addr;
  __device__ __forceinline__ WarpCursor(uint32_t tile, int row_t, int unit_t, int col_w) {
    const int swz = Tile::kUnits == 8 ? (row_t & 7) : ((row_t >> 1) & 3);
    const int x = unit_t ^ swz ^ ((col_w % Tile::kChunk) / 8);
    addr = tile + uint32_t(2 * ((col_w / Tile::kChunk) * kRows * Tile::kChunk + row_t * Tile::kChunk) + (x << 4));
  }
  __device__ __forceinline__ uint32_t at(int row_c, int col_c) const {
    const int chunk = col_c / Tile::kChunk, unit = (col_c % Tile::kChunk) / 8;
    return (addr ^ uint32_t(unit << 4)) + uint32_t(2 * (chunk * kRows + row_c) * Tile::kChunk);
  }
};

// ---------------------------------------------------------------------------------------------
// mma.sync m16n8k16, fp32 accumulate in place: c += a * b.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------------------------------------
// Two fp32 -> one b32 of two 16-bit values (lo in the low half), round to nearest even.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// ---------------------------------------------------------------------------------------------
// Math.
constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))
constexpr float kLn2 = 0.6931471805599453f;    // log(x) = log2(x) * ln(2)

// 2^x with the SFU (ex2.approx, flush-to-zero): exp2_fast(-inf) = 0.
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the 4 lanes of a quad, i.e. over one row of an mma C fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashattn::sm80
