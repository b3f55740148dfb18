// Standard attention on the GPU, the way a framework's eager ops compute it: the seeds' baseline
// that materializes the (seqlen_q, seqlen_k) score and probability matrices in device memory.
//
//   S = softmax_scale * Q K^T      cuBLAS, fp32 S                       (batch, heads, seqlen_q, seqlen_k)
//   P = softmax(mask(softcap(S)))  one warp per row, P in the input dtype; lse = m + log(l)
//   O = P V                        cuBLAS, fp32 accumulation, written in the input dtype through o's strides
//
// S and P live in the caller's workspace (standard_forward_workspace): the O(N^2) memory that
// flash attention avoids. cuBLAS is column-major, so a row-major (rows, cols) matrix with row
// stride ld is its column-major transpose with leading dimension ld:
//   S^T (seqlen_k x seqlen_q, ld seqlen_k) = K (op T on K^T, ld k_row_stride) * Q^T (ld q_row_stride)
//   O^T (head_dim x seqlen_q, ld o_row_stride) = V^T (ld v_row_stride) * P^T (ld seqlen_k)
// Batches of heads go through cublasGemmStridedBatchedEx: one call per batch index over all
// heads for MHA; with GQA/MQA one call per (batch, group member) over the kv heads, or per
// (batch, kv head) over the group with K/V's stride 0, whichever makes fewer calls.
#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <unordered_map>

#include "common/layout.hpp"
#include "common/mask.hpp"
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace flashattn::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;  // softmax: one warp per row, four rows per block
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

size_t p_elem_bytes(const fa_params& p) { return p.dtype == FA_FLOAT32 ? 4 : 2; }
size_t s_count(const fa_params& p) { return size_t(p.batch) * p.num_heads * p.seqlen_q * size_t(p.seqlen_k); }

cudaDataType_t cuda_type(fa_dtype d) {
  return d == FA_FLOAT32 ? CUDA_R_32F : d == FA_FLOAT16 ? CUDA_R_16F : CUDA_R_16BF;
}

const char* cublas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    default: return "error";
  }
}

Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return {FA_ERROR_CUDA, format("standard attention: %s: cuBLAS %s (%d)", what, cublas_name(s), int(s))};
}

// One cuBLAS handle per (thread, device), created on first use. The handles stay alive until the
// process ends: destroying them from a thread-exit hook can run after the CUDA context is gone.
Status cublas_handle(cublasHandle_t* out) {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  int dev = 0;
  FA_CUDA_CHECK(cudaGetDevice(&dev));
  auto it = handles.find(dev);
  if (it == handles.end()) {
    cublasHandle_t h = nullptr;
    FA_RETURN_IF_ERROR(cublas_status(cublasCreate(&h), "cublasCreate"));
    it = handles.emplace(dev, h).first;
  }
  *out = it->second;
  return {};
}

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Row r of the (batch * heads * seqlen_q, seqlen_k) matrix S: mask, softcap, softmax into P.
// Masked entries get P = 0; a row with no visible key gets P = 0 (so O = 0) and lse = -inf.
template <class TP>
__global__ void softmax_rows(const float* __restrict__ s, TP* __restrict__ p_out, float* __restrict__ lse,
                             int64_t rows, int seqlen_q, int seqlen_k, Mask mask, float softcap) {
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const int i = int(r % seqlen_q);
  const int64_t begin = mask.key_begin(i), end = mask.key_end(i);
  const float* row = s + r * seqlen_k;
  TP* prow = p_out + r * seqlen_k;
  auto score = [&](int64_t j) {
    float x = row[j];
    return softcap > 0.f ? softcap * tanhf(x / softcap) : x;
  };
  // Each lane keeps a running (max m, sum l of exp(x - m)) over its keys; then the warp merges.
  float m = -INFINITY, l = 0.f;
  for (int64_t j = begin + lane; j < end; j += 32) {
    const float x = score(j);
    const float m_new = fmaxf(m, x);
    l = l * expf(m - m_new) + expf(x - m_new);
    m = m_new;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float m_o = __shfl_xor_sync(0xffffffffu, m, offset), l_o = __shfl_xor_sync(0xffffffffu, l, offset);
    const float m_new = fmaxf(m, m_o);
    l = m_new == -INFINITY ? 0.f : l * expf(m - m_new) + l_o * expf(m_o - m_new);
    m = m_new;
  }
  const bool empty = m == -INFINITY;
  const float inv_l = empty ? 0.f : 1.f / l;
  for (int64_t j = lane; j < seqlen_k; j += 32) {
    const float pj = (empty || j < begin || j >= end) ? 0.f : expf(score(j) - m) * inv_l;
    prow[j] = from_float<TP>(pj);
  }
  if (lse && lane == 0) {
    // rows are (batch, head, i) in order, which is lse's (batch, heads, seqlen_q) layout.
    lse[r] = empty ? -INFINITY : m + logf(l);
  }
}

