// check_forward / check_backward: the oracle, the plain implementation and the implementation
// under test on the same inputs, judged by the anchor rule.
#include "support/harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include "common/dtype.hpp"
#include "common/mask.hpp"
#include "support/problem.hpp"

#if defined(FA_TEST_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace fa_test {

std::string Case::name() const {
  std::ostringstream s;
  s << fa_dtype_name(dtype) << " d" << head_dim << " h" << num_heads;
  if (num_heads_kv != num_heads) s << ":" << num_heads_kv;
  if (seqlens_q.empty()) {
    s << " b" << batch << " sq" << seqlen_q << " sk" << seqlen_k;
  } else {
    auto list = [&](const std::vector<int>& v) {
      for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
    };
    s << " varlen q[";
    list(seqlens_q);
    s << "] k[";
    list(seqlens_k);
    s << "]";
  }
  if (!seqused_k.empty()) {
    s << " used[";
    for (size_t i = 0; i < seqused_k.size(); ++i) s << (i ? "," : "") << seqused_k[i];
    s << "]";
  }
  if (page_block_size) s << " page" << page_block_size;
  if (!leftpad_k.empty()) {
    s << " leftpad[";
    for (size_t i = 0; i < leftpad_k.size(); ++i) s << (i ? "," : "") << leftpad_k[i];
    s << "]";
  }
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
  if (softcap > 0.f) s << " softcap" << softcap;
  if (alibi) s << " alibi" << (alibi == 2 ? "_per_seq" : "") << "_" << alibi_max_slope;
  if (dropout_p > 0.f) s << " dropout" << dropout_p << "_seed" << dropout_seed;
  if (softmax_scale != 0.f) s << " scale" << softmax_scale;
  if (bhsd) s << " bhsd";
  if (row_padding) s << " pad" << row_padding;
  if (deterministic) s << " deterministic";
  if (num_splits) s << " splits" << num_splits;
  if (cpu_cache_bytes) s << " M" << cpu_cache_bytes;
  if (num_threads) s << " threads" << num_threads;
  return s.str();
}

