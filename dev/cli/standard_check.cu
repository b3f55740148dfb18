// Standalone check and timing of the CUDA standard attention (src/cuda/standard.cu), for when the
// whole library does not build yet. Build (from the repo root):
//   nvcc -O2 -std=c++20 -arch=sm_90 -I include -I src -Xcompiler -fopenmp --expt-relaxed-constexpr \
//        dev/cli/standard_check.cu src/cuda/standard.cu src/cpu/reference.cpp -lcublas -o standard_check
// It runs standard_forward directly (no API layer) on random inputs, compares o and lse with the
// fp64 reference (cpu::reference_forward on fp32 copies), then times the seeds' classic problem.
// `standard_check --small` skips the classic problem (for compute-sanitizer).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cuda/kernels.hpp"

using namespace flashattn;

namespace {

struct Config {
  const char* name;
  int batch, sq, sk, h, hkv, d;
  fa_dtype dt;
  bool causal;
  int wl, wr;
  float softcap;
  bool bhsd;
};

float round_dt(float x, fa_dtype dt) {
  if (dt == FA_FLOAT16) return __half2float(__float2half_rn(x));
  if (dt == FA_BFLOAT16) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}

std::vector<unsigned char> encode(const std::vector<float>& x, fa_dtype dt) {
  const size_t es = dt == FA_FLOAT32 ? 4 : 2;
  std::vector<unsigned char> out(x.size() * es);
  for (size_t i = 0; i < x.size(); ++i) {
    if (dt == FA_FLOAT32) {
      std::memcpy(&out[i * 4], &x[i], 4);
    } else if (dt == FA_FLOAT16) {
      __half h = __float2half_rn(x[i]);
      std::memcpy(&out[i * 2], &h, 2);
    } else {
      __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

float decode_one(const unsigned char* p, fa_dtype dt) {
  if (dt == FA_FLOAT32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (dt == FA_FLOAT16) {
    __half h;
    std::memcpy(&h, p, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  std::memcpy(&h, p, 2);
  return __bfloat162float(h);
}

void set_strides(fa_params& p, bool bhsd) {
  auto set = [&](int64_t& bs, int64_t& rs, int64_t& hs, int64_t rows, int64_t heads) {
    const int64_t d = p.head_dim;
    if (bhsd) {
      bs = heads * rows * d, hs = rows * d, rs = d;
    } else {
      bs = rows * heads * d, rs = heads * d, hs = d;
    }
  };
  set(p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.seqlen_q, p.num_heads);
  set(p.o_batch_stride, p.o_row_stride, p.o_head_stride, p.seqlen_q, p.num_heads);
  set(p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.seqlen_k, p.num_heads_kv);
  set(p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.seqlen_k, p.num_heads_kv);
}

bool check(const Config& c, bool time_it) {
  fa_params p{};
  p.batch = c.batch, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.num_heads = c.h, p.num_heads_kv = c.hkv, p.head_dim = c.d;
  p.dtype = c.dt, p.causal = c.causal, p.window_left = c.wl, p.window_right = c.wr, p.softcap = c.softcap;
  set_strides(p, c.bhsd);
  const size_t nq = size_t(c.batch) * c.sq * c.h * c.d, nk = size_t(c.batch) * c.sk * c.hkv * c.d;
  const size_t nlse = size_t(c.batch) * c.h * c.sq, es = c.dt == FA_FLOAT32 ? 4 : 2;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd;
  std::vector<float> q(nq), k(nk), v(nk);
  for (auto* t : {&q, &k, &v})
    for (auto& x : *t) x = round_dt(nd(rng), c.dt);

  // The oracle on fp32 copies.
  std::vector<float> o_ref(nq), lse_ref(nlse);
  fa_params r = p;
  r.dtype = FA_FLOAT32, r.q = q.data(), r.k = k.data(), r.v = v.data(), r.o = o_ref.data(), r.lse = lse_ref.data();
  cpu::reference_forward(r);

  void *dq, *dk, *dv, *dout, *dlse, *ws;
  auto hq = encode(q, c.dt), hk = encode(k, c.dt), hv = encode(v, c.dt);
  cudaMalloc(&dq, hq.size()), cudaMalloc(&dk, hk.size() + 1), cudaMalloc(&dv, hv.size() + 1);
  cudaMalloc(&dout, nq * es), cudaMalloc(&dlse, nlse * 4);
  cudaMemcpy(dq, hq.data(), hq.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dk, hk.data(), hk.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dv, hv.data(), hv.size(), cudaMemcpyHostToDevice);
  cudaMemset(dout, 0xff, nq * es), cudaMemset(dlse, 0xff, nlse * 4);
  const size_t ws_bytes = cuda::standard_forward_workspace(p);
  cudaMalloc(&ws, ws_bytes + 1);
  cudaMemset(ws, 0xff, ws_bytes + 1);
  p.q = dq, p.k = dk, p.v = dv, p.o = dout, p.lse = static_cast<float*>(dlse), p.workspace = ws, p.workspace_bytes = ws_bytes;
  Status s = cuda::standard_forward(p);
  cudaError_t e = cudaDeviceSynchronize();
  if (!s.ok() || e != cudaSuccess) {
    std::printf("%-34s FAILED: %s %s\n", c.name, s.message.c_str(), cudaGetErrorString(e));
    return false;
  }
  std::vector<unsigned char> ho(nq * es);
  std::vector<float> lse(nlse);
  cudaMemcpy(ho.data(), dout, ho.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost);
  double err_o = 0, err_lse = 0;
  long long bad = 0;
  for (size_t i = 0; i < nq; ++i) {
    float x = decode_one(&ho[i * es], c.dt);
    if (!std::isfinite(x)) ++bad;
    else err_o = std::max(err_o, double(std::fabs(x - o_ref[i])));
  }
  for (size_t i = 0; i < nlse; ++i) {
    if (std::isinf(lse_ref[i])) {
      if (!(std::isinf(lse[i]) && lse[i] < 0)) ++bad;
    } else if (!std::isfinite(lse[i])) {
      ++bad;
    } else {
      err_lse = std::max(err_lse, double(std::fabs(lse[i] - lse_ref[i])));
    }
  }
  // Loose bounds (the gtest suite applies the anchor rule): the dtype's rounding of P and O.
  const double bound = c.dt == FA_FLOAT32 ? 1e-4 : c.dt == FA_FLOAT16 ? 5e-3 : 4e-2;
  const bool ok = bad == 0 && err_o <= bound && err_lse <= 1e-3;
  std::printf("%-34s max|o-ref| %.2e  max|lse-ref| %.2e  not finite %lld  workspace %.1f MiB  %s\n", c.name, err_o, err_lse,
              bad, ws_bytes / 1048576.0, ok ? "ok" : "FAILED");
  if (time_it && ok) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    std::vector<float> ms;
    for (int i = 0; i < 20; ++i) {
      cudaEventRecord(a);
      cuda::standard_forward(p);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double flops = 4.0 * c.batch * c.h * double(c.sq) * c.sk * c.d * (c.causal ? 0.5 : 1.0);
    std::printf("  timing: median %.3f ms (min %.3f) over 20 runs, %.1f TFLOP/s; workspace (S fp32 + P) %.1f MiB\n",
                ms[10], ms[0], flops / (ms[10] * 1e-3) / 1e12, ws_bytes / 1048576.0);
  }
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(ws);
  return ok;
}

}  // namespace

// --small: skip the classic problem (for compute-sanitizer runs).
int main(int argc, char** argv) {
  const bool small = argc > 1 && std::string(argv[1]) == "--small";
  const Config configs[] = {
      {"classic b32 s512 h16 d64 causal fp16", 32, 512, 512, 16, 16, 64, FA_FLOAT16, true, -1, -1, 0, false},
      {"bf16 sq<sk causal", 2, 100, 300, 4, 4, 128, FA_BFLOAT16, true, -1, -1, 0, false},
      {"fp32 sq>sk non-causal d40", 2, 77, 33, 3, 3, 40, FA_FLOAT32, false, -1, -1, 0, false},
      {"GQA 8:2 bhsd window softcap", 2, 129, 129, 8, 2, 64, FA_FLOAT16, false, 16, 4, 30.f, true},
      {"MQA 8:1 causal sq1", 3, 1, 1000, 8, 1, 256, FA_FLOAT16, true, -1, -1, 0, false},
      {"window masks whole rows", 1, 64, 16, 2, 2, 32, FA_FLOAT16, false, 0, 0, 0, false},
      {"no keys", 2, 7, 0, 2, 2, 64, FA_BFLOAT16, false, -1, -1, 0, false},
  };
  bool all = true;
  for (size_t i = small ? 1 : 0; i < sizeof configs / sizeof configs[0]; ++i) all &= check(configs[i], i == 0);
  std::printf("%s\n", all ? "standard_check: all ok" : "standard_check: FAILED");
  return all ? 0 : 1;
}
