// Standalone check and timing of the sm80 backward, independent of the forward kernel and of the
// library's API layer: o and lse come from the fp64 CPU reference (src/cpu/reference.cpp), uploaded;
// gradients are compared with the reference backward run in fp32 storage on the same rounded inputs.
//
//   build (see run.sh): nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr -Iinclude -Isrc
//       -DFLASHATTN_HDIM_<N>=1 ... dev/sm80bwd/bwd_dev.cu src/cuda/sm80/bwd_launch.cu
//       src/cuda/sm80/bwd_hdim*.cu src/cpu/reference.cpp -Xcompiler -fopenmp
//   run:   bwd_dev check          correctness over many shapes (nonzero exit on failure)
//          bwd_dev bench          TFLOP/s on the standard sweep (bf16, 16k tokens, hidden 2048)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "cpu/cpu_backend.hpp"
#include "cuda/kernels.hpp"
#include "cuda/sm80/bwd_config.cuh"

extern "C" const char* fa_dtype_name(fa_dtype d) {
  return d == FA_FLOAT16 ? "fp16" : d == FA_BFLOAT16 ? "bf16" : "fp32";
}
extern "C" void fa_params_init(fa_params* p) {
  std::memset(p, 0, sizeof(*p));
  p->window_left = p->window_right = -1;
}

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

struct Case {
  const char* name;
  fa_dtype dtype = FA_BFLOAT16;
  int batch = 2, seqlen_q = 197, seqlen_k = 203, heads = 4, heads_kv = 2, head_dim = 64;
  bool causal = false;
  int left = -1, right = -1;
  float softcap = 0.f;
  std::vector<int> lens_q, lens_k;  // varlen when non-empty
  int pad = 0;                      // extra elements after each head vector and row (strided view)
  bool deterministic = false;
};

// A (rows, heads, head_dim) tensor (rows = batch * seqlen, or total for varlen) with padding.
struct Layout {
  int64_t batch_stride, row_stride, head_stride, elements;
};
Layout make_layout(int batch, int seqlen, int heads, int d, int pad, bool varlen) {
  Layout l;
  l.head_stride = d + pad;
  l.row_stride = heads * l.head_stride + pad;
  l.batch_stride = varlen ? 0 : seqlen * l.row_stride;
  l.elements = (varlen ? seqlen : int64_t(batch) * seqlen) * l.row_stride + 8;
  return l;
}

struct Buffers {
  std::vector<float> h;  // host values (rounded to the dtype)
  void* d = nullptr;     // device copy in the dtype
};

