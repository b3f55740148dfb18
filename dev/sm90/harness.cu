// Standalone dev harness of the Hopper forward (no library link needed): checks
// flashattn::cuda::sm90_forward against an fp64 CPU reference on many shapes, then times the
// standard sweep with CUDA events.
//
// Build (from the repository root; see dev/sm90/run.sh):
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -DFLASHATTN_HDIM_64=1 ...
//        dev/sm90/harness.cu src/cuda/sm90/*.cu -o sm90_harness -Xcompiler -fopenmp
// Run:  sm90_harness check [small] | sm90_harness bench [variant-name]
//       sm90_harness profile <head_dim> <causal> <seqlen>   (one shape of the sweep, for ncu)
//       sm90_harness trace <head_dim> <causal> <seqlen>     (a -DFLASHATTN_SM90_TRACE=1 build: the
//                                                            clocks of the pipeline's events per tile,
//                                                            and each CTA's start and end times)
//
// The check follows the project's rule: the error against fp64 must be within 2x the error of a
// plain same-precision implementation (fp32 scores and softmax, P and O rounded to the dtype)
// plus a tiny absolute term; outputs are poisoned with NaN before the call.
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
#include "common/mask.hpp"
#include "cuda/kernels.hpp"
#include "cuda/sm90/params.cuh"  // the trace buffer's layout (kTraceCtaBase)

// The library's name table, which this harness does not link.
extern "C" const char* fa_dtype_name(fa_dtype d) { return d == FA_BFLOAT16 ? "bf16" : d == FA_FLOAT16 ? "fp16" : "fp32"; }

using flashattn::Mask;

#define CHECK_CUDA(x)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

struct Case {
  fa_dtype dtype;
  int head_dim, batch, seqlen_q, seqlen_k, num_heads, num_heads_kv;
  int causal, window_left, window_right;
  float softcap;
  bool varlen, padded_strides, with_lse;
  std::vector<int> lens_q, lens_k;  // varlen
};

static std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s d=%d b=%d sq=%d sk=%d h=%d hkv=%d causal=%d win=(%d,%d) cap=%g%s%s%s",
                fa_dtype_name(c.dtype), c.head_dim, c.batch, c.seqlen_q, c.seqlen_k, c.num_heads, c.num_heads_kv,
                c.causal, c.window_left, c.window_right, c.softcap, c.varlen ? " varlen" : "",
                c.padded_strides ? " padded" : "", c.with_lse ? "" : " no-lse");
  return buf;
}

static float round_dt(float x, fa_dtype d) { return flashattn::round_to(x, d); }

struct Result {
  double err_o = 0, err_o_plain = 0, err_lse = 0, err_lse_plain = 0;
  bool nan = false;
};

// Dev hooks read by launch_template.cuh in trace and watchdog builds.
long long* flashattn_sm90_trace = nullptr;
int* flashattn_sm90_watchdog = nullptr;

