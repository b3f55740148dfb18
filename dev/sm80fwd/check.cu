// Standalone check and timing of the sm80 forward, linked without the library (dev/sm80fwd/run.sh
// builds it): the entry points of src/cuda/sm80/fwd_api.cu, the generated instantiations, and the
// fp64 CPU reference (src/cpu/reference.cpp).
//   check: random inputs rounded to the dtype, NaN-poisoned outputs and padding, every element
//          compared with the reference (run in fp32 on the same rounded inputs), lse too.
//   time:  CUDA-event medians at the standard sweep (16k tokens, hidden 2048), the table's config
//          and the candidate configs of dev/sm80fwd/candidate.cu side by side.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../src/cuda/sm80/fwd_api.cu"
#include "common/dtype.hpp"
#include "cpu/cpu_backend.hpp"
#include "dev/sm80fwd/candidates.hpp"

extern "C" const char* fa_dtype_name(fa_dtype d) { return d == FA_FLOAT16 ? "fp16" : d == FA_BFLOAT16 ? "bf16" : "fp32"; }

using namespace flashattn;
using namespace flashattn::cuda;
using flashattn::sm80::FwdParams;

#define CHECK_CUDA(x)                                                                 \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

struct Case {
  int batch = 1, sq = 1, sk = 1, h = 1, hk = 1, d = 64;
  fa_dtype dtype = FA_BFLOAT16;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0.f;
  std::vector<int> lens_q, lens_k;  // varlen when set
  int pad = 0;                      // extra elements after each head vector and each row
  int splits = 0;
  bool lse = true;
  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s b%d sq%d sk%d h%d/%d d%d%s w(%d,%d) cap%g%s pad%d splits%d%s", fa_dtype_name(dtype),
                  batch, sq, sk, h, hk, d, causal ? " causal" : "", wl, wr, softcap, lens_q.empty() ? "" : " varlen", pad,
                  splits, lse ? "" : " nolse");
    return buf;
  }
};

// A (batch, rows, heads, dim) tensor with padding after each head vector and each row.
struct Layout {
  int64_t nb, rows, heads, dim, head_stride, row_stride, batch_stride, elements;
  Layout(int64_t nb_, int64_t rows_, int64_t heads_, int64_t dim_, int pad)
      : nb(nb_), rows(rows_), heads(heads_), dim(dim_) {
    head_stride = dim + pad;
    row_stride = heads * head_stride + pad;
    batch_stride = rows * row_stride + pad;
    elements = nb * batch_stride + pad + 8;
  }
  int64_t at(int64_t b, int64_t r, int64_t h) const { return b * batch_stride + r * row_stride + h * head_stride; }
};

uint16_t to16(float x, fa_dtype d) { return d == FA_FLOAT16 ? float_to_half(x) : float_to_bf16(x); }
float from16(uint16_t x, fa_dtype d) { return d == FA_FLOAT16 ? half_to_float(x) : bf16_to_float(x); }

template <class V>
V* to_device(const std::vector<V>& h) {
  V* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(h.size(), 1) * sizeof(V)));
  CHECK_CUDA(cudaMemcpy(ptr, h.data(), h.size() * sizeof(V), cudaMemcpyHostToDevice));
  return ptr;
}

struct Problem {
  fa_params p;  // device pointers
  fa_params ref;  // host fp32 copies for the reference
  Layout lq, lk, lo;
  std::vector<uint16_t> q, k, v;
  std::vector<float> q32, k32, v32, o32, lse32;
  std::vector<int> cu_q, cu_k;
  int64_t lse_count = 0;
  void* workspace = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* dout = nullptr;
  float* dlse = nullptr;
  int *dcu_q = nullptr, *dcu_k = nullptr;