void upload(Buffers& b, fa_dtype dt) {
  std::vector<uint16_t> bits(b.h.size());
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = dt == FA_FLOAT16 ? flashattn::float_to_half(b.h[i]) : flashattn::float_to_bf16(b.h[i]);
  CK(cudaMalloc(&b.d, bits.size() * 2));
  CK(cudaMemcpy(b.d, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
}
std::vector<float> download(const void* d, size_t n, fa_dtype dt) {
  std::vector<uint16_t> bits(n);
  CK(cudaMemcpy(bits.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = dt == FA_FLOAT16 ? flashattn::half_to_float(bits[i]) : flashattn::bf16_to_float(bits[i]);
  return out;
}

void set_strides(fa_params& p, const Layout& lq, const Layout& lk) {
  p.q_batch_stride = p.o_batch_stride = p.do_batch_stride = p.dq_batch_stride = lq.batch_stride;
  p.q_row_stride = p.o_row_stride = p.do_row_stride = p.dq_row_stride = lq.row_stride;
  p.q_head_stride = p.o_head_stride = p.do_head_stride = p.dq_head_stride = lq.head_stride;
  p.k_batch_stride = p.v_batch_stride = p.dk_batch_stride = p.dv_batch_stride = lk.batch_stride;
  p.k_row_stride = p.v_row_stride = p.dk_row_stride = p.dv_row_stride = lk.row_stride;
  p.k_head_stride = p.v_head_stride = p.dk_head_stride = p.dv_head_stride = lk.head_stride;
}

// Max |a - ref| / max |ref| over the valid elements (rows x heads x head_dim of a layout); NaN counts
// as failure (an element left unwritten keeps the poison).
double rel_error(const std::vector<float>& a, const std::vector<float>& ref, int64_t rows, int heads, int d,
                 const Layout& l, bool* nan) {
  // Floor of the scale: a gradient that is ~0 in exact arithmetic (one visible key: dS = 0) would
  // turn rounding noise into a huge relative error.
  double err = 0, mag = 1e-2;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int c = 0; c < d; ++c) {
        int64_t i = r * l.row_stride + h * l.head_stride + c;
        if (!std::isfinite(a[i])) *nan = true;
        err = std::max(err, double(std::fabs(a[i] - ref[i])));
        mag = std::max(mag, double(std::fabs(ref[i])));
      }
  return err / mag;
}

bool run_case(const Case& c) {
  const bool varlen = !c.lens_q.empty();
  std::vector<int> cu_q(1, 0), cu_k(1, 0);
  int max_q = c.seqlen_q, max_k = c.seqlen_k, batch = c.batch;
  if (varlen) {
    batch = int(c.lens_q.size());
    max_q = max_k = 0;
    for (int b = 0; b < batch; ++b) {
      cu_q.push_back(cu_q.back() + c.lens_q[b]);
      cu_k.push_back(cu_k.back() + c.lens_k[b]);
      max_q = std::max(max_q, c.lens_q[b]);
      max_k = std::max(max_k, c.lens_k[b]);
    }
  }
  const int64_t rows_q = varlen ? cu_q.back() : int64_t(batch) * max_q;
  const int64_t rows_k = varlen ? cu_k.back() : int64_t(batch) * max_k;
  const int d = c.head_dim;
  Layout lq = make_layout(batch, varlen ? int(rows_q) : max_q, c.heads, d, c.pad, varlen);
  Layout lk = make_layout(batch, varlen ? int(rows_k) : max_k, c.heads_kv, d, c.pad, varlen);

  std::mt19937 rng(1234 + d);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](std::vector<float>& v, size_t n, float scale) {
    v.resize(n);
    for (auto& x : v) x = flashattn::round_to(scale * nd(rng), c.dtype);
  };
  Buffers q, k, v, dout;
  fill(q.h, lq.elements, 1.f);
  fill(k.h, lk.elements, 1.f);
  fill(v.h, lk.elements, 1.f);
  fill(dout.h, lq.elements, 1.f);

  // Reference in fp32 storage (fp64 inside): o, lse, then dq, dk, dv.
  fa_params r;
  fa_params_init(&r);
  r.batch = batch, r.seqlen_q = max_q, r.seqlen_k = max_k, r.num_heads = c.heads, r.num_heads_kv = c.heads_kv;
  r.head_dim = d, r.dtype = FA_FLOAT32, r.causal = c.causal, r.window_left = c.left, r.window_right = c.right;
  r.softcap = c.softcap;
  set_strides(r, lq, lk);
  if (varlen) {
    r.cu_seqlens_q = cu_q.data(), r.cu_seqlens_k = cu_k.data(), r.total_q = rows_q, r.total_k = rows_k;
  }
  std::vector<float> o_ref(lq.elements, 0.f), lse(size_t(c.heads) * std::max<int64_t>(rows_q, 1), 0.f);
  std::vector<float> dq_ref(lq.elements, 0.f), dk_ref(lk.elements, 0.f), dv_ref(lk.elements, 0.f);
  r.q = q.h.data(), r.k = k.h.data(), r.v = v.h.data(), r.o = o_ref.data(), r.lse = lse.data();
  flashattn::cpu::reference_forward(r);
  Buffers o;
  o.h = o_ref;
  for (auto& x : o.h) x = flashattn::round_to(x, c.dtype);  // what a forward in the dtype stores
  r.dout = dout.h.data(), r.dq = dq_ref.data(), r.dk = dk_ref.data(), r.dv = dv_ref.data();
  flashattn::cpu::reference_backward(r);

  // Device.
  fa_params p = r;
  p.dtype = c.dtype;
  p.deterministic = c.deterministic;
  upload(q, c.dtype), upload(k, c.dtype), upload(v, c.dtype), upload(dout, c.dtype), upload(o, c.dtype);
  void *dq, *dk, *dv;
  float* lse_d;
  int32_t *cu_q_d = nullptr, *cu_k_d = nullptr;
  CK(cudaMalloc(&dq, lq.elements * 2));
  CK(cudaMalloc(&dk, lk.elements * 2));
  CK(cudaMalloc(&dv, lk.elements * 2));
  CK(cudaMalloc(&lse_d, lse.size() * 4));
  CK(cudaMemcpy(lse_d, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  if (varlen) {
    CK(cudaMalloc(&cu_q_d, cu_q.size() * 4));
    CK(cudaMalloc(&cu_k_d, cu_k.size() * 4));
    CK(cudaMemcpy(cu_q_d, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cu_k_d, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));
    p.cu_seqlens_q = cu_q_d, p.cu_seqlens_k = cu_k_d;
  }
  p.q = q.d, p.k = k.d, p.v = v.d, p.o = o.d, p.dout = dout.d, p.lse = lse_d, p.dq = dq, p.dk = dk, p.dv = dv;
  size_t ws_bytes = flashattn::cuda::sm80_backward_workspace(p);
  void* ws = nullptr;
  if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
  // Poison the workspace too: the kernels must initialize what they read.
  if (ws_bytes) CK(cudaMemset(ws, 0xff, ws_bytes));
  p.workspace = ws, p.workspace_bytes = ws_bytes;

  std::vector<float> got[2][3];
  const int runs = c.deterministic ? 3 : 1;
  bool ok = true;
  for (int run = 0; run < runs; ++run) {
    CK(cudaMemset(dq, 0xff, lq.elements * 2));  // NaN in both dtypes
    CK(cudaMemset(dk, 0xff, lk.elements * 2));
    CK(cudaMemset(dv, 0xff, lk.elements * 2));
    flashattn::Status st = flashattn::cuda::sm80_backward(p);
    CK(cudaDeviceSynchronize());
    if (!st.ok()) {
      std::printf("FAIL %-34s status %d: %s\n", c.name, int(st.code), st.message.c_str());
      return false;
    }
    std::vector<float>* g = got[run == 0 ? 0 : 1];
    g[0] = download(dq, lq.elements, c.dtype);
    g[1] = download(dk, lk.elements, c.dtype);
    g[2] = download(dv, lk.elements, c.dtype);
    if (run > 0)
      for (int t = 0; t < 3; ++t)
        for (size_t i = 0; i < g[t].size(); ++i)
          if (std::memcmp(&g[t][i], &got[0][t][i], 4) != 0 && !(std::isnan(g[t][i]) && std::isnan(got[0][t][i]))) {
            ok = false;
            std::printf("FAIL %-34s deterministic: run %d differs from run 0 in %s at %zu\n", c.name, run,
                        t == 0 ? "dq" : t == 1 ? "dk" : "dv", i);
            break;
          }
  }
  bool nan = false;
  double eq = rel_error(got[0][0], dq_ref, rows_q, c.heads, d, lq, &nan);
  double ek = rel_error(got[0][1], dk_ref, rows_k, c.heads_kv, d, lk, &nan);
  double ev = rel_error(got[0][2], dv_ref, rows_k, c.heads_kv, d, lk, &nan);
  // Dev bar only (the tests apply the anchor rule): bf16 has 8 mantissa bits, fp16 11.
  const double tol = c.dtype == FA_BFLOAT16 ? 2.5e-2 : 4e-3;
  ok = ok && !nan && eq < tol && ek < tol && ev < tol;
  std::printf("%s %-34s %s d=%d dq %.2e dk %.2e dv %.2e%s\n", ok ? "ok  " : "FAIL", c.name, fa_dtype_name(c.dtype), d,
              eq, ek, ev, nan ? " NaN/unwritten" : "");
  for (void* ptr : {q.d, k.d, v.d, dout.d, o.d, dq, dk, dv, static_cast<void*>(lse_d), ws,
                    static_cast<void*>(cu_q_d), static_cast<void*>(cu_k_d)})
    if (ptr) cudaFree(ptr);
  return ok;
}

int check() {
  std::vector<Case> cases;
  for (fa_dtype dt : {FA_BFLOAT16, FA_FLOAT16}) {
    for (int d : {32, 64, 96, 128, 192, 256}) {
      Case c;
      c.dtype = dt, c.head_dim = d;
      c.name = "gqa 197x203";
      cases.push_back(c);
      c.name = "causal sq<sk det";
      c.causal = true, c.seqlen_q = 130, c.seqlen_k = 301, c.deterministic = true;
      cases.push_back(c);
    }
    Case c;
    c.dtype = dt;
    for (int d : {64, 128}) {
      c = Case{};
      c.dtype = dt, c.head_dim = d;
      c.name = "causal sq>sk (masked rows)", c.causal = true, c.seqlen_q = 300, c.seqlen_k = 77;
      cases.push_back(c);
      c.name = "window 40,7", c.causal = false, c.left = 40, c.right = 7, c.seqlen_q = 333, c.seqlen_k = 290;
      cases.push_back(c);
      c.name = "window 0,0 det", c.left = 0, c.right = 0, c.deterministic = true;
      cases.push_back(c);
      c = Case{};
      c.dtype = dt, c.head_dim = d;
      c.name = "softcap 5 causal", c.softcap = 5.f, c.causal = true;
      cases.push_back(c);
      c.name = "mqa 8:1", c.softcap = 0, c.heads = 8, c.heads_kv = 1, c.causal = false;
      cases.push_back(c);
      c.name = "mqa 8:1 det", c.deterministic = true;
      cases.push_back(c);
      c = Case{};
      c.dtype = dt, c.head_dim = d;
      c.name = "varlen with empty seqs", c.lens_q = {0, 17, 130, 64, 1}, c.lens_k = {5, 0, 257, 64, 300};
      cases.push_back(c);
      c.name = "varlen causal det", c.causal = true, c.deterministic = true;
      cases.push_back(c);
      c = Case{};
      c.dtype = dt, c.head_dim = d;
      c.name = "strided pad 8", c.pad = 8;
      cases.push_back(c);
      c.name = "strided pad 3 (unaligned)", c.pad = 3;
      cases.push_back(c);
      c = Case{};
      c.dtype = dt, c.head_dim = d;
      c.name = "seqlen 1x1", c.seqlen_q = 1, c.seqlen_k = 1;
      cases.push_back(c);
      c.name = "seqlen_k 0 (dq = 0)", c.seqlen_q = 33, c.seqlen_k = 0;
      cases.push_back(c);
      c.name = "long 1024x1536 causal", c.batch = 1, c.seqlen_q = 1024, c.seqlen_k = 1536, c.causal = true;
      cases.push_back(c);
    }
    for (int d : {40, 80, 120, 200, 33}) {  // padded head dims
      c = Case{};
      c.dtype = dt, c.head_dim = d, c.name = "padded head_dim", c.causal = d == 80;
      cases.push_back(c);
    }
  }
  // BWD_CHECK_HDIM=N: only the cases that run the kernel of head_dim N (a variant build has only it).
  const char* only = std::getenv("BWD_CHECK_HDIM");
  int failed = 0, run = 0;
  for (const Case& c : cases) {
    if (only && flashattn::sm80::bwd_kernel_head_dim(c.head_dim) != std::atoi(only)) continue;
    failed += !run_case(c);
    ++run;
  }
  std::printf("check: %d of %d cases failed\n", failed, run);
  return failed ? 1 : 0;
}

// Uniform(-1.7, 1.7) (unit variance) from a hash of the index: fast, reproducible, never zero-filled.
__global__ void fill_uniform(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x85ebca6bu ^ seed;
    h ^= h >> 13, h *= 0xc2b2ae35u, h ^= h >> 16;
    x[i] = __float2bfloat16((h >> 8) * (3.4641f / 16777216.f) - 1.7320f);
  }
}

// Standard sweep: bf16, batch * seqlen = 16384, heads = 2048 / head_dim. Inputs random, o random,
// lse a constant (timing only).
int bench(bool deterministic) {
  std::printf("%-6s %-5s %-6s %-6s %-6s %-6s %-9s %-10s\n", "hdim", "heads", "batch", "seqlen", "causal", "det", "ms",
              "TFLOP/s");
  const char* only = std::getenv("BWD_BENCH_HDIM");  // e.g. 128: that head_dim at 512, 2k, 4k, 16k only
  for (int d : {64, 128})
    for (int causal : {0, 1})
      for (int s : {512, 1024, 2048, 4096, 8192, 16384}) {
        if (deterministic && s != 16384 && s != 2048) continue;
        if (only && (d != std::atoi(only) || (s != 512 && s != 2048 && s != 4096 && s != 16384))) continue;
        const int h = 2048 / d, b = 16384 / s;
        fa_params p;
        fa_params_init(&p);
        p.batch = b, p.seqlen_q = p.seqlen_k = s, p.num_heads = p.num_heads_kv = h, p.head_dim = d;
        p.dtype = FA_BFLOAT16, p.causal = causal, p.deterministic = deterministic;
        Layout l = make_layout(b, s, h, d, 0, false);
        set_strides(p, l, l);
        const size_t n = size_t(l.elements);
        void* bufs[8];
        for (int i = 0; i < 8; ++i) {
          CK(cudaMalloc(&bufs[i], n * 2));
          fill_uniform<<<1024, 256>>>(static_cast<__nv_bfloat16*>(bufs[i]), n, 0x9e3779b9u * (i + 1));
        }
        CK(cudaDeviceSynchronize());
        std::vector<float> lse(size_t(b) * h * s, float(std::log(double(s))) + 2.f);
        float* lse_d;
        CK(cudaMalloc(&lse_d, lse.size() * 4));
        CK(cudaMemcpy(lse_d, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
        p.q = bufs[0], p.k = bufs[1], p.v = bufs[2], p.o = bufs[3], p.dout = bufs[4];
        p.dq = bufs[5], p.dk = bufs[6], p.dv = bufs[7], p.lse = lse_d;
        size_t ws_bytes = flashattn::cuda::sm80_backward_workspace(p);
        void* ws;
        CK(cudaMalloc(&ws, ws_bytes));
        p.workspace = ws, p.workspace_bytes = ws_bytes;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        std::vector<float> ms;
        for (int rep = 0; rep < 13; ++rep) {
          cudaEventRecord(e0);
          flashattn::Status st = flashattn::cuda::sm80_backward(p);
          cudaEventRecord(e1);
          CK(cudaEventSynchronize(e1));
          if (!st.ok()) {
            std::printf("error: %s\n", st.message.c_str());
            return 1;
          }
          float t;
          cudaEventElapsedTime(&t, e0, e1);
          if (rep >= 3) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        const double flops = 2.5 * 4.0 * b * h * double(s) * s * d * (causal ? 0.5 : 1.0);
        std::printf("%-6d %-5d %-6d %-6d %-6d %-6d %-9.3f %-10.1f\n", d, h, b, s, causal, deterministic, med,
                    flops / (med * 1e-3) / 1e12);
        for (void* ptr : bufs) cudaFree(ptr);
        cudaFree(lse_d), cudaFree(ws);
      }
  return 0;
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "check";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  if (mode == "check") return check();
  if (mode == "bench") return bench(false);
  if (mode == "bench-det") return bench(true);
  std::printf("usage: bwd_dev check|bench|bench-det\n");
  return 2;
}