std::string test_name(const std::string& readable) {
  std::string out;
  for (char ch : readable) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

bool cuda_present() {
#if defined(FA_TEST_HAVE_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0 && fa_cuda_available() != 0;
#else
  return false;
#endif
}

bool hopper_present() {
#if defined(FA_TEST_HAVE_CUDA)
  if (!cuda_present()) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------
// Running an implementation with its memory on the host or the GPU.

namespace {

std::string status_text(fa_status s) { return std::string(fa_status_name(s)) + ": " + fa_last_error(); }

#if defined(FA_TEST_HAVE_CUDA)
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  // A device copy of host bytes (nothing for an empty buffer: the pointer stays null).
  std::string upload(const void* host, size_t n) {
    bytes = n;
    if (n == 0) return "";
    if (cudaMalloc(&ptr, n) != cudaSuccess) return std::string("cudaMalloc: ") + cudaGetErrorString(cudaGetLastError());
    if (cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice) != cudaSuccess)
      return std::string("cudaMemcpy to device: ") + cudaGetErrorString(cudaGetLastError());
    return "";
  }
  std::string download(void* host) const {
    if (bytes == 0) return "";
    if (cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
      return std::string("cudaMemcpy to host: ") + cudaGetErrorString(cudaGetLastError());
    return "";
  }
};

std::string run_on_cuda(Problem& pr, fa_impl impl, bool backward) {
  fa_params p = pr.params();
  DeviceBuffer q, k, v, o, dout, dq, dk, dv, lse, cu_q, cu_k, used_k, block_table, leftpad, alibi, workspace;
  std::string err;
  auto up = [&](DeviceBuffer& d, const void* host, size_t n) {
    if (err.empty()) err = d.upload(host, n);
  };
  up(q, pr.q.data(), pr.q.bytes.size());
  up(k, pr.k.data(), pr.k.bytes.size());
  up(v, pr.v.data(), pr.v.bytes.size());
  up(o, pr.o.data(), pr.o.bytes.size());
  up(dout, pr.dout.data(), pr.dout.bytes.size());
  up(dq, pr.dq.data(), pr.dq.bytes.size());
  up(dk, pr.dk.data(), pr.dk.bytes.size());
  up(dv, pr.dv.data(), pr.dv.bytes.size());
  up(lse, pr.lse.data(), pr.lse.size() * sizeof(float));
  up(cu_q, pr.cu_q.data(), pr.cu_q.size() * sizeof(int32_t));
  up(cu_k, pr.cu_k.data(), pr.cu_k.size() * sizeof(int32_t));
  up(used_k, pr.used_k.data(), pr.used_k.size() * sizeof(int32_t));
  up(block_table, pr.block_table.data(), pr.block_table.size() * sizeof(int32_t));
  up(leftpad, pr.leftpad_k.data(), pr.leftpad_k.size() * sizeof(int32_t));
  up(alibi, pr.alibi_slopes.data(), pr.alibi_slopes.size() * sizeof(float));
  if (!err.empty()) return err;
  p.q = q.ptr;
  p.k = k.ptr;
  p.v = v.ptr;
  p.o = o.ptr;
  p.dout = dout.ptr;
  p.dq = dq.ptr;
  p.dk = dk.ptr;
  p.dv = dv.ptr;
  p.lse = static_cast<float*>(lse.ptr);
  if (pr.varlen) {
    p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.ptr);
    p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.ptr);
  }
  if (!pr.used_k.empty()) p.seqused_k = static_cast<const int32_t*>(used_k.ptr);
  if (!pr.block_table.empty()) p.block_table = static_cast<const int32_t*>(block_table.ptr);
  if (!pr.leftpad_k.empty()) p.leftpad_k = static_cast<const int32_t*>(leftpad.ptr);
  if (!pr.alibi_slopes.empty()) p.alibi_slopes = static_cast<const float*>(alibi.ptr);
  size_t ws = 0;
  fa_status s = fa_workspace_size(&p, impl, backward ? 1 : 0, &ws);
  if (s != FA_OK) return "fa_workspace_size: " + status_text(s);
  if (ws > 0) {
    if (cudaMalloc(&workspace.ptr, ws) != cudaSuccess) return std::string("cudaMalloc(workspace): ") + cudaGetErrorString(cudaGetLastError());
    workspace.bytes = ws;
    cudaMemset(workspace.ptr, 0xFF, ws);  // garbage: the impl must initialize what it reads
  }
  p.workspace = workspace.ptr;
  p.workspace_bytes = ws;
  s = backward ? fa_backward(&p, impl) : fa_forward(&p, impl);
  if (s != FA_OK) return status_text(s);
  if (cudaDeviceSynchronize() != cudaSuccess) return std::string("CUDA error after the call: ") + cudaGetErrorString(cudaGetLastError());
  if (backward) {
    for (auto [d, h] : {std::pair{&dq, &pr.dq}, std::pair{&dk, &pr.dk}, std::pair{&dv, &pr.dv}})
      if (err.empty()) err = d->download(h->data());
  } else {
    err = o.download(pr.o.data());
    if (err.empty()) err = lse.download(pr.lse.data());
  }
  return err;
}
#endif

}  // namespace

std::string run_impl(Problem& pr, fa_impl impl, Space space, bool backward) {
  if (space == Space::Cuda) {
#if defined(FA_TEST_HAVE_CUDA)
    if (!cuda_present()) return "no CUDA GPU on this machine";
    return run_on_cuda(pr, impl, backward);
#else
    return "this test build has no CUDA (Space::Cuda)";
#endif
  }
  fa_params p = pr.params();
  fa_status s = backward ? fa_backward(&p, impl) : fa_forward(&p, impl);
  return s == FA_OK ? "" : status_text(s);
}

// ---------------------------------------------------------------------------------------------
// The rule.

namespace {

// atol as the anchor suite computes it: twice the dtype's rounding error of x + 0.3 - 0.3 at the
// magnitudes of ref.
double rounding_atol(const std::vector<float>& ref, fa_dtype dt) {
  double worst = 0;
  for (float x : ref) {
    float r = flashattn::round_to(x, dt);
    float y = flashattn::round_to(flashattn::round_to(r + 0.3f, dt) - 0.3f, dt);
    worst = std::max(worst, std::fabs(double(y) - r));
  }
  return 2 * worst;
}

}  // namespace