  Problem(const Case& c, uint64_t seed)
      : lq(1, 1, 1, 1, 0), lk(1, 1, 1, 1, 0), lo(1, 1, 1, 1, 0) {
    const bool varlen = !c.lens_q.empty();
    int64_t nb = c.batch, rows_q = c.sq, rows_k = c.sk;
    int max_q = c.sq, max_k = c.sk;
    if (varlen) {
      cu_q = {0};
      cu_k = {0};
      max_q = max_k = 0;
      for (size_t b = 0; b < c.lens_q.size(); ++b) {
        cu_q.push_back(cu_q.back() + c.lens_q[b]);
        cu_k.push_back(cu_k.back() + c.lens_k[b]);
        max_q = std::max(max_q, c.lens_q[b]);
        max_k = std::max(max_k, c.lens_k[b]);
      }
      nb = 1;
      rows_q = cu_q.back();
      rows_k = cu_k.back();
    }
    lq = Layout(nb, rows_q, c.h, c.d, c.pad);
    lk = Layout(nb, rows_k, c.hk, c.d, c.pad);
    lo = lq;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto fill = [&](const Layout& l, std::vector<uint16_t>& t16, std::vector<float>& t32) {
      t16.assign(size_t(l.elements), 0xFFFF);  // padding is NaN: reading it would show
      t32.assign(size_t(l.elements), std::nanf(""));
      for (int64_t b = 0; b < l.nb; ++b)
        for (int64_t r = 0; r < l.rows; ++r)
          for (int64_t h = 0; h < l.heads; ++h)
            for (int64_t e = 0; e < l.dim; ++e) {
              const int64_t i = l.at(b, r, h) + e;
              t16[size_t(i)] = to16(normal(rng), c.dtype);
              t32[size_t(i)] = from16(t16[size_t(i)], c.dtype);
            }
    };
    fill(lq, q, q32);
    fill(lk, k, k32);
    fill(lk, v, v32);
    o32.assign(size_t(lo.elements), 0.f);
    lse_count = int64_t(c.h) * (varlen ? rows_q : nb * rows_q);
    lse32.assign(size_t(std::max<int64_t>(lse_count, 1)), 0.f);

    fa_params_init_local(p);
    p.batch = varlen ? int(c.lens_q.size()) : c.batch;
    p.seqlen_q = max_q;
    p.seqlen_k = max_k;
    p.num_heads = c.h;
    p.num_heads_kv = c.hk;
    p.head_dim = c.d;
    p.dtype = c.dtype;
    p.causal = c.causal;
    p.window_left = c.wl;
    p.window_right = c.wr;
    p.softcap = c.softcap;
    p.num_splits = c.splits;
    p.q_batch_stride = lq.batch_stride, p.q_row_stride = lq.row_stride, p.q_head_stride = lq.head_stride;
    p.k_batch_stride = lk.batch_stride, p.k_row_stride = lk.row_stride, p.k_head_stride = lk.head_stride;
    p.v_batch_stride = lk.batch_stride, p.v_row_stride = lk.row_stride, p.v_head_stride = lk.head_stride;
    p.o_batch_stride = lo.batch_stride, p.o_row_stride = lo.row_stride, p.o_head_stride = lo.head_stride;
    if (varlen) {
      p.total_q = rows_q;
      p.total_k = rows_k;
    }
    ref = p;
    ref.dtype = FA_FLOAT32;
    ref.q = q32.data(), ref.k = k32.data(), ref.v = v32.data(), ref.o = o32.data();
    ref.lse = lse32.data();
    if (varlen) ref.cu_seqlens_q = cu_q.data(), ref.cu_seqlens_k = cu_k.data();

    dq = to_device(q), dk = to_device(k), dv = to_device(v);
    std::vector<uint16_t> poison(size_t(lo.elements), 0xFFFF);
    dout = to_device(poison);
    std::vector<float> lse_poison(lse32.size(), std::nanf(""));
    dlse = to_device(lse_poison);
    p.q = dq, p.k = dk, p.v = dv, p.o = dout;
    p.lse = c.lse ? dlse : nullptr;
    if (varlen) {
      dcu_q = to_device(cu_q), dcu_k = to_device(cu_k);
      p.cu_seqlens_q = dcu_q, p.cu_seqlens_k = dcu_k;
    }
    size_t ws = cuda::sm80_forward_workspace(p);
    if (ws) CHECK_CUDA(cudaMalloc(&workspace, ws));
    p.workspace = workspace;
    p.workspace_bytes = ws;
  }
  static void fa_params_init_local(fa_params& p) {
    std::memset(&p, 0, sizeof p);
    p.window_left = p.window_right = -1;
  }
  ~Problem() {
    for (void* ptr : {dq, dk, dv, dout, (void*)dlse, (void*)dcu_q, (void*)dcu_k, workspace})
      if (ptr) cudaFree(ptr);
  }
};