// seqlen_k == 0: every row is fully masked (o = 0, lse = -inf); nothing to multiply.
template <class T>
__global__ void empty_keys(T* __restrict__ o, float* __restrict__ lse, int64_t rows, int seqlen_q, int num_heads,
                           int head_dim, int64_t o_batch_stride, int64_t o_row_stride, int64_t o_head_stride) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (r >= rows) return;
  const int64_t i = r % seqlen_q, bh = r / seqlen_q, h = bh % num_heads, b = bh / num_heads;
  T* orow = o + b * o_batch_stride + i * o_row_stride + h * o_head_stride;
  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) orow[c] = from_float<T>(0.f);
  if (lse && threadIdx.x == 0) lse[r] = -INFINITY;
}

// One strided-batched GEMM in the column-major terms of the header comment.
struct Gemm {
  cublasOperation_t op_a;
  int m, n, k;
  const void* a;
  int lda;
  long long stride_a;
  cudaDataType_t type_a;
  const void* b;
  int ldb;
  long long stride_b;
  cudaDataType_t type_b;
  void* c;
  int ldc;
  long long stride_c;
  cudaDataType_t type_c;
  int batch;
  float alpha;
};

// cuBLAS's leading dimension of a head's rows: the row stride, which must be >= head_dim; a
// single row may have any stride.
int leading_dim(int64_t row_stride, int64_t rows, int head_dim) {
  return int(rows == 1 && row_stride < head_dim ? head_dim : row_stride);
}

Status run_gemm(cublasHandle_t h, const Gemm& g) {
  const float beta = 0.f;
  return cublas_status(cublasGemmStridedBatchedEx(h, g.op_a, CUBLAS_OP_N, g.m, g.n, g.k, &g.alpha, g.a, g.type_a, g.lda,
                                                  g.stride_a, g.b, g.type_b, g.ldb, g.stride_b, &beta, g.c, g.type_c,
                                                  g.ldc, g.stride_c, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmStridedBatchedEx");
}

template <class T>
Status forward_typed(const fa_params& p) {
  cudaStream_t stream = stream_of(p);
  const int64_t rows = int64_t(p.batch) * p.num_heads * p.seqlen_q;
  if (p.seqlen_k == 0) {
    const dim3 block(32, 8);
    empty_keys<T><<<unsigned((rows + block.y - 1) / block.y), block, 0, stream>>>(
        static_cast<T*>(p.o), p.lse, rows, p.seqlen_q, p.num_heads, p.head_dim, p.o_batch_stride, p.o_row_stride,
        p.o_head_stride);
    FA_CUDA_CHECK_LAUNCH("standard attention: empty_keys launch");
    return {};
  }

  cublasHandle_t handle = nullptr;
  FA_RETURN_IF_ERROR(cublas_handle(&handle));
  FA_RETURN_IF_ERROR(cublas_status(cublasSetStream(handle, stream), "cublasSetStream"));

  char* ws = static_cast<char*>(p.workspace);
  float* s = reinterpret_cast<float*>(ws);
  T* pm = reinterpret_cast<T*>(ws + align_up(s_count(p) * sizeof(float)));
  const size_t es = sizeof(T);
  const int64_t sq = p.seqlen_q, sk = p.seqlen_k, nh = p.num_heads, group = p.num_heads / p.num_heads_kv;
  const long long mat = sq * sk;  // elements of one (batch, head) S or P
  const cudaDataType_t dt = cuda_type(p.dtype);
  auto q_at = [&](int64_t b, int64_t h) { return static_cast<const char*>(p.q) + (b * p.q_batch_stride + h * p.q_head_stride) * es; };
  auto k_at = [&](int64_t b, int64_t h) { return static_cast<const char*>(p.k) + (b * p.k_batch_stride + h * p.k_head_stride) * es; };
  auto v_at = [&](int64_t b, int64_t h) { return static_cast<const char*>(p.v) + (b * p.v_batch_stride + h * p.v_head_stride) * es; };
  auto o_at = [&](int64_t b, int64_t h) { return static_cast<char*>(p.o) + (b * p.o_batch_stride + h * p.o_head_stride) * es; };

  // A batch of GEMMs over `count` heads: heads h0, h0 + q_step, ... (q side) against kv heads
  // hk0, hk0 + kv_step, ... (kv_step 0: one shared kv head).
  const int ld_q = leading_dim(p.q_row_stride, sq, p.head_dim), ld_k = leading_dim(p.k_row_stride, sk, p.head_dim);
  const int ld_v = leading_dim(p.v_row_stride, sk, p.head_dim), ld_o = leading_dim(p.o_row_stride, sq, p.head_dim);
  auto qk_batch = [&](int64_t b, int64_t h0, int64_t q_step, int64_t hk0, int64_t kv_step, int count) {
    Gemm qk{CUBLAS_OP_T,
            int(sk), int(sq), p.head_dim,
            k_at(b, hk0), ld_k, (long long)(kv_step * p.k_head_stride), dt,
            q_at(b, h0), ld_q, (long long)(q_step * p.q_head_stride), dt,
            s + (b * nh + h0) * mat, int(sk), q_step * mat, CUDA_R_32F,
            count, effective_scale(p)};
    return run_gemm(handle, qk);
  };
  auto pv_batch = [&](int64_t b, int64_t h0, int64_t q_step, int64_t hk0, int64_t kv_step, int count) {
    Gemm pv{CUBLAS_OP_N,
            p.head_dim, int(sq), int(sk),
            v_at(b, hk0), ld_v, (long long)(kv_step * p.v_head_stride), dt,
            pm + (b * nh + h0) * mat, int(sk), q_step * mat, dt,
            o_at(b, h0), ld_o, (long long)(q_step * p.o_head_stride), dt,
            count, 1.f};
    return run_gemm(handle, pv);
  };
  // Calls over (batch, ...) covering every head once, in the fewer-calls order.
  auto for_all_heads = [&](auto&& gemm) -> Status {
    const int64_t hkv = p.num_heads_kv;
    for (int64_t b = 0; b < p.batch; ++b) {
      if (group <= hkv) {  // one call per group member g: heads g, g + group, ... with kv heads 0, 1, ...
        for (int64_t g = 0; g < group; ++g) FA_RETURN_IF_ERROR(gemm(b, g, group, 0, 1, int(hkv)));
      } else {  // one call per kv head: its whole group shares K/V (stride 0)
        for (int64_t hk = 0; hk < hkv; ++hk) FA_RETURN_IF_ERROR(gemm(b, hk * group, 1, hk, 0, int(group)));
      }
    }
    return {};
  };

  FA_RETURN_IF_ERROR(for_all_heads(qk_batch));
  const Mask mask(p.seqlen_q, p.seqlen_k, p.causal != 0, p.window_left, p.window_right);
  softmax_rows<T><<<unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      s, pm, p.lse, rows, p.seqlen_q, p.seqlen_k, mask, p.softcap);
  FA_CUDA_CHECK_LAUNCH("standard attention: softmax_rows launch");
  FA_RETURN_IF_ERROR(for_all_heads(pv_batch));
  return {};
}

}  // namespace