std::string compare(const char* what, const std::vector<float>& out, const std::vector<float>& ref,
                    const std::vector<float>& plain, double factor, fa_dtype dtype, const HostTensor& layout,
                    const std::vector<double>& floor) {
  std::ostringstream msg;
  if (out.size() != ref.size() || plain.size() != ref.size() || (!floor.empty() && floor.size() != ref.size())) {
    msg << what << ": size mismatch (out " << out.size() << ", ref " << ref.size() << ", plain " << plain.size() << ")";
    return msg.str();
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (std::isnan(out[i])) {
      msg << what << ": element " << layout.index_name(int64_t(i)) << " is NaN (not written, or computed as NaN)";
      return msg.str();
    }
  double plain_err = 0;
  for (size_t i = 0; i < out.size(); ++i) plain_err = std::max(plain_err, std::fabs(double(plain[i]) - ref[i]));
  const double atol = rounding_atol(ref, dtype), bound = factor * plain_err + atol;
  // The worst element: the largest error relative to its bound (the same bound for all without floor).
  double worst_ratio = 0, err = 0, max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    double e = std::fabs(double(out[i]) - ref[i]), b = bound + (floor.empty() ? 0.0 : floor[i]);
    max_err = std::max(max_err, e);
    double ratio = b > 0 ? e / b : (e > 0 ? HUGE_VAL : 0);
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
      err = e;
    }
  }
  if (worst_ratio <= 1) return "";
  msg.precision(6);
  msg << what << ": |out - ref| = " << err << " at " << layout.index_name(int64_t(worst)) << " (out " << out[worst]
      << ", ref " << ref[worst] << ") exceeds the bound " << bound << " = " << factor << " x plain error " << plain_err
      << " + atol " << atol;
  if (!floor.empty()) msg << ", + the element's fp32 floor " << floor[worst];
  msg << " (max |out - ref| " << max_err << ")";
  return msg.str();
}

namespace {

constexpr double kU32 = 1.0 / (1 << 24);  // fp32 unit roundoff

// Start of row r, head h of a logical (nb, rows, heads, d) array.
size_t row_base(int64_t bb, int64_t rows, int64_t r, int64_t heads, int64_t h, int64_t d) {
  return size_t(((bb * rows + r) * heads + h) * d);
}

double norm(const float* x, int d) {
  double n2 = 0;
  for (int c = 0; c < d; ++c) n2 += double(x[c]) * x[c];
  return std::sqrt(n2);
}

}  // namespace

// lse against the reference: -inf exactly where the reference's is (and then the o row exactly 0),
// elsewhere within a bound from fp32 error analysis of what any implementation does: the scores'
// dot products (d + 4) u scale |q||k| (and the scale's rounding), the sum of n exponentials and its
// rescalings (2 n + 16) u, the exp2/log conversions and the final add 8 u (|lse| + max |s|).
std::string check_lse(const Problem& pr, const std::vector<float>& lse, const std::vector<float>& ref_lse,
                      const std::vector<float>& o) {
  const int nh = pr.c.num_heads, nhk = pr.c.num_heads_kv, d = pr.c.head_dim, group = nh / nhk;
  const int nbatch = pr.varlen ? int(pr.cu_q.size()) - 1 : pr.c.batch;
  const double cap = pr.c.softcap;
  std::ostringstream msg;
  msg.precision(8);
  for (int b = 0; b < nbatch; ++b) {
    SeqRange s = pr.seq(b);
    flashattn::Mask mask(int32_t(s.seqlen_q), int32_t(s.seqlen_k), pr.c.causal, pr.c.window_left, pr.c.window_right);
    // |k_j| of every key of every kv head, once (a row takes the largest of those it sees).
    std::vector<double> k_norms(size_t(nhk * s.seqlen_k));
    for (int hk = 0; hk < nhk; ++hk)
      for (int64_t j = 0; j < s.seqlen_k; ++j)
        k_norms[size_t(hk * s.seqlen_k + j)] = norm(&pr.kf[row_base(s.bk, pr.rows_k, s.k_start + j, nhk, hk, d)], d);
    for (int h = 0; h < nh; ++h) {
      const double* head_k_norms = k_norms.data() + h / group * s.seqlen_k;  // (no keys: nothing read)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const int64_t li = pr.lse_index(s.bq, h, s.q_start + i);
        const float got = lse[size_t(li)], want = ref_lse[size_t(li)];
        auto where = [&] {
          return "(b " + std::to_string(b) + ", head " + std::to_string(h) + ", row " + std::to_string(i) + ")";
        };
        const size_t qbase = row_base(s.bq, pr.rows_q, s.q_start + i, nh, h, d);
        if (std::isinf(want) && want < 0) {
          if (!(std::isinf(got) && got < 0)) {
            msg << "lse" << where() << " = " << got << " but the row is fully masked: it must be -inf";
            return msg.str();
          }
          for (int c = 0; c < d; ++c)
            if (o[qbase + size_t(c)] != 0.f) {
              msg << "o" << where() << " col " << c << " = " << o[qbase + size_t(c)]
                  << " but the row is fully masked: it must be 0";
              return msg.str();
            }
          continue;
        }
        const int64_t kb = mask.key_begin(i), ke = mask.key_end(i);
        double kn = 0;
        for (int64_t j = kb; j < ke; ++j) kn = std::max(kn, head_k_norms[j]);
        const double a = pr.scale * norm(&pr.qf[qbase], d) * kn;  // >= |scale * q.k| for every visible key
        // ALiBi's bias adds up to slope times the farthest visible key's distance to |s|.
        const double bias = pr.alibi_slope(b, h) * double(std::max(mask.diagonal_distance(i, kb), mask.diagonal_distance(i, ke - 1)));
        const double smax = (cap > 0 ? std::min(a, cap) : a) + bias;
        const double bound = (d + 4) * kU32 * a + 4 * kU32 * cap + (2.0 * double(ke - kb) + 16) * kU32 +
                             8 * kU32 * (std::fabs(double(want)) + smax);
        const double err = std::fabs(double(got) - want);
        if (!(err <= bound)) {
          msg << "lse" << where() << " = " << got << ", reference " << want << ": error " << err
              << " exceeds the fp32 bound " << bound;
          return msg.str();
        }
      }
    }
  }
  return "";
}