// Runs the case on the GPU and compares; prints one line, returns pass.
bool check(const Case& c, uint64_t seed) {
  Problem pr(c, seed);
  Status st = cuda::sm80_forward(pr.p);
  if (!st.ok()) {
    std::printf("FAIL %s: status %d %s\n", c.name().c_str(), int(st.code), st.message.c_str());
    return false;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  cpu::reference_forward(pr.ref);
  std::vector<uint16_t> o(size_t(pr.lo.elements));
  std::vector<float> lse(pr.lse32.size());
  CHECK_CUDA(cudaMemcpy(o.data(), pr.dout, o.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), pr.dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
  // Tolerance: a few roundings of the output dtype at the output's magnitude.
  const float eps = c.dtype == FA_FLOAT16 ? 1.f / 1024 : 1.f / 128;
  double max_err = 0, max_ratio = 0;
  int64_t bad = 0, unwritten = 0, touched = 0;
  std::vector<char> in_view(o.size(), 0);
  const Layout& l = pr.lo;
  for (int64_t b = 0; b < l.nb; ++b)
    for (int64_t r = 0; r < l.rows; ++r)
      for (int64_t h = 0; h < l.heads; ++h)
        for (int64_t e = 0; e < l.dim; ++e) {
          const int64_t i = l.at(b, r, h) + e;
          in_view[size_t(i)] = 1;
          const float got = from16(o[size_t(i)], c.dtype), want = pr.o32[size_t(i)];
          if (!std::isfinite(got)) {
            ++unwritten;
            continue;
          }
          const double err = std::fabs(double(got) - want), tol = 2 * eps * std::max(1.f, std::fabs(want));
          max_err = std::max(max_err, err);
          max_ratio = std::max(max_ratio, err / tol);
          if (err > tol || (want == 0.f && got != 0.f && std::fabs(got) > 1e-6f)) ++bad;
        }
  for (size_t i = 0; i < o.size(); ++i)
    if (!in_view[i] && o[i] != 0xFFFF) ++touched;
  int64_t lse_bad = 0;
  double lse_err = 0;
  if (c.lse)
    for (int64_t i = 0; i < pr.lse_count; ++i) {
      const float got = lse[size_t(i)], want = pr.lse32[size_t(i)];
      if (std::isinf(want) || std::isinf(got)) {
        if (got != want) ++lse_bad;
        continue;
      }
      const double err = std::fabs(double(got) - want);
      lse_err = std::max(lse_err, err);
      if (!(err <= 2e-3 * std::max(1.f, std::fabs(want)))) ++lse_bad;
    }
  const bool ok = bad == 0 && unwritten == 0 && touched == 0 && lse_bad == 0;
  std::printf("%s %s: max_err %.3g (%.2f of tol), lse_err %.3g, bad %lld, unwritten %lld, outside-view writes %lld, lse_bad %lld\n",
              ok ? "ok  " : "FAIL", c.name().c_str(), max_err, max_ratio, lse_err, (long long)bad, (long long)unwritten,
              (long long)touched, (long long)lse_bad);
  return ok;
}

std::vector<Case> correctness_cases() {
  std::vector<Case> cases;
  for (fa_dtype dt : {FA_BFLOAT16, FA_FLOAT16}) {
    for (int d : {32, 64, 96, 128, 192, 256, 8, 40, 72, 80, 136, 160, 200, 248}) {
      for (auto [sq, sk] : std::vector<std::pair<int, int>>{{1, 1}, {17, 33}, {128, 128}, {200, 513}, {513, 200}}) {
        Case c;
        c.dtype = dt, c.d = d, c.sq = sq, c.sk = sk, c.h = 2, c.hk = 1, c.batch = 2;
        cases.push_back(c);
        c.causal = true;
        cases.push_back(c);
      }
    }
    for (int d : {64, 128, 256}) {
      Case c;
      c.dtype = dt, c.d = d, c.batch = 2, c.h = 4, c.hk = 2;
      c.sq = 300, c.sk = 700;
      c.wl = 100, c.wr = 20;  // sliding window
      cases.push_back(c);
      c.wl = -1, c.wr = 0, c.causal = false;  // causal by window
      cases.push_back(c);
      c.wl = 64, c.wr = -1;
      cases.push_back(c);
      c.sq = 700, c.sk = 300, c.causal = true, c.wl = 50, c.wr = -1;  // s_q > s_k: early rows fully masked
      cases.push_back(c);
      c.causal = false, c.wl = -1, c.softcap = 30.f;  // softcap
      cases.push_back(c);
      c.softcap = 0.f, c.pad = 3;  // unaligned strides: the element-wise load path
      cases.push_back(c);
      c.pad = 8;  // aligned padding
      cases.push_back(c);
      c.pad = 0, c.splits = 3;  // forced split-KV
      cases.push_back(c);
      c.causal = true;
      cases.push_back(c);
      c.splits = 0, c.lse = false;
      cases.push_back(c);
      Case v;  // varlen with empty sequences
      v.dtype = dt, v.d = d, v.h = 4, v.hk = 1;
      v.lens_q = {0, 37, 129, 300, 5};
      v.lens_k = {50, 0, 200, 300, 700};
      cases.push_back(v);
      v.causal = true;
      cases.push_back(v);
      v.splits = 4;
      cases.push_back(v);
      v.causal = false, v.wl = 30, v.wr = 30, v.pad = 5, v.splits = 0;
      cases.push_back(v);
      Case z;  // seqlen_k = 0
      z.dtype = dt, z.d = d, z.sq = 70, z.sk = 0;
      cases.push_back(z);
      Case s;  // split-KV by the heuristic: few q-blocks, long keys (decode-like, GQA)
      s.dtype = dt, s.d = d, s.sq = 1, s.sk = 5000, s.h = 8, s.hk = 2, s.batch = 1;
      cases.push_back(s);
      s.causal = true;  // one query row: causal masks nothing (the GQA decode view drops it)
      cases.push_back(s);
      s.causal = false, s.wl = 700;  // window_left masks the one row: no GQA decode view
      cases.push_back(s);
      s.wl = -1, s.wr = 0, s.pad = 3, s.lse = false;  // decode view over unaligned strides
      cases.push_back(s);
      s.wr = -1, s.pad = 0, s.lse = true, s.splits = 1, s.batch = 3;  // decode view without splits
      cases.push_back(s);
      s.splits = 0, s.batch = 1, s.sq = 64, s.causal = true;
      cases.push_back(s);
    }
  }
  return cases;
}

// ---- timing ----
float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
float time_ms(Fn fn, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

void time_sweep(const char* device_name) {
  std::printf("\n# timing (bf16, 16k tokens, hidden 2048; median of CUDA events) on %s\n", device_name);
  std::printf("%-28s %4s %6s %6s %9s %8s\n", "config", "d", "seqlen", "causal", "ms", "TFLOP/s");
  std::vector<int> dims = {64, 128};  // SWEEP_DIMS=64,128,256: others
  if (const char* e = std::getenv("SWEEP_DIMS")) {
    dims.clear();
    for (const char* c = e; *c;) {
      dims.push_back(std::atoi(c));
      while (*c && *c != ',') ++c;
      if (*c) ++c;
    }
  }
  for (int d : dims) {
    for (int causal : {0, 1}) {
      for (int s : {512, 1024, 2048, 4096, 8192, 16384}) {
        Case c;
        c.dtype = FA_BFLOAT16, c.d = d, c.sq = c.sk = s, c.batch = 16384 / s, c.h = c.hk = 2048 / d;
        c.causal = causal;
        c.lse = true;
        Problem pr(c, 1234);
        const double flops = 4.0 * c.batch * c.h * double(s) * s * d / (causal ? 2 : 1);
        const int reps = s >= 8192 ? 10 : 30;
        auto report = [&](const char* name, float ms) {
          std::printf("%-28s %4d %6d %6d %9.4f %8.1f\n", name, d, s, causal, ms, flops / (ms * 1e-3) / 1e12);
        };
        report("table", time_ms([&] { cuda::sm80_forward(pr.p); }, reps));
        const FwdParams f = make_params(pr.p, 1);
        for (const Candidate& cand : candidates())
          if (cand.head_dim == d) report(cand.name, time_ms([&] { cand.launch(f, nullptr); }, reps));
        CHECK_CUDA(cudaGetLastError());
      }
    }
  }
  // Split-KV decode: 1 query token, 32 heads, 8 kv heads, d 128; bandwidth of reading k and v.
  std::printf("\n# split-KV decode (bf16, h 32, h_kv 8, d 128): K+V bytes / time\n");
  for (auto [b, sk] : std::vector<std::pair<int, int>>{{1, 32768}, {1, 131072}, {8, 16384}, {32, 8192}}) {
    Case c;
    c.dtype = FA_BFLOAT16, c.d = 128, c.sq = 1, c.sk = sk, c.batch = b, c.h = 32, c.hk = 8;
    Problem pr(c, 99);
    const float ms = time_ms([&] { cuda::sm80_forward(pr.p); }, 30);
    const double bytes = 2.0 * b * sk * 8 * 128 * 2;
    std::printf("decode b %d sk %6d: %.4f ms, %.2f TB/s (splits %d)\n", b, sk, ms, bytes / (ms * 1e-3) / 1e12,
                num_splits(gqa_decode_view(pr.p), sm80::fwd_config(128)));
  }
}

// Each candidate config checked once against the reference through its own launcher.
bool check_candidates() {
  bool all = true;
  for (const Candidate& cand : candidates()) {
    for (int causal : {0, 1}) {
      Case c;
      c.dtype = FA_BFLOAT16, c.d = cand.head_dim, c.sq = 333, c.sk = 517, c.h = 2, c.hk = 1, c.batch = 2, c.causal = causal;
      Problem pr(c, 7 + causal);
      cand.launch(make_params(pr.p, 1), nullptr);
      CHECK_CUDA(cudaDeviceSynchronize());
      cpu::reference_forward(pr.ref);
      std::vector<uint16_t> o(size_t(pr.lo.elements));
      CHECK_CUDA(cudaMemcpy(o.data(), pr.dout, o.size() * 2, cudaMemcpyDeviceToHost));
      double max_err = 0;
      bool finite = true;
      for (int64_t b = 0; b < pr.lo.nb; ++b)
        for (int64_t r = 0; r < pr.lo.rows; ++r)
          for (int64_t h = 0; h < pr.lo.heads; ++h)
            for (int64_t e = 0; e < pr.lo.dim; ++e) {
              const int64_t i = pr.lo.at(b, r, h) + e;
              const float got = from16(o[size_t(i)], c.dtype);
              finite &= std::isfinite(got);
              max_err = std::max(max_err, double(std::fabs(got - pr.o32[size_t(i)])));
            }
      const bool ok = finite && max_err < 2.f / 128;
      all &= ok;
      std::printf("%s candidate %s causal %d: max_err %.3g\n", ok ? "ok  " : "FAIL", cand.name, causal, max_err);
    }
  }
  return all;
}

int main(int argc, char** argv) {
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const bool only_time = argc > 1 && std::string(argv[1]) == "time";
  int failed = 0, total = 0;
  if (!only_time) {
    std::mt19937_64 seeds(std::random_device{}());
    for (const Case& c : correctness_cases()) {
      ++total;
      const uint64_t seed = seeds();
      if (!check(c, seed)) {
        ++failed;
        std::printf("     seed %llu\n", (unsigned long long)seed);
      }
    }
    std::printf("\n# correctness: %d of %d cases passed\n", total - failed, total);
    if (!check_candidates()) ++failed;
  }
  if (!(argc > 1 && std::string(argv[1]) == "check")) time_sweep(prop.name);
  return failed ? 1 : 0;
}