size_t standard_forward_workspace(const fa_params& p) {
  if (is_varlen(p) || p.seqlen_k == 0 || p.seqlen_q == 0 || p.batch == 0) return 0;
  return align_up(s_count(p) * sizeof(float)) + align_up(s_count(p) * p_elem_bytes(p));
}

Status standard_forward(const fa_params& p) {
  if (is_varlen(p)) return unsupported("standard attention (cuda-standard): varlen (cu_seqlens) is not supported");
  // cuBLAS reads each head's rows as a matrix with leading dimension row_stride >= head_dim.
  const struct { const char* name; int64_t rs, rows; } views[] = {
      {"q_row_stride", p.q_row_stride, p.seqlen_q}, {"k_row_stride", p.k_row_stride, p.seqlen_k},
      {"v_row_stride", p.v_row_stride, p.seqlen_k}, {"o_row_stride", p.o_row_stride, p.seqlen_q}};
  for (const auto& v : views) {
    if (v.rs < p.head_dim && v.rows > 1)
      return unsupported("standard attention (cuda-standard): %s = %lld is smaller than head_dim %d (rows overlap)",
                         v.name, (long long)v.rs, p.head_dim);
    if (v.rs > INT32_MAX)
      return unsupported("standard attention (cuda-standard): %s = %lld does not fit cuBLAS's int leading dimension",
                         v.name, (long long)v.rs);
  }
  FA_RETURN_IF_ERROR(require_workspace(p, standard_forward_workspace(p), "cuda-standard"));
  switch (p.dtype) {
    case FA_FLOAT32: return forward_typed<float>(p);
    case FA_FLOAT16: return forward_typed<__half>(p);
    case FA_BFLOAT16: return forward_typed<__nv_bfloat16>(p);
  }
  return invalid("dtype: unknown value %d", int(p.dtype));
}

}  // namespace flashattn::cuda
