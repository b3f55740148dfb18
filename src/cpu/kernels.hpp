// Vector building blocks of the CPU FA2 kernels: a register-tiled fp32 matrix product, a
// vectorized exp2 and tanh, fp16/bf16 row conversion and aligned scratch buffers.
//
// The vector width follows the target the compiler builds for (-march=native): 16 lanes with
// AVX-512, 8 otherwise (AVX2; without AVX the compiler splits the 32-byte vectors). The code uses
// GCC/Clang vector extensions, so the same source gives zmm or ymm code; FMAs come from
// -ffp-contract=fast.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/dropout.hpp"
#include "common/dtype.hpp"
#include "common/mask.hpp"

namespace flashattn::cpu {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kTileRows = 8;  // 8 x 2 zmm accumulators: 16 of 32 registers, 8 independent FMA chains per B vector
#else
constexpr int kLanes = 8;
constexpr int kTileRows = 6;  // 6 x 2 ymm accumulators + 2 B vectors + 1 broadcast = 15 of 16 registers
#endif
constexpr int kTileVecs = 2;  // B vectors per tile column panel
constexpr int kChunkK = 128;  // the reduction is split in chunks so a B panel (kChunkK x 2 vectors) stays in L1

typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t vint __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef float vfloat_u __attribute__((vector_size(kLanes * sizeof(float)), aligned(4), may_alias));
typedef uint32_t u32x8 __attribute__((vector_size(8 * sizeof(uint32_t))));  // dropout's numbers, 8 rows
typedef float f32x8 __attribute__((vector_size(8 * sizeof(float))));

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

inline vfloat vload(const float* p) { return *reinterpret_cast<const vfloat_u*>(p); }
inline void vstore(float* p, vfloat v) { *reinterpret_cast<vfloat_u*>(p) = v; }
// A splat (not `vfloat{} + x`: without fast-math that is a real add on the critical path).
inline vfloat vbroadcast(float x) {
#if defined(__AVX512F__)
  return vfloat(_mm512_set1_ps(x));
#elif defined(__AVX__)
  return vfloat(_mm256_set1_ps(x));
#else
  vfloat v;
  for (int i = 0; i < kLanes; ++i) v[i] = x;
  return v;
#endif
}
inline vfloat vmax(vfloat a, vfloat b) { return a > b ? a : b; }
inline float hmax(vfloat v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}
inline float hsum(vfloat v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// 2^x for x <= 0 (the softmax's x - max); 0 below -126 and for -inf. Relative error ~2e-7:
// x = n + f with n = round(x), f in [-1/2, 1/2]; 2^f by its degree-6 Taylor polynomial; 2^n by
// writing n into the exponent bits.
inline vfloat exp2v(vfloat x) {
  const vfloat lo = vbroadcast(-126.f);
  vfloat xc = x > lo ? x : lo;
  const vfloat round_magic = vbroadcast(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  vfloat n = (xc + round_magic) - round_magic;
  vfloat f = xc - n;
  vfloat y = vbroadcast(1.5403530393381606e-4f);  // ln2^6 / 6!
  y = y * f + 1.3333558146428443e-3f;              // ln2^5 / 5!
  y = y * f + 9.6181291076284772e-3f;              // ln2^4 / 4!
  y = y * f + 5.5504108664821580e-2f;              // ln2^3 / 3!
  y = y * f + 0.24022650695910071f;                // ln2^2 / 2!
  y = y * f + 0.69314718055994531f;                // ln2
  y = y * f + 1.f;
  vint e = (__builtin_convertvector(n, vint) + 127) << 23;
  vfloat r = y * __builtin_bit_cast(vfloat, e);
  return x > lo ? r : vfloat{};
}

// tanh(x), within a few ulp of std::tanh (tests/test_cpu_blocks.cpp), for the softcap: on |x| < 0.625 the odd
// polynomial x + x^3 P(x^2) (Cephes' tanhf coefficients), elsewhere (1 - e) / (1 + e) with e = e^{-2|x|} <= 0.29
// (no cancellation; e = 0 past |x| ~ 44: tanh = 1), the sign put back. NaN stays NaN. In place of a scalar
// std::tanh a score: the softcapped forward ran 6.6x, the backward 3.7x the time of the plain ones.
inline vfloat tanhv(vfloat x) {
  const vfloat ax = x < vfloat{} ? -x : x, z = x * x;
  vfloat poly = vbroadcast(-5.70498872745e-3f);
  poly = poly * z + 2.06390887954e-2f;
  poly = poly * z - 5.37397155531e-2f;
  poly = poly * z + 1.33314422036e-1f;
  poly = poly * z - 3.33332819422e-1f;
  const vfloat small = poly * z * x + x;
  const vfloat one = vbroadcast(1.f), e = exp2v(ax * (-2.f * kLog2e));
  const vfloat large_abs = (one - e) / (one + e);
  const vfloat large = x < vfloat{} ? -large_abs : large_abs;
  const vfloat r = ax < vbroadcast(0.625f) ? small : large;
  return x == x ? r : x;
}

// C (m x n) = or += A (m x k) B (k x n), fp32, row-major B and C with n a multiple of kLanes.
// A is read element by element (broadcast), so it can be used transposed at no cost:
//   a_trans = false: A(r, kk) = a[r * lda + kk];   a_trans = true: A(r, kk) = a[kk * lda + r].
template <int R, int NV, bool ATrans>
inline void gemm_tile(int k, const float* __restrict a, int64_t lda, const float* __restrict b, int64_t ldb,
                      float* __restrict c, int64_t ldc, bool accumulate) {
  vfloat acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? vload(c + r * ldc + v * kLanes) : vfloat{};
  for (int kk = 0; kk < k; ++kk) {
    vfloat bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = vload(b + kk * ldb + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      vfloat av = vbroadcast(ATrans ? a[kk * lda + r] : a[r * lda + kk]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vstore(c + r * ldc + v * kLanes, acc[r][v]);
}

// Rows left over after the full tiles: dispatch on their count (1 .. R-1) at compile time.
template <int R, int NV, bool ATrans>
inline void gemm_tail_rows(int rows, int k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                           int64_t ldc, bool accumulate) {
  if constexpr (R > 0) {
    if (rows == R) return gemm_tile<R, NV, ATrans>(k, a, lda, b, ldb, c, ldc, accumulate);
    gemm_tail_rows<R - 1, NV, ATrans>(rows, k, a, lda, b, ldb, c, ldc, accumulate);
  }
}

template <int NV, bool ATrans>
inline void gemm_panel(int m, int k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                       bool accumulate) {
  const int64_t a_row_step = ATrans ? 1 : lda;
  int i = 0;
  for (; i + kTileRows <= m; i += kTileRows)
    gemm_tile<kTileRows, NV, ATrans>(k, a + i * a_row_step, lda, b, ldb, c + i * ldc, ldc, accumulate);
  if (i < m) gemm_tail_rows<kTileRows - 1, NV, ATrans>(m - i, k, a + i * a_row_step, lda, b, ldb, c + i * ldc, ldc, accumulate);
}

template <bool ATrans>
inline void gemm(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                 bool accumulate) {
  if (k <= 0) {
    if (!accumulate)
      for (int i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.f);
    return;
  }
  const int64_t a_k_step = ATrans ? lda : 1;
  for (int k0 = 0; k0 < k; k0 += kChunkK) {
    const int kc = std::min(kChunkK, k - k0);
    const float* ak = a + k0 * a_k_step;
    const float* bk = b + k0 * ldb;
    const bool acc = accumulate || k0 > 0;
    int j = 0;
    for (; j + kTileVecs * kLanes <= n; j += kTileVecs * kLanes)
      gemm_panel<kTileVecs, ATrans>(m, kc, ak, lda, bk + j, ldb, c + j, ldc, acc);
    for (; j < n; j += kLanes) gemm_panel<1, ATrans>(m, kc, ak, lda, bk + j, ldb, c + j, ldc, acc);
  }
}

// ALiBi on a transposed score block S^T (nv keys from n0, rows lanes of queries from m0; row stride
// m_pad): S_ij -= slope * |i + seqlen_k - seqlen_q - j|, slope in the block's units (log2 e for scores
// in log2 units). Lanes past `rows` are left alone.
inline void add_alibi_t(float* s_t, int nv, int rows, int64_t m_pad, int64_t n0, int64_t m0, const Mask& mask, float slope) {
  for (int j = 0; j < nv; ++j) {
    float* srow = s_t + j * m_pad;
    for (int i = 0; i < rows; ++i) srow[i] -= slope * float(mask.diagonal_distance(m0 + i, n0 + j));
  }
}

// The 32 Philox calls of one 16 x 16 dropout tile (row tile i16, key tile j16 of bh = sequence * num_heads + head):
// words[k][8 t + g] is word k of lane 4 g + t's call (DropoutMask::call; in this order a key's rows g = 0..7 of a
// word lie side by side). The loop over the calls is what the compiler vectorizes.
inline void philox_tile(const DropoutMask& dropout, int32_t bh, int32_t i16, int32_t j16, uint32_t (&words)[4][32]) {
  for (int l = 0; l < 32; ++l) {
    const Philox4 o = dropout.call(bh, i16, j16, 4 * (l % 8) + l / 8);
    words[0][l] = o.x, words[1][l] = o.y, words[2][l] = o.z, words[3][l] = o.w;
  }
}

// Dropout's factors Z^T of a transposed block (nv keys from n0, queries from m0, row stride m_pad): the keep
// scale or 0 (src/common/dropout.hpp), the 32 calls of each 16 x 16 tile the block touches at once
// (philox_tile); lanes past `rows` 0. bh: sequence * num_heads + query head. Element (row r, key c) of a tile is
// number e = c % 2 + 2 (r / 8) + 4 (c / 8) of lane 4 (r % 8) + (c % 8) / 2: half c % 2 of word
// r / 8 + 2 (c / 8).
inline void dropout_factors_t(float* z_t, int nv, int rows, int64_t m_pad, int64_t n0, int64_t m0,
                              const DropoutMask& dropout, int32_t bh) {
  for (int j = 0; j < nv; ++j) std::fill(z_t + j * m_pad, z_t + (j + 1) * m_pad, 0.f);
  uint32_t words[4][32];
  for (int64_t i16 = m0 / 16; i16 * 16 < m0 + rows; ++i16) {
    // The tile's rows inside the block.
    const int r_begin = int(std::max<int64_t>(0, m0 - i16 * 16)), r_end = int(std::min<int64_t>(16, m0 + rows - i16 * 16));
    for (int64_t j16 = n0 / 16; j16 * 16 < n0 + nv; ++j16) {
      philox_tile(dropout, bh, int32_t(i16), int32_t(j16), words);
      const int c_begin = int(std::max<int64_t>(0, n0 - j16 * 16)), c_end = int(std::min<int64_t>(16, n0 + nv - j16 * 16));
      for (int c = c_begin; c < c_end; ++c) {
        float* out = z_t + (j16 * 16 + c - n0) * m_pad + (i16 * 16 - m0);
        const int shift = 16 * (c % 2), t = (c % 8) / 2, k = 2 * (c / 8);
        // Rows 8 h .. 8 h + 7: the numbers 8 t .. 8 t + 7 of word k + h, 8 at a time (element by element, with a
        // copy a key, the factors took 2.8x as long).
        float tile_col[16];
        for (int h = 0; h < 2; ++h) {
          u32x8 number;
          std::memcpy(&number, &words[k + h][8 * t], sizeof number);
          number = (number >> shift) & 0xffffu;
          const f32x8 factor = number >= dropout.threshold ? f32x8{} + dropout.scale : f32x8{};
          std::memcpy(tile_col + 8 * h, &factor, sizeof factor);
        }
        if (r_begin == 0 && r_end == 16)
          std::memcpy(out, tile_col, sizeof tile_col);
        else
          for (int r = r_begin; r < r_end; ++r) out[r] = tile_col[r];
      }
    }
  }
}

// n elements of a row of dtype dt at src[offset ...] -> fp32.
inline void load_row_f32(const void* src, int64_t offset, int n, fa_dtype dt, float* out) {
  if (dt == FA_FLOAT32) {
    std::memcpy(out, static_cast<const float*>(src) + offset, size_t(n) * sizeof(float));
  } else if (dt == FA_BFLOAT16) {
    const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
    for (int i = 0; i < n; ++i) {
      uint32_t bits = uint32_t(s[i]) << 16;
      std::memcpy(out + i, &bits, 4);
    }
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
    for (; i < n; ++i) out[i] = half_to_float(s[i]);
  }
}

// n fp32 values -> a row of dtype dt at dst[offset ...] (round to nearest even).
inline void store_row_f32(void* dst, int64_t offset, int n, const float* in, fa_dtype dt) {
  if (dt == FA_FLOAT32) {
    std::memcpy(static_cast<float*>(dst) + offset, in, size_t(n) * sizeof(float));
  } else {
    store_row(dst, offset, n, in, dt);
  }
}

// Scratch blocks of 64-byte aligned memory, bytes a multiple of 64 (scratch.cpp): take one of at least `bytes`
// (*capacity: its size, up to twice that), give it back with its capacity. A thread keeps what it gave back (up
// to 256 MB) for its next takes, so repeated calls touch no fresh pages.
void* scratch_take(size_t bytes, size_t* capacity);
void scratch_give(void* block, size_t capacity);

// 64-byte aligned fp32 scratch, zero-initialized unless `zero` is false (large buffers that the
// threads fill themselves: their pages are then first touched in parallel, the first call).
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t n, bool zero = true) {
    const size_t bytes = size_t(round_up(std::max<int64_t>(n, 1) * int64_t(sizeof(float)), 64));
    ptr_ = static_cast<float*>(scratch_take(bytes, &capacity_));
    if (zero) std::memset(ptr_, 0, bytes);
  }
  Buffer(Buffer&& other) noexcept
      : capacity_(std::exchange(other.capacity_, 0)), ptr_(std::exchange(other.ptr_, nullptr)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      capacity_ = std::exchange(other.capacity_, 0);
      ptr_ = std::exchange(other.ptr_, nullptr);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }
  float* get() const { return ptr_; }

 private:
  void release() {
    if (ptr_) scratch_give(ptr_, capacity_);
    ptr_ = nullptr;
  }
  size_t capacity_ = 0;  // the block's bytes (scratch_take)
  float* ptr_ = nullptr;
};

}  // namespace flashattn::cpu