namespace {

std::string untouched(const char* what, const HostTensor& t) {
  return t.outside_view_untouched() ? "" : std::string(what) + ": memory outside the strided view was written";
}

::testing::AssertionResult verdict(const Problem& pr, fa_impl impl, Space space, const char* pass,
                                   const std::vector<std::string>& errors) {
  std::ostringstream msg;
  for (const std::string& e : errors)
    if (!e.empty()) msg << "\n  " << e;
  if (msg.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << fa_impl_name(impl) << " " << pass << " ("
                                       << (space == Space::Cuda ? "cuda" : "host") << " memory), case [" << pr.c.name()
                                       << "], seed " << pr.seed << " (FA_TEST_SEED=" << pr.seed << " reproduces it):"
                                       << msg.str();
}

}  // namespace

std::vector<std::string> judge_forward(const Problem& pr, const Outputs& ref, const Outputs& plain) {
  std::vector<float> o = pr.o.get();
  return {compare("o", o, ref.o, plain.o, 2.0, pr.c.dtype, pr.o, std::vector<double>(plain.o_floor.begin(), plain.o_floor.end())), untouched("o", pr.o),
          check_lse(pr, pr.lse, ref.lse, o)};
}

// Gradients get a per-element floor (plain_backward's *_floor): a backward recomputes P from the
// forward's fp32 lse, dP in fp32, and D = rowsum(dO * O) from o as stored in the dtype, where the
// plain implementation uses its own self-consistent P and D = rowsum(P * dP); it matters where the
// plain error vanishes (a row seeing one key: dS = 0 exactly there) or where the lse is large
// (scores ~1e4: the fp32 lse is off by ~1e-3). All floors take
// rounding errors at their random-walk size, lambda sqrt(n) u with lambda = 4 (Higham & Mary).
std::vector<std::string> judge_backward(const Problem& pr, const Outputs& ref, const Outputs& plain) {
  auto floor = [](const std::vector<float>& f) { return std::vector<double>(f.begin(), f.end()); };
  const fa_dtype dt = pr.c.dtype;
  return {compare("dq", pr.dq.get(), ref.dq, plain.dq, 3.0, dt, pr.dq, floor(plain.dq_floor)),
          compare("dk", pr.dk.get(), ref.dk, plain.dk, 3.0, dt, pr.dk, floor(plain.dk_floor)),
          compare("dv", pr.dv.get(), ref.dv, plain.dv, 3.0, dt, pr.dv, floor(plain.dv_floor)),
          untouched("dq", pr.dq), untouched("dk", pr.dk), untouched("dv", pr.dv)};
}

std::string join_errors(const std::vector<std::string>& errors) {
  std::string all;
  for (const std::string& e : errors)
    if (!e.empty()) all += (all.empty() ? "" : "\n") + e;
  return all;
}

// The implementation runs first: a call that fails (a head dim left out of the build, say) is reported
// without the fp64 reference's seconds. The references read only the inputs.
::testing::AssertionResult check_forward(const Case& c, fa_impl impl, Space space, uint64_t seed) {
  Problem pr = make_problem(c, seed);
  std::string err = run_impl(pr, impl, space, false);
  if (!err.empty()) return verdict(pr, impl, space, "forward", {"the call failed: " + err});
  Outputs ref, plain;
  try {
    ref = reference_forward(pr);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "case [" << c.name() << "]: " << e.what();
  }
  plain = plain_forward(pr);
  return verdict(pr, impl, space, "forward", judge_forward(pr, ref, plain));
}

// The forward whose O and LSE a backward check starts from: the same implementation, except that the
// Hopper forward and backward take different problems (TMA strides, head dims), so the Hopper backward
// starts from whichever forward the dispatcher picks.
namespace {
fa_impl forward_of(fa_impl impl) { return impl == FA_IMPL_CUDA_SM90 ? FA_IMPL_AUTO : impl; }
}  // namespace

::testing::AssertionResult check_backward(const Case& c, fa_impl impl, Space space, uint64_t seed) {
  Problem pr = make_problem(c, seed);
  std::string err = run_impl(pr, forward_of(impl), space, false);
  if (!err.empty()) return verdict(pr, impl, space, "backward", {"the forward call failed: " + err});
  err = run_impl(pr, impl, space, true);
  if (!err.empty()) return verdict(pr, impl, space, "backward", {"the call failed: " + err});
  Outputs ref, plain;
  try {
    ref = reference_backward(pr);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "case [" << c.name() << "]: " << e.what();
  }
  plain = plain_backward(pr);
  return verdict(pr, impl, space, "backward", judge_backward(pr, ref, plain));
}

::testing::AssertionResult check_backward_deterministic(const Case& c, fa_impl impl, Space space, uint64_t seed) {
  Problem pr = make_problem(c, seed);
  std::string err = run_impl(pr, forward_of(impl), space, false);
  if (!err.empty()) return verdict(pr, impl, space, "deterministic backward", {"the forward call failed: " + err});
  std::vector<std::vector<unsigned char>> first;
  for (int run = 0; run < 2; ++run) {
    pr.dq.poison();
    pr.dk.poison();
    pr.dv.poison();
    err = run_impl(pr, impl, space, true);
    if (!err.empty()) return verdict(pr, impl, space, "deterministic backward", {"the call failed: " + err});
    std::vector<std::vector<unsigned char>> now = {pr.dq.bytes, pr.dk.bytes, pr.dv.bytes};
    if (run == 0) {
      first = now;
      continue;
    }
    const char* names[] = {"dq", "dk", "dv"};
    const HostTensor* tensors[] = {&pr.dq, &pr.dk, &pr.dv};
    for (int t = 0; t < 3; ++t) {
      if (now[size_t(t)] == first[size_t(t)]) continue;
      std::vector<float> a = tensors[t]->get();
      HostTensor prev = *tensors[t];
      prev.bytes = first[size_t(t)];
      std::vector<float> b = prev.get();
      size_t i = 0;
      while (i < a.size() && std::memcmp(&a[i], &b[i], sizeof(float)) == 0) ++i;
      std::ostringstream m;
      m.precision(9);
      m << names[t] << " differs between two runs";
      if (i < a.size()) m << " at " << tensors[t]->index_name(int64_t(i)) << ": " << b[i] << " then " << a[i];
      return verdict(pr, impl, space, "deterministic backward", {m.str()});
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// The standard case lists.

Case make_case(fa_dtype dtype, int batch, int seqlen_q, int seqlen_k, int num_heads, int num_heads_kv, int head_dim) {
  Case c;
  c.dtype = dtype;
  c.batch = batch;
  c.seqlen_q = seqlen_q;
  c.seqlen_k = seqlen_k;
  c.num_heads = num_heads;
  c.num_heads_kv = num_heads_kv;
  c.head_dim = head_dim;
  return c;
}

Case varlen(Case c, std::vector<int> q, std::vector<int> k) {
  c.seqlens_q = std::move(q);
  c.seqlens_k = std::move(k);
  c.batch = int(c.seqlens_q.size());
  c.seqlen_q = *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end());
  c.seqlen_k = *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end());
  return c;
}

namespace {

Case causal(Case c) {
  c.causal = true;
  return c;
}
Case window(Case c, int left, int right) {
  c.window_left = left;
  c.window_right = right;
  return c;
}
Case softcap(Case c, float cap, float scale) {
  c.softcap = cap;
  c.softmax_scale = scale;
  return c;
}
Case strided(Case c, bool bhsd, int padding) {
  c.bhsd = bhsd;
  c.row_padding = padding;
  return c;
}
Case small_blocks(Case c) {  // CPU: a small cache budget, so the tiles do not cover the sequence
  c.cpu_cache_bytes = 16384;
  return c;
}

const int kHeadDims[] = {8, 32, 40, 64, 96, 128, 192, 256};

// The cases within max_head_dim, each name once.
std::vector<Case> keep(const std::vector<Case>& cases, int max_head_dim) {
  std::vector<Case> kept;
  std::set<std::string> names;
  for (const Case& c : cases)
    if (c.head_dim <= max_head_dim && names.insert(c.name()).second) kept.push_back(c);
  return kept;
}

}  // namespace

std::vector<Case> kv_cache_cases(fa_dtype dt) {
  std::vector<Case> v;
  Case c = make_case(dt, 3, 1, 700, 4, 4, 64);
  c.seqused_k = {700, 0, 333};
  v.push_back(c);
  c = make_case(dt, 3, 5, 300, 8, 2, 128);
  c.seqused_k = {3, 300, 129};
  v.push_back(c);
  c.causal = true;
  v.push_back(c);
  c.causal = false, c.window_left = 40, c.window_right = 0;
  v.push_back(c);
  c = make_case(dt, 2, 1, 2000, 16, 2, 64);
  c.seqused_k = {1999, 1000};
  c.num_splits = 4;
  v.push_back(c);
  return v;
}

std::vector<Case> leftpad_kv_cases(fa_dtype dt) {
  std::vector<Case> v;
  Case c = make_case(dt, 3, 1, 700, 4, 4, 64);  // decode; sequence 1 padded to its used end: no key
  c.seqused_k = {700, 40, 333};
  c.leftpad_k = {5, 40, 300};
  v.push_back(c);
  c = make_case(dt, 3, 5, 300, 8, 2, 128);  // GQA causal chunk: the mask aligns to the keys after the padding
  c.seqused_k = {30, 300, 129};
  c.leftpad_k = {27, 1, 64};
  c.causal = true;
  v.push_back(c);
  c.causal = false, c.window_left = 40, c.window_right = 0;
  v.push_back(c);
  c = make_case(dt, 2, 1, 2000, 16, 2, 64);  // split across CTAs
  c.seqused_k = {1999, 1000};
  c.leftpad_k = {999, 17};
  c.num_splits = 4;
  v.push_back(c);
  c = make_case(dt, 2, 3, 400, 2, 2, 80);  // no used lengths: the keys run to seqlen_k; strided layout
  c.leftpad_k = {123, 0};
  c.bhsd = true, c.row_padding = 8;
  v.push_back(c);
  return v;
}

std::vector<Case> paged_kv_cases(fa_dtype dt, const std::vector<int>& page_sizes) {
  std::vector<Case> v;
  for (int page : page_sizes) {
    Case c = make_case(dt, 3, 1, 700, 4, 4, 64);  // decode; one sequence uses no key
    c.page_block_size = page;
    c.seqused_k = {700, 0, 333};
    v.push_back(c);
    c = make_case(dt, 3, 5, 300, 8, 2, 128);  // GQA, causal: rows above the shortest cache's diagonal masked
    c.page_block_size = page;
    c.seqused_k = {3, 300, 129};
    c.causal = true;
    v.push_back(c);
    c = make_case(dt, 2, 1, 2000, 16, 2, 64);  // split across CTAs
    c.page_block_size = page;
    c.seqused_k = {1999, 1000};
    c.num_splits = 4;
    v.push_back(c);
    c = make_case(dt, 2, 129, 777, 2, 1, 96);  // every allocated key used (no seqused_k), windowed
    c.page_block_size = page;
    c.window_left = 200, c.window_right = 10;
    v.push_back(c);
    c = make_case(dt, 2, 3, 400, 2, 2, 80);  // the pool strided: (page, heads, rows, d), padded
    c.page_block_size = page;
    c.seqused_k = {257, 400};
    c.bhsd = true, c.row_padding = 8;
    v.push_back(c);
  }
  return v;
}

std::vector<Case> alibi_cases(fa_dtype dt, bool backward) {
  std::vector<Case> v;
  auto alibi = [](Case c, int mode, float max_slope) {
    c.alibi = mode;
    c.alibi_max_slope = max_slope;
    return c;
  };
  v.push_back(alibi(make_case(dt, 2, 37, 53, 4, 2, 64), 1, 0.5f));        // more keys than queries
  v.push_back(alibi(make_case(dt, 2, 70, 31, 2, 2, 32), 2, 0.25f));       // more queries: rows before the diagonal
  v.push_back(causal(alibi(make_case(dt, 2, 129, 200, 4, 4, 80), 2, 1.f)));
  v.push_back(window(softcap(alibi(make_case(dt, 1, 100, 100, 2, 1, 96), 1, 0.5f), 3.f, 0.5f), 16, 8));
  v.push_back(alibi(make_case(dt, 1, 65, 300, 8, 2, 128), 1, 8.f));      // GQA; the bias dominates
  v.push_back(alibi(varlen(make_case(dt, 3, 1, 1, 2, 1, 64), {5, 64, 1}, {70, 64, 3}), 2, 1.f));
  v.push_back(alibi(make_case(dt, 1, 1, 1, 1, 1, 40), 1, 2.f));           // one key
  if (!backward) {
    Case c = alibi(make_case(dt, 3, 1, 700, 4, 2, 64), 2, 0.05f);        // decode over a KV cache's used keys
    c.seqused_k = {700, 0, 333};
    v.push_back(c);
    c = alibi(make_case(dt, 2, 3, 400, 2, 2, 64), 1, 0.1f);              // left-padded: distances from its own keys
    c.seqused_k = {300, 400};
    c.leftpad_k = {123, 0};
    v.push_back(causal(c));
  }
  return v;
}

std::vector<Case> dropout_cases(fa_dtype dt) {
  std::vector<Case> v;
  auto dropout = [](Case c, float p, uint64_t seed) {
    c.dropout_p = p;
    c.dropout_seed = seed;
    return c;
  };
  v.push_back(dropout(make_case(dt, 2, 37, 53, 4, 2, 64), 0.1f, 1));
  v.push_back(causal(dropout(make_case(dt, 1, 129, 200, 2, 1, 32), 0.5f, 0xfedcba9876543210ull)));
  v.push_back(dropout(make_case(dt, 1, 70, 31, 2, 2, 40), 0.9f, 7));  // more queries than keys, most dropped
  v.push_back(window(softcap(dropout(varlen(make_case(dt, 1, 1, 1, 2, 1, 64), {5, 64, 1, 0}, {70, 64, 3, 9}), 0.3f, 3),
                             3.f, 0.5f), 16, 8));
  Case a = dropout(make_case(dt, 2, 65, 90, 4, 4, 96), 0.2f, 11);
  a.alibi = 1, a.alibi_max_slope = 0.5f;
  v.push_back(causal(a));
  return v;
}

std::vector<Case> standard_forward_cases(fa_dtype dt, int max_head_dim) {
  std::vector<Case> v;
  // Every head dim, square and not, causal and not.
  for (int d : kHeadDims) {
    v.push_back(make_case(dt, 2, 128, 128, 2, 2, d));
    v.push_back(causal(make_case(dt, 1, 129, 127, 2, 2, d)));
    v.push_back(small_blocks(causal(make_case(dt, 1, 17, 200, 1, 1, d))));
  }
  // Every seqlen of the list, causal and not; 1000 for a few head dims.
  for (int n : {1, 2, 17, 127, 128, 129}) {
    v.push_back(make_case(dt, 2, n, n, 2, 2, 64));
    v.push_back(small_blocks(causal(make_case(dt, 1, n, n, 3, 3, 64))));
  }
  v.push_back(make_case(dt, 1, 1000, 1000, 1, 1, 64));
  v.push_back(small_blocks(causal(make_case(dt, 1, 1000, 1000, 1, 1, 128))));
  v.push_back(causal(make_case(dt, 1, 1000, 1000, 1, 1, 32)));
  // seqlen_q < seqlen_k (decode-like) and > seqlen_k (causal rows above the diagonal fully masked).
  v.push_back(causal(make_case(dt, 2, 1, 1000, 4, 4, 64)));
  v.push_back(small_blocks(causal(make_case(dt, 1, 128, 1000, 2, 2, 64))));
  v.push_back(small_blocks(causal(make_case(dt, 1, 1000, 128, 1, 1, 64))));
  v.push_back(causal(make_case(dt, 3, 2, 17, 2, 2, 64)));
  v.push_back(causal(make_case(dt, 3, 17, 2, 2, 2, 64)));
  v.push_back(make_case(dt, 2, 129, 1, 2, 2, 64));
  // Every mask option alone and combined, with seqlen_q shorter and longer than seqlen_k.
  for (auto [sq, sk] : {std::pair{127, 200}, std::pair{200, 127}}) {
    Case c = small_blocks(make_case(dt, 1, sq, sk, 2, 2, 64));
    v.push_back(causal(c));
    v.push_back(window(c, 32, -1));
    v.push_back(window(c, -1, 16));
    v.push_back(window(c, 32, 16));
    v.push_back(window(c, 0, 0));
    v.push_back(causal(window(c, 32, -1)));
    v.push_back(causal(window(c, 16, 8)));
    v.push_back(softcap(c, 3.f, 0.5f));
    v.push_back(causal(softcap(c, 3.f, 0.5f)));
    v.push_back(window(softcap(c, 3.f, 0.5f), 8, 8));
    v.push_back(causal(window(softcap(c, 3.f, 0.5f), 24, -1)));
    v.push_back(softcap(c, 0.f, 0.3f));
  }
  // GQA 8:1 and MQA.
  v.push_back(causal(make_case(dt, 1, 129, 129, 16, 2, 64)));
  v.push_back(small_blocks(make_case(dt, 2, 65, 190, 8, 1, 128)));
  v.push_back(window(causal(make_case(dt, 1, 200, 127, 4, 1, 64)), 16, -1));
  v.push_back(make_case(dt, 1, 77, 77, 4, 2, 96));
  // Varlen batches with zero-length sequences (q, k or both).
  Case vl = small_blocks(make_case(dt, 1, 1, 1, 2, 2, 64));
  v.push_back(varlen(vl, {5, 0, 129, 17, 0}, {7, 13, 129, 0, 0}));
  v.push_back(causal(varlen(vl, {5, 0, 129, 17, 0}, {7, 13, 129, 0, 0})));
  v.push_back(window(softcap(varlen(vl, {64, 3, 1}, {200, 3, 70}), 3.f, 0.5f), 16, 4));
  v.push_back(causal(varlen(make_case(dt, 1, 1, 1, 8, 2, 128), {1, 0, 64, 200}, {300, 5, 64, 1})));
  v.push_back(varlen(make_case(dt, 1, 1, 1, 2, 1, 32), {3, 4}, {0, 0}));
  // Strided views: BHSD and padded rows, alone and with varlen.
  v.push_back(causal(strided(make_case(dt, 2, 127, 129, 4, 2, 64), true, 0)));
  v.push_back(strided(make_case(dt, 2, 65, 67, 2, 2, 40), false, 8));
  v.push_back(causal(strided(make_case(dt, 1, 70, 70, 2, 1, 128), true, 3)));
  v.push_back(causal(strided(varlen(vl, {5, 0, 33}, {7, 9, 40}), true, 3)));
  v.push_back(window(strided(varlen(vl, {31, 2}, {0, 45}), false, 5), 8, 8));

  return keep(v, max_head_dim);
}

std::vector<Case> standard_backward_cases(fa_dtype dt, int max_head_dim) {
  std::vector<Case> v;
  for (int d : kHeadDims) {
    v.push_back(make_case(dt, 1, 65, 65, 2, 2, d));
    v.push_back(small_blocks(causal(make_case(dt, 1, 33, 47, 1, 1, d))));
  }
  for (int n : {1, 2, 17, 127, 128, 129}) {
    v.push_back(make_case(dt, 1, n, n, 2, 2, 64));
    v.push_back(small_blocks(causal(make_case(dt, 2, n, n, 1, 1, 64))));
  }
  v.push_back(small_blocks(causal(make_case(dt, 1, 1000, 1000, 1, 1, 64))));
  v.push_back(small_blocks(causal(make_case(dt, 1, 17, 129, 2, 2, 64))));
  v.push_back(small_blocks(causal(make_case(dt, 1, 129, 17, 2, 2, 64))));
  v.push_back(causal(make_case(dt, 2, 1, 300, 2, 2, 64)));
  for (auto [sq, sk] : {std::pair{57, 91}, std::pair{91, 57}}) {
    Case c = small_blocks(make_case(dt, 1, sq, sk, 2, 2, 64));
    v.push_back(causal(c));
    v.push_back(window(c, 16, -1));
    v.push_back(window(c, -1, 8));
    v.push_back(window(c, 16, 8));
    v.push_back(causal(window(c, 16, -1)));
    v.push_back(softcap(c, 3.f, 0.5f));
    v.push_back(causal(softcap(c, 3.f, 0.5f)));
    v.push_back(causal(window(softcap(c, 3.f, 0.5f), 8, 8)));
  }
  v.push_back(causal(make_case(dt, 1, 64, 64, 8, 1, 64)));
  v.push_back(small_blocks(make_case(dt, 1, 33, 80, 16, 2, 64)));
  v.push_back(window(make_case(dt, 1, 50, 50, 4, 2, 96), 8, 8));
  Case vl = small_blocks(make_case(dt, 1, 1, 1, 2, 2, 64));
  v.push_back(varlen(vl, {5, 0, 65, 17, 0}, {7, 13, 65, 0, 0}));
  v.push_back(causal(varlen(vl, {5, 0, 65, 17, 0}, {7, 13, 65, 0, 0})));
  v.push_back(window(causal(varlen(make_case(dt, 1, 1, 1, 4, 2, 64), {30, 1, 0}, {50, 4, 3})), 8, -1));
  v.push_back(causal(strided(make_case(dt, 2, 45, 53, 4, 2, 64), true, 0)));
  v.push_back(strided(make_case(dt, 1, 33, 35, 2, 2, 40), false, 8));
  v.push_back(causal(strided(varlen(vl, {5, 0, 33}, {7, 9, 40}), true, 3)));

  return keep(v, max_head_dim);
}

}  // namespace fa_test