// Runs one case and compares. Tensors are (rows, heads, head_dim) per sequence with row stride
// heads * head_dim (+ 8 elements when padded), sequences packed (varlen) or batched.
static bool run_case(const Case& c, std::mt19937& rng) {
  const int d = c.head_dim, H = c.num_heads, Hk = c.num_heads_kv;
  const int batch = c.batch;
  std::vector<int> lq(batch), lk(batch), cq(batch + 1, 0), ck(batch + 1, 0);
  for (int b = 0; b < batch; ++b) {
    lq[b] = c.varlen ? c.lens_q[b] : c.seqlen_q;
    lk[b] = c.varlen ? c.lens_k[b] : c.seqlen_k;
    cq[b + 1] = cq[b] + lq[b];
    ck[b + 1] = ck[b] + lk[b];
  }
  const int max_q = *std::max_element(lq.begin(), lq.end()), max_k = *std::max_element(lk.begin(), lk.end());
  const int64_t pad = c.padded_strides ? 8 : 0;
  const int64_t q_row = int64_t(H) * d + pad, k_row = int64_t(Hk) * d + pad;
  const int64_t rows_q = c.varlen ? cq[batch] : int64_t(batch) * c.seqlen_q;
  const int64_t rows_k = c.varlen ? ck[batch] : int64_t(batch) * c.seqlen_k;
  const size_t nq = size_t(rows_q * q_row), nk = size_t(rows_k * k_row);

  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> hq(nq), hk(nk), hv(nk);
  auto to16 = [&](float x) {
    return c.dtype == FA_BFLOAT16 ? flashattn::float_to_bf16(x) : flashattn::float_to_half(x);
  };
  auto from16 = [&](uint16_t x) {
    return c.dtype == FA_BFLOAT16 ? flashattn::bf16_to_float(x) : flashattn::half_to_float(x);
  };
  for (auto& x : hq) x = to16(normal(rng));
  for (auto& x : hk) x = to16(normal(rng));
  for (auto& x : hv) x = to16(normal(rng));

  uint16_t *dq, *dk, *dv, *dout;
  float* dlse;
  int *dcq = nullptr, *dck = nullptr;
  CHECK_CUDA(cudaMalloc(&dq, nq * 2));
  CHECK_CUDA(cudaMalloc(&dk, nk * 2));
  CHECK_CUDA(cudaMalloc(&dv, nk * 2));
  CHECK_CUDA(cudaMalloc(&dout, nq * 2));
  const size_t nlse = size_t(H) * (c.varlen ? rows_q : int64_t(batch) * c.seqlen_q);
  CHECK_CUDA(cudaMalloc(&dlse, std::max<size_t>(nlse, 1) * 4));
  CHECK_CUDA(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, hv.data(), nk * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dout, 0xff, nq * 2));  // NaN in fp16 and bf16
  CHECK_CUDA(cudaMemset(dlse, 0xff, std::max<size_t>(nlse, 1) * 4));
  if (c.varlen) {
    CHECK_CUDA(cudaMalloc(&dcq, (batch + 1) * 4));
    CHECK_CUDA(cudaMalloc(&dck, (batch + 1) * 4));
    CHECK_CUDA(cudaMemcpy(dcq, cq.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dck, ck.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  }

  fa_params p;
  std::memset(&p, 0, sizeof p);
  p.q = dq;
  p.k = dk;
  p.v = dv;
  p.o = dout;
  p.lse = c.with_lse ? dlse : nullptr;
  p.q_row_stride = p.o_row_stride = q_row;
  p.k_row_stride = p.v_row_stride = k_row;
  p.q_head_stride = p.o_head_stride = p.k_head_stride = p.v_head_stride = d;
  p.q_batch_stride = p.o_batch_stride = c.seqlen_q * q_row;
  p.k_batch_stride = p.v_batch_stride = c.seqlen_k * k_row;
  p.batch = batch;
  p.seqlen_q = c.varlen ? max_q : c.seqlen_q;
  p.seqlen_k = c.varlen ? max_k : c.seqlen_k;
  p.num_heads = H;
  p.num_heads_kv = Hk;
  p.head_dim = d;
  p.cu_seqlens_q = dcq;
  p.cu_seqlens_k = dck;
  p.total_q = c.varlen ? cq[batch] : 0;
  p.total_k = c.varlen ? ck[batch] : 0;
  p.dtype = c.dtype;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  p.num_splits = 1;  // whole tiles (the split has its own tests: Sm90Forward.LastRoundSplit*)

  bool ok = flashattn::cuda::sm90_supports(p);
  if (!ok) {
    std::printf("FAIL %s: sm90_supports is false\n", describe(c).c_str());
    return false;
  }
  // Watchdog builds (FLASHATTN_SM90_WATCHDOG) record waits that hung here: 1 + 64 records of 20.
  constexpr int kWatchdogInts = 1 + 64 * 20;
  if (!flashattn_sm90_watchdog) CHECK_CUDA(cudaMalloc(&flashattn_sm90_watchdog, kWatchdogInts * 4));
  CHECK_CUDA(cudaMemset(flashattn_sm90_watchdog, 0, kWatchdogInts * 4));
  flashattn::Status st = flashattn::cuda::sm90_forward(p);
  if (!st.ok()) {
    std::printf("FAIL %s: %s\n", describe(c).c_str(), st.message.c_str());
    return false;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  {
    std::vector<int> w(kWatchdogInts);
    CHECK_CUDA(cudaMemcpy(w.data(), flashattn_sm90_watchdog, kWatchdogInts * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < std::min(w[0], 64); ++i) {
      const int* r = &w[1 + 20 * i];
      std::printf("WATCHDOG block %d thread %d bar %d parity %d state %08x%08x |", r[0], r[1], r[2], r[3], r[4], r[5]);
      for (int g = 0; g < 4; ++g) std::printf(" wg%d m%d bh%d n/count %d |", g, r[6 + 3 * g], r[7 + 3 * g], r[8 + 3 * g]);
      std::printf("\n");
    }
  }
  std::vector<uint16_t> hout(nq);
  std::vector<float> hlse(std::max<size_t>(nlse, 1));
  CHECK_CUDA(cudaMemcpy(hout.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hlse.data(), dlse, hlse.size() * 4, cudaMemcpyDeviceToHost));

  const double scale = 1.0 / std::sqrt(double(d));
  Result r;
  // Reference per (sequence, head, row), in parallel over rows.
  for (int b = 0; b < batch; ++b) {
    const Mask mask(lq[b], lk[b], c.causal != 0, c.window_left, c.window_right);
    const int64_t q0 = c.varlen ? cq[b] : int64_t(b) * c.seqlen_q;
    const int64_t k0 = c.varlen ? ck[b] : int64_t(b) * c.seqlen_k;
    for (int h = 0; h < H; ++h) {
      const int hk_ = h / (H / Hk);
      double eo = 0, eop = 0, el = 0, elp = 0;
      bool nan = false;
#pragma omp parallel for reduction(max : eo, eop, el, elp) reduction(|| : nan) schedule(dynamic, 4)
      for (int i = 0; i < lq[b]; ++i) {
        const uint16_t* qi = &hq[(q0 + i) * q_row + int64_t(h) * d];
        const int64_t jb = mask.key_begin(i), je = mask.key_end(i);
        std::vector<double> s(std::max<int64_t>(je - jb, 0));
        std::vector<float> sf(s.size());
        double mx = -INFINITY;
        float mxf = -INFINITY;
        for (int64_t j = jb; j < je; ++j) {
          const uint16_t* kj = &hk[(k0 + j) * k_row + int64_t(hk_) * d];
          double acc = 0;
          float accf = 0;
          for (int t = 0; t < d; ++t) {
            acc += double(from16(qi[t])) * from16(kj[t]);
            accf += from16(qi[t]) * from16(kj[t]);
          }
          double x = acc * scale;
          float xf = accf * float(scale);
          if (c.softcap > 0) {
            x = c.softcap * std::tanh(x / c.softcap);
            xf = c.softcap * std::tanh(xf / c.softcap);
          }
          s[j - jb] = x;
          sf[j - jb] = xf;
          mx = std::max(mx, x);
          mxf = std::max(mxf, xf);
        }
        double sum = 0;
        float sumf = 0;
        for (size_t j = 0; j < s.size(); ++j) {
          s[j] = std::exp(s[j] - mx);
          sum += s[j];
          sf[j] = std::exp(sf[j] - mxf);
          sumf += sf[j];
        }
        const uint16_t* oi = &hout[(q0 + i) * q_row + int64_t(h) * d];
        for (int t = 0; t < d; ++t) {
          double acc = 0;
          float accf = 0;
          for (size_t j = 0; j < s.size(); ++j) {
            const float vj = from16(hv[(k0 + jb + int64_t(j)) * k_row + int64_t(hk_) * d + t]);
            acc += s[j] * vj;
            accf += round_dt(sf[j] / sumf, c.dtype) * vj;
          }
          const double ref = s.empty() ? 0.0 : acc / sum;
          const double got = from16(oi[t]);
          if (std::isnan(got)) nan = true;
          eo = std::max(eo, std::fabs(got - ref));
          eop = std::max(eop, std::fabs(double(round_dt(s.empty() ? 0.f : accf, c.dtype)) - ref));
        }
        if (c.with_lse) {
          const double ref = s.empty() ? -INFINITY : mx + std::log(sum);
          const int64_t idx = c.varlen ? int64_t(h) * rows_q + q0 + i : (int64_t(b) * H + h) * c.seqlen_q + i;
          const double got = hlse[idx];
          if (std::isnan(got)) nan = true;
          if (std::isinf(ref)) {
            if (!(std::isinf(got) && got < 0)) el = std::max(el, 1e30);
          } else {
            el = std::max(el, std::fabs(got - ref));
            elp = std::max(elp, std::fabs(double(mxf + std::log(sumf)) - ref));
          }
        }
      }
      r.err_o = std::max(r.err_o, eo);
      r.err_o_plain = std::max(r.err_o_plain, eop);
      r.err_lse = std::max(r.err_lse, el);
      r.err_lse_plain = std::max(r.err_lse_plain, elp);
      r.nan = r.nan || nan;
    }
  }
  // Rows of the padding between rows (padded strides) must stay untouched: the poison survives.
  bool pad_ok = true;
  if (c.padded_strides)
    for (int64_t row = 0; row < rows_q; ++row)
      for (int64_t t = int64_t(H) * d; t < q_row; ++t)
        if (hout[row * q_row + t] != 0xffff) pad_ok = false;

  const bool pass = !r.nan && pad_ok && r.err_o <= 2 * r.err_o_plain + 1e-5 && r.err_lse <= 2 * r.err_lse_plain + 1e-4;
  std::printf("%s %s: o err %.3g (plain %.3g), lse err %.3g (plain %.3g)%s%s\n", pass ? "PASS" : "FAIL",
              describe(c).c_str(), r.err_o, r.err_o_plain, r.err_lse, r.err_lse_plain, r.nan ? " NaN" : "",
              pad_ok ? "" : " padding overwritten");
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  cudaFree(dlse);
  if (dcq) cudaFree(dcq);
  if (dck) cudaFree(dck);
  return pass;
}

static std::vector<Case> check_cases(bool small) {
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  for (fa_dtype dt : {FA_BFLOAT16, FA_FLOAT16}) {
    for (int d : {64, 128, 256}) {
      if (small) {
        add({dt, d, 2, 200, 300, 2, 1, 1, -1, -1, 0.f, false, false, true, {}, {}});
        add({dt, d, 3, 0, 0, 2, 2, 0, -1, -1, 0.f, true, false, true, {70, 1, 190}, {130, 90, 5}});
        // Two or three tiles per CTA (more tiles than SMs): the persistent loop's tile boundaries.
        if (dt == FA_BFLOAT16) add({dt, d, 1, 130, 200, 140, 20, 1, -1, -1, 0.f, false, false, true, {}, {}});
        if (dt == FA_BFLOAT16 && d == 64) add({dt, d, 1, 100, 2100, 140, 20, 0, -1, -1, 0.f, false, false, true, {}, {}});
        if (dt == FA_BFLOAT16 && d == 64) add({dt, d, 1, 1100, 1100, 2, 1, 1, -1, -1, 0.f, false, false, true, {}, {}});
        continue;
      }
      add({dt, d, 2, 384, 384, 4, 4, 0, -1, -1, 0.f, false, false, true, {}, {}});
      add({dt, d, 2, 333, 333, 3, 3, 1, -1, -1, 0.f, false, false, true, {}, {}});
      add({dt, d, 1, 200, 513, 2, 2, 1, -1, -1, 0.f, false, false, true, {}, {}});
      add({dt, d, 1, 513, 200, 2, 2, 1, -1, -1, 0.f, false, false, true, {}, {}});
      add({dt, d, 1, 700, 700, 2, 2, 0, 64, 32, 0.f, false, false, true, {}, {}});
      add({dt, d, 1, 600, 650, 2, 2, 1, 150, -1, 0.f, false, false, true, {}, {}});
      add({dt, d, 1, 300, 300, 2, 2, 0, -1, 0, 0.f, false, false, true, {}, {}});
      add({dt, d, 2, 300, 300, 2, 2, 1, -1, -1, 30.f, false, false, true, {}, {}});
      add({dt, d, 1, 257, 1000, 8, 2, 0, -1, -1, 0.f, false, false, true, {}, {}});
      add({dt, d, 2, 129, 400, 4, 1, 1, -1, -1, 0.f, false, false, false, {}, {}});
      add({dt, d, 3, 1, 1000, 4, 2, 0, -1, -1, 0.f, false, false, true, {}, {}});
      add({dt, d, 2, 190, 190, 2, 2, 1, -1, -1, 0.f, false, true, true, {}, {}});
      add({dt, d, 4, 0, 0, 4, 2, 0, -1, -1, 0.f, true, false, true, {100, 257, 1, 40}, {300, 50, 129, 0}});
      add({dt, d, 4, 0, 0, 4, 2, 1, -1, -1, 0.f, true, false, true, {100, 257, 1, 300}, {300, 50, 129, 260}});
      add({dt, d, 3, 0, 0, 2, 2, 0, 40, 10, 5.f, true, true, true, {130, 64, 200}, {130, 500, 70}});
      // More tiles than SMs, so each CTA runs several in turn (the cases above need one each):
      // tiles of 1-4 key blocks, empty tiles (s_q - s_k >= 128 causal, empty key ranges), varlen
      // tiles past a sequence's end, GQA, windows, softcap.
      if (dt == FA_BFLOAT16 || d == 128) {
        add({dt, d, 2, 300, 130, 64, 16, 0, -1, -1, 0.f, false, false, true, {}, {}});
        add({dt, d, 2, 400, 200, 48, 48, 1, -1, -1, 0.f, false, false, true, {}, {}});
        add({dt, d, 10, 0, 0, 32, 8, 0, 64, 16, 0.f, true, false, true, {300, 0, 1, 129, 256, 70, 400, 128, 5, 200},
             {200, 10, 300, 0, 256, 500, 130, 128, 64, 190}});
        add({dt, d, 10, 0, 0, 32, 32, 1, -1, -1, 20.f, true, false, true, {300, 0, 1, 129, 256, 70, 400, 128, 5, 200},
             {200, 10, 300, 0, 256, 500, 130, 128, 64, 190}});
      }
      // Several tiles per CTA with the long-key configurations (head_dim 64: overlapped tile
      // boundaries); few rows per tile keep the CPU reference short.
      if (d == 64) add({dt, d, 1, 20, 2100, 140, 20, 0, -1, -1, 0.f, false, false, true, {}, {}});
      if (d == 64 && dt == FA_BFLOAT16) add({dt, d, 1, 3, 8300, 136, 8, 1, -1, -1, 0.f, false, false, true, {}, {}});
      // Causal past 1k rows (head_dim 64: 3 serial warpgroups, block_n 192), with varlen, softcap, window.
      if (d == 64) {
        add({dt, d, 2, 1500, 1700, 4, 2, 1, -1, -1, 0.f, false, false, true, {}, {}});
        add({dt, d, 4, 0, 0, 6, 2, 1, -1, -1, 15.f, true, false, true, {1100, 0, 1300, 7}, {1200, 50, 1300, 900}});
        add({dt, d, 1, 1500, 1700, 4, 2, 1, 250, -1, 30.f, false, false, true, {}, {}});
      }
      // Long key ranges: the tile configurations for many key blocks (launch_template.cuh).
      add({dt, d, 1, 130, 8300, 2, 1, 0, -1, -1, 0.f, false, false, true, {}, {}});
      add({dt, d, 1, 300, 8300, 2, 1, 1, -1, -1, 0.f, false, false, true, {}, {}});
    }
  }
  return cases;
}


// Per tile of CTAs 0-7: clock64 of the consumer events 8 next tile known (consumer_next_tile: decoded,
// or, where the producer publishes plans, q waited for and the plan read), 0 run_tile set up, 1 q
// ready (published plans: right after 0), 2 first k ready, 3 first S done, 4 first softmax done,
// 5 key-block loop done, 6 last O += P v done, (staged epilogue: 9 O in shared memory, 10 stores issued,
// 11 fence, 12 barrier; slab epilogue: 9 the first columns in the slab, 10 their TMA store issued, 11 the
// slab read, 12 the second store issued) 7 stored; producer: 0 tile start, 1 first k issued, 2 next q issued
// early, 3 last v issued.
static void print_trace(const std::vector<long long>& t, int key_blocks) {
  auto at = [&](int cta, int slot, int tile, int e) { return t[((size_t(cta) * 4 + slot) * 64 + tile) * 16 + e]; };
  // The consumer's events in time order and the name of the span that ends at each.
  const int order[] = {8, 0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 7};
  const char* names[] = {"next tile", "set up", "q wait", "k wait", "first S", "softmax", "loop", "last PV",
                         "epi smem", "epi store", "epi fence", "epi bar", "epi rest"};
  const int kSpans = 13;
  double sum[kSpans] = {}, prod[4] = {};
  int count = 0, pcount = 0;
  for (int cta = 0; cta < 8; ++cta)
    for (int slot = 0; slot < 2; ++slot)
      for (int tile = 1; tile + 1 < 64; ++tile) {
        if (!at(cta, slot, tile + 1, 8) || !at(cta, slot, tile, 7)) break;
        long long prev = at(cta, slot, tile - 1, 7);
        for (int i = 0; i < kSpans; ++i) {
          const long long now = at(cta, slot, tile, order[i]);
          if (!now) continue;  // an event this build does not record
          sum[i] += double(now - prev);
          prev = now;
        }
        ++count;
        if (slot == 0 && at(cta, 3, tile, 0)) {
          for (int e = 0; e < 4; ++e)
            if (at(cta, 3, tile, e)) prod[e] += double(at(cta, 3, tile, e) - at(cta, 0, tile, 0));
          ++pcount;
        }
      }
  std::printf("trace: %d tiles, %d key blocks a tile; mean clocks per tile:\n", count, key_blocks);
  double total = 0;
  for (int i = 0; i < kSpans; ++i) total += sum[i];
  for (int i = 0; i < kSpans; ++i) std::printf("  %-9s %8.0f  %5.1f%%\n", names[i], sum[i] / count, 100 * sum[i] / total);
  std::printf("  total     %8.0f, loop per block %.0f\n", total / count, sum[6] / count / std::max(1, key_blocks - 1));
  std::printf("producer, from consumer 0's set-up: tile start %.0f, first k %.0f, next q %.0f, last v %.0f\n",
              prod[0] / pcount, prod[1] / pcount, prod[2] / pcount, prod[3] / pcount);
  std::printf("CTA 0, tiles 0-3 (events in time order from wg0's set-up | wg1 | producer):\n");
  for (int tile = 0; tile < 4; ++tile) {
    const long long t0 = at(0, 0, tile, 0);
    for (int slot : {0, 1, 3}) {
      std::printf("  t%d s%d:", tile, slot);
      for (int i = 0; i < (slot == 3 ? 4 : kSpans); ++i) {
        const int e = slot == 3 ? i : order[i];
        std::printf(" %7lld", at(0, slot, tile, e) ? at(0, slot, tile, e) - t0 : -1);
      }
      std::printf("\n");
    }
  }
}
// Per CTA (kTraceCtaBase on): globaltimer at the consumers' start and at each consumer warpgroup's end, in
// microseconds from the first start: the spread of starts and of ends (the schedule's balance).
static void print_cta_times(const std::vector<long long>& t) {
  const size_t base = kTraceCtaBase;
  std::vector<double> start, end;
  for (int cta = 0; cta < 1024 && t[base + 4 * cta]; ++cta) {
    start.push_back(double(t[base + 4 * cta]));
    long long e = 0;
    for (int wg = 0; wg < 3; ++wg) e = std::max(e, t[base + 4 * cta + 1 + wg]);
    end.push_back(double(e));
  }
  if (start.empty()) return;
  const double t0 = *std::min_element(start.begin(), start.end());
  auto stats = [&](const char* what, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    double mean = 0;
    for (double x : v) mean += (x - t0) / 1e3 / v.size();
    std::printf("  %s (us from the first start, %zu CTAs): min %.2f  p10 %.2f  median %.2f  mean %.2f  p90 %.2f  max %.2f\n",
                what, v.size(), (v.front() - t0) / 1e3, (v[v.size() / 10] - t0) / 1e3, (v[v.size() / 2] - t0) / 1e3, mean,
                (v[v.size() * 9 / 10] - t0) / 1e3, (v.back() - t0) / 1e3);
  };
  stats("start", start);
  stats("end  ", end);
}
static bool g_trace = false;

// BENCH_HDIMS / BENCH_SEQLENS (comma lists, e.g. "64" / "512,2048,16384") narrow the sweep;
// BENCH_HDIMS the checks too (a variant built for some head dims only).
static bool listed(const char* env, int x) {
  const char* list = std::getenv(env);
  if (!list || !*list) return true;
  const std::string s = std::string(",") + list + ",";
  return s.find("," + std::to_string(x) + ",") != std::string::npos;
}

// Timing of the standard sweep: bf16, 16k tokens, hidden 2048 (8 heads of 256).
// Times the sweep; with only_d > 0 runs just that (head_dim, causal, seqlen) twice (for ncu).
static void bench(const char* label, int only_d = 0, int only_causal = 0, int only_seqlen = 0) {
  std::printf("\n%-10s %5s %6s %4s %3s %7s %10s %8s\n", "variant", "hdim", "seqlen", "bat", "cau", "heads", "ms", "TFLOP/s");
  // Every shape of the sweep holds 16k tokens x 2048 hidden: one set of buffers serves all.
  const size_t n = size_t(16384) * 2048;
  uint16_t *q, *k, *v, *o;
  float* lse;
  CHECK_CUDA(cudaMalloc(&q, n * 2));
  CHECK_CUDA(cudaMalloc(&k, n * 2));
  CHECK_CUDA(cudaMalloc(&v, n * 2));
  CHECK_CUDA(cudaMalloc(&o, n * 2));
  CHECK_CUDA(cudaMalloc(&lse, size_t(16384) * 32 * 4));
  {
    std::vector<uint16_t> host(n);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (uint16_t* dst : {q, k, v}) {
      for (auto& x : host) x = flashattn::float_to_bf16(normal(rng));
      CHECK_CUDA(cudaMemcpy(dst, host.data(), n * 2, cudaMemcpyHostToDevice));
    }
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int d : {64, 128, 256}) {
    for (int causal : {0, 1}) {
      // One shape (ncu, trace) may take any seqlen; the sweep its six.
      const std::vector<int> seqlens =
          only_d ? std::vector<int>{only_seqlen} : std::vector<int>{512, 1024, 2048, 4096, 8192, 16384};
      for (int seqlen : seqlens) {
        if (only_d && (d != only_d || causal != only_causal)) continue;
        if (!only_d && (!listed("BENCH_HDIMS", d) || !listed("BENCH_SEQLENS", seqlen))) continue;
        const int batch = 16384 / seqlen, H = d == 256 ? 8 : 2048 / d;
        fa_params p;
        std::memset(&p, 0, sizeof p);
        p.q = q;
        p.k = k;
        p.v = v;
        p.o = o;
        p.lse = lse;
        p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(H) * d;
        p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
        p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = int64_t(seqlen) * H * d;
        p.batch = batch;
        p.seqlen_q = p.seqlen_k = seqlen;
        p.num_heads = p.num_heads_kv = H;
        p.head_dim = d;
        p.dtype = FA_BFLOAT16;
        p.causal = causal;
        p.window_left = p.window_right = -1;
        // The workspace the library asks for (the last round's split, launch_template.cuh), as
        // dev/sm90/fwd_ab.py and the library's benchmark pass it; BENCH_NO_SPLIT=1: whole tiles.
        void* ws = nullptr;
        p.workspace_bytes = std::getenv("BENCH_NO_SPLIT") ? 0 : flashattn::cuda::sm90_forward_workspace(p);
        if (p.workspace_bytes) CHECK_CUDA(cudaMalloc(&ws, p.workspace_bytes));
        p.workspace = ws;
        // ~200 ms of calls first: the clocks settle at their loaded level whatever ran before
        // (after an idle moment the first shapes would run at boost clocks, 5-15% faster).
        {
          cudaEventRecord(e0);
          flashattn::cuda::sm90_forward(p);
          cudaEventRecord(e1);
          CHECK_CUDA(cudaEventSynchronize(e1));
          float t1;
          cudaEventElapsedTime(&t1, e0, e1);
          const int warm = only_d && !g_trace ? 3 : std::max(3, int(200.f / std::max(t1, 1e-3f)));
          for (int w = 0; w < warm; ++w) flashattn::cuda::sm90_forward(p);
        }
        std::vector<float> ms;
        // Calls back to back between the events: the host's work per call (tensor maps, launch)
        // overlaps the kernel before, as in a training step, instead of adding to the time.
        const int calls = only_d ? 1 : 5;
        for (int it = 0; it < (only_d ? 1 : 15); ++it) {
          cudaEventRecord(e0);
          flashattn::Status st;
          for (int c = 0; c < calls; ++c) st = flashattn::cuda::sm90_forward(p);
          cudaEventRecord(e1);
          CHECK_CUDA(cudaEventSynchronize(e1));
          if (!st.ok()) {
            std::printf("error: %s\n", st.message.c_str());
            std::exit(1);
          }
          float t;
          cudaEventElapsedTime(&t, e0, e1);
          ms.push_back(t / calls);
        }
        if (g_trace) {
          const size_t words = kTraceCtaBase + 4 * 1024;
          CHECK_CUDA(cudaMalloc(&flashattn_sm90_trace, words * 8));
          CHECK_CUDA(cudaMemset(flashattn_sm90_trace, 0, words * 8));
          flashattn::cuda::sm90_forward(p);
          CHECK_CUDA(cudaDeviceSynchronize());
          std::vector<long long> t(words);
          CHECK_CUDA(cudaMemcpy(t.data(), flashattn_sm90_trace, words * 8, cudaMemcpyDeviceToHost));
          cudaFree(flashattn_sm90_trace);
          flashattn_sm90_trace = nullptr;
          const int bn = std::getenv("TRACE_BLOCK_N") ? std::atoi(std::getenv("TRACE_BLOCK_N")) : 128;
          print_trace(t, (seqlen + bn - 1) / bn);
          print_cta_times(t);
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        const double flops = 4.0 * batch * H * double(seqlen) * seqlen * d / (causal ? 2 : 1);
        std::printf("%-10s %5d %6d %4d %3d %7d %10.4f %8.1f\n", label, d, seqlen, batch, causal, H, med,
                    flops / med / 1e9);
        if (ws) cudaFree(ws);
      }
    }
  }
  cudaFree(q);
  cudaFree(k);
  cudaFree(v);
  cudaFree(o);
  cudaFree(lse);
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a case that hangs still leaves the ones before in the log
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (mode == "bench") {
    bench(argc > 2 ? argv[2] : "sm90");
    return 0;
  }
  if (mode == "trace" && argc > 4) {  // trace <head_dim> <causal> <seqlen> (a FLASHATTN_SM90_TRACE build)
    g_trace = true;
    bench("trace", std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
    return 0;
  }
  if (mode == "profile" && argc > 4) {  // profile <head_dim> <causal> <seqlen>
    bench("profile", std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
    return 0;
  }
  const bool small = argc > 2 && std::string(argv[2]) == "small";
  std::mt19937 rng(1234);
  int failed = 0, total = 0;
  // CHECK_MATCH: only the cases whose description contains it, each CHECK_REPEAT times (a hang hunt).
  const char* match = std::getenv("CHECK_MATCH");
  const int repeat = std::getenv("CHECK_REPEAT") ? std::max(1, std::atoi(std::getenv("CHECK_REPEAT"))) : 1;
  for (const Case& c : check_cases(small)) {
    if (!listed("BENCH_HDIMS", c.head_dim)) continue;
    if (match && *match && describe(c).find(match) == std::string::npos) continue;
    for (int r = 0; r < repeat; ++r) {
      ++total;
      if (!run_case(c, rng)) ++failed;
    }
  }
  // Strides TMA cannot take fall back to sm80: sm90_supports must say no.
  {
    fa_params p;
    std::memset(&p, 0, sizeof p);
    p.q = p.k = p.v = p.o = reinterpret_cast<void*>(uintptr_t(1) << 20);
    p.dtype = FA_BFLOAT16;
    p.head_dim = 128;
    p.batch = 1;
    p.seqlen_q = p.seqlen_k = 64;
    p.num_heads = p.num_heads_kv = 2;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = 2 * 128 + 4;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = 128;
    ++total;
    if (flashattn::cuda::sm90_supports(p)) {
      std::printf("FAIL sm90_supports accepts a row stride of 260 elements\n");
      ++failed;
    }
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = 256;
    p.head_dim = 96;
    ++total;
    if (flashattn::cuda::sm90_supports(p)) {
      std::printf("FAIL sm90_supports accepts head_dim 96\n");
      ++failed;
    }
  }
  std::printf("\n%d of %d checks passed\n", total - failed, total);
  return failed ? 1 : 0;
}
