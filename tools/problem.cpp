#include "problem.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "dtype.hpp"
#include "io_model.hpp"

namespace fa_cli {

void add_param_flags(CLI::App* app, ProblemSpec& s) {
  app->add_option("--dtype", s.dtype, "fp32 | fp16 | bf16 (default: fp32 on the CPU, fp16 on the GPU)");
  app->add_flag("--causal,!--no-causal", s.causal, "causal mask, bottom-right aligned (default on)");
  app->add_option("--window-left", s.window_left, "sliding window: keys visible to the left of the diagonal (-1: unbounded)")
      ->capture_default_str();
  app->add_option("--window-right", s.window_right, "sliding window: keys visible to the right of the diagonal (-1: unbounded)")
      ->capture_default_str();
  app->add_option("--softcap", s.softcap, "tanh soft-capping of scores, s = c tanh(s / c) (0: off)")->capture_default_str();
  app->add_flag("--alibi", s.alibi,
                "ALiBi: scores get -slope_h |i + seqlen_k - seqlen_q - j|, slope_h = 2^(-8 (h + 1) / heads) (Press et al.)");
  app->add_option("--dropout", s.dropout, "dropout probability of the attention weights, in [0, 1) (0: off)")
      ->capture_default_str();
  app->add_option("--dropout-seed", s.dropout_seed, "dropout's seed (the mask: src/common/dropout.hpp)")->capture_default_str();
  app->add_option("--scale", s.scale, "softmax scale (0: 1/sqrt(head_dim))")->capture_default_str();
  app->add_option("--threads", s.threads, "CPU threads (0: every core)")->capture_default_str();
  app->add_option("--cache-bytes", s.cache_bytes,
                  "CPU on-chip budget M in bytes that sets the block sizes (K/M suffixes; 0: the L2 size)")
      ->capture_default_str();
  app->add_flag("--deterministic", s.deterministic, "backward: bit-identical gradients run to run");
  app->add_option("--splits", s.splits, "CUDA split-KV forward: 0 = heuristic, 1 = off")->capture_default_str();
  app->add_option("--layout", s.layout, "memory layout of q/k/v/o: bshd ((batch, seqlen, heads, head_dim)) | bhsd")
      ->capture_default_str();
  app->add_option("--varlen", s.varlen_q, "variable length: comma-separated query lengths, one per sequence (sets batch)")
      ->delimiter(',');
  app->add_option("--varlen-k", s.varlen_k, "variable length: key lengths (default: the --varlen lengths)")->delimiter(',');
  app->add_option("--seed", s.seed, "seed of the random inputs")->capture_default_str();
}

fa_dtype parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return FA_FLOAT32;
  if (name == "fp16" || name == "float16") return FA_FLOAT16;
  if (name == "bf16" || name == "bfloat16") return FA_BFLOAT16;
  throw UsageError("--dtype: unknown dtype '" + name + "' (use fp32, fp16 or bf16)");
}

int64_t parse_bytes(const std::string& text, const char* flag) {
  size_t pos = 0;
  long double v = 0;
  try {
    v = std::stold(text, &pos);
  } catch (...) {
    throw UsageError(std::string(flag) + ": not a size in bytes: '" + text + "'");
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  long double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mult = 1024;
  else if (unit == "m" || unit == "mb" || unit == "mib") mult = 1024.0L * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") mult = 1024.0L * 1024 * 1024;
  else throw UsageError(std::string(flag) + ": unknown unit '" + unit + "' in '" + text + "' (use K, M or G)");
  if (v < 0) throw UsageError(std::string(flag) + " must be >= 0 (got " + text + ")");
  return int64_t(v * mult);
}

namespace {
void require(bool ok, const std::string& msg) {
  if (!ok) throw UsageError(msg);
}
}  // namespace

fa_params make_params(const ProblemSpec& s, fa_dtype dtype) {
  fa_params p;
  fa_params_init(&p);
  const bool varlen = !s.varlen_q.empty() || !s.varlen_k.empty();
  require(!(s.varlen_q.empty() && varlen), "--varlen-k needs --varlen (the query lengths)");
  const std::vector<int>& lk = s.varlen_k.empty() ? s.varlen_q : s.varlen_k;
  if (varlen) {
    require(lk.size() == s.varlen_q.size(), "--varlen-k: needs one length per sequence, as many as --varlen");
    for (int l : s.varlen_q) require(l >= 0, "--varlen: lengths must be >= 0");
    for (int l : lk) require(l >= 0, "--varlen-k: lengths must be >= 0");
    require(s.layout == "bshd", "--layout: varlen tensors are packed (total, heads, head_dim); use bshd");
    p.batch = int(s.varlen_q.size());
    p.seqlen_q = *std::max_element(s.varlen_q.begin(), s.varlen_q.end());
    p.seqlen_k = *std::max_element(lk.begin(), lk.end());
    for (int l : s.varlen_q) p.total_q += l;
    for (int l : lk) p.total_k += l;
  } else {
    require(s.batch >= 1, "--batch must be >= 1 (got " + std::to_string(s.batch) + ")");
    require(s.seqlen_q >= 1, "--seqlen-q must be >= 1 (got " + std::to_string(s.seqlen_q) + ")");
    require(s.seqlen_k >= 0, "--seqlen-k must be >= 0 (got " + std::to_string(s.seqlen_k) + ")");
    p.batch = s.batch;
    p.seqlen_q = s.seqlen_q;
    p.seqlen_k = s.seqlen_k;
  }
  require(s.heads >= 1, "--heads must be >= 1 (got " + std::to_string(s.heads) + ")");
  const int hkv = s.heads_kv == 0 ? s.heads : s.heads_kv;
  require(hkv >= 1, "--heads-kv must be >= 1 (got " + std::to_string(s.heads_kv) + ")");
  require(s.heads % hkv == 0,
          "--heads-kv: --heads (" + std::to_string(s.heads) + ") must be a multiple of --heads-kv (" + std::to_string(hkv) + ")");
  require(s.head_dim >= 1 && s.head_dim <= 1024, "--head-dim must be in 1..1024 (got " + std::to_string(s.head_dim) + ")");
  require(s.window_left >= -1, "--window-left must be >= -1 (got " + std::to_string(s.window_left) + ")");
  require(s.window_right >= -1, "--window-right must be >= -1 (got " + std::to_string(s.window_right) + ")");
  require(std::isfinite(s.softcap) && s.softcap >= 0, "--softcap must be finite and >= 0");
  require(std::isfinite(s.scale), "--scale must be finite");
  require(s.threads >= 0, "--threads must be >= 0 (got " + std::to_string(s.threads) + ")");
  require(s.splits >= 0, "--splits must be >= 0 (got " + std::to_string(s.splits) + ")");
  require(s.layout == "bshd" || s.layout == "bhsd", "--layout: unknown layout '" + s.layout + "' (use bshd or bhsd)");
  p.num_heads = s.heads;
  p.num_heads_kv = hkv;
  p.head_dim = s.head_dim;
  p.dtype = dtype;
  p.softmax_scale = s.scale;
  p.causal = s.causal ? 1 : 0;
  p.window_left = s.window_left;
  p.window_right = s.window_right;
  p.softcap = s.softcap;
  p.dropout_p = s.dropout, p.dropout_seed = s.dropout_seed;
  p.deterministic = s.deterministic ? 1 : 0;
  p.num_threads = s.threads;
  p.cpu_cache_bytes = parse_bytes(s.cache_bytes, "--cache-bytes");
  p.num_splits = s.splits;

  if (varlen || s.layout == "bshd") {
    fa_params_set_contiguous_strides(&p);
    if (varlen) {  // packed: the batch axis is folded into the rows
      p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;
      p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = 0;
    }
  } else {  // bhsd: (batch, heads, seqlen, head_dim) in memory, the same logical tensor
    const int64_t d = p.head_dim, h = p.num_heads, hk = p.num_heads_kv, sq = p.seqlen_q, sk = p.seqlen_k;
    auto set = [&](int64_t& bs, int64_t& rs, int64_t& hs, int64_t rows, int64_t heads) {
      bs = heads * rows * d;
      hs = rows * d;
      rs = d;
    };
    set(p.q_batch_stride, p.q_row_stride, p.q_head_stride, sq, h);
    set(p.o_batch_stride, p.o_row_stride, p.o_head_stride, sq, h);
    set(p.do_batch_stride, p.do_row_stride, p.do_head_stride, sq, h);
    set(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, sq, h);
    set(p.k_batch_stride, p.k_row_stride, p.k_head_stride, sk, hk);
    set(p.v_batch_stride, p.v_row_stride, p.v_head_stride, sk, hk);
    set(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, sk, hk);
    set(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, sk, hk);
  }
  return p;
}

int64_t q_elements(const fa_params& p) {
  const int64_t rows = p.cu_seqlens_q || p.total_q ? p.total_q : int64_t(p.batch) * p.seqlen_q;
  return rows * p.num_heads * p.head_dim;
}
int64_t k_elements(const fa_params& p) {
  const int64_t rows = p.cu_seqlens_q || p.total_q ? p.total_k : int64_t(p.batch) * p.seqlen_k;
  return rows * p.num_heads_kv * p.head_dim;
}

namespace {

bool spec_varlen(const fa_params& p) { return p.total_q != 0 || p.total_k != 0 || p.cu_seqlens_q; }

// Approximately N(0, 1): the centred sum of four uniforms (variance 4/12, scaled by sqrt 3),
// from a splitmix64 stream; fast enough for tens of millions of elements.
void fill_random(std::vector<float>& x, uint64_t seed, fa_dtype d) {
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (auto& v : x) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float s = 0;
    for (int i = 0; i < 4; ++i) s += float((z >> (16 * i)) & 0xffffu) * (1.0f / 65536.0f);
    v = round_to((s - 2.0f) * 1.7320508f, d);
  }
}

Buffer upload_as(Device dev, const std::vector<float>& x, fa_dtype d) {
  Buffer b(dev, x.size() * dtype_bytes(d));
  std::vector<unsigned char> raw(b.bytes());
  encode(x.data(), int64_t(x.size()), d, raw.data());
  b.upload(raw.data(), raw.size());
  return b;
}

}  // namespace

Tensors::Tensors(Device device, const fa_params& shape, const ProblemSpec& s, bool backward) : dev(device), p(shape) {
  const bool varlen = spec_varlen(shape);
  const int64_t nq = q_elements(p), nk = k_elements(p);
  const size_t es = dtype_bytes(p.dtype);
  host_q.resize(size_t(nq));
  host_k.resize(size_t(nk));
  host_v.resize(size_t(nk));
  fill_random(host_q, s.seed * 4 + 1, p.dtype);
  fill_random(host_k, s.seed * 4 + 2, p.dtype);
  fill_random(host_v, s.seed * 4 + 3, p.dtype);
  q = upload_as(dev, host_q, p.dtype);
  k = upload_as(dev, host_k, p.dtype);
  v = upload_as(dev, host_v, p.dtype);
  o = Buffer(dev, size_t(nq) * es);
  lse = Buffer(dev, size_t(lse_elements()) * 4);
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.o = o.data();
  p.lse = static_cast<float*>(lse.data());
  if (backward) {
    host_dout.resize(size_t(nq));
    fill_random(host_dout, s.seed * 4 + 4, p.dtype);
    dout = upload_as(dev, host_dout, p.dtype);
    dq = Buffer(dev, size_t(nq) * es);
    dk = Buffer(dev, size_t(nk) * es);
    dv = Buffer(dev, size_t(nk) * es);
    p.dout = dout.data();
    p.dq = dq.data();
    p.dk = dk.data();
    p.dv = dv.data();
  }
  if (varlen) {
    const std::vector<int>& lk = s.varlen_k.empty() ? s.varlen_q : s.varlen_k;
    host_cu_q.assign(1, 0);
    host_cu_k.assign(1, 0);
    for (size_t b = 0; b < s.varlen_q.size(); ++b) {
      host_cu_q.push_back(host_cu_q.back() + s.varlen_q[b]);
      host_cu_k.push_back(host_cu_k.back() + lk[b]);
    }
    cu_q = Buffer(dev, host_cu_q.size() * 4);
    cu_k = Buffer(dev, host_cu_k.size() * 4);
    cu_q.upload(host_cu_q.data(), cu_q.bytes());
    cu_k.upload(host_cu_k.data(), cu_k.bytes());
    p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.data());
    p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.data());
  }
  if (s.alibi) {  // the same slopes for every sequence (batch stride 0)
    host_alibi.resize(size_t(p.num_heads));
    for (int h = 0; h < p.num_heads; ++h) host_alibi[size_t(h)] = std::exp2(-8.f * float(h + 1) / float(p.num_heads));
    alibi = Buffer(dev, host_alibi.size() * 4);
    alibi.upload(host_alibi.data(), alibi.bytes());
    p.alibi_slopes = static_cast<const float*>(alibi.data());
  }
  poison_outputs();
}

int64_t Tensors::lse_elements() const {
  return spec_varlen(p) ? int64_t(p.num_heads) * p.total_q : int64_t(p.batch) * p.num_heads * p.seqlen_q;
}

void Tensors::poison_outputs() {
  for (Buffer* b : {&o, &lse, &dq, &dk, &dv}) b->fill_bytes(0xff);  // 0xff..: NaN in fp32, fp16 and bf16
}

std::vector<float> Tensors::download(const Buffer& b) const {
  std::vector<unsigned char> raw(b.bytes());
  b.download(raw.data(), raw.size());
  std::vector<float> out(raw.size() / dtype_bytes(p.dtype));
  decode(raw.data(), int64_t(out.size()), p.dtype, out.data());
  return out;
}

std::vector<float> Tensors::download_o() const { return download(o); }

std::vector<float> Tensors::download_lse() const {
  std::vector<float> out(static_cast<size_t>(lse_elements()));
  lse.download(out.data(), out.size() * 4);
  return out;
}

fa_params reference_params(const Tensors& t, std::vector<float>& o_ref, std::vector<float>& lse_ref, int batch) {
  fa_params r = t.p;
  r.dtype = FA_FLOAT32;
  r.q = t.host_q.data();
  r.k = t.host_k.data();
  r.v = t.host_v.data();
  o_ref.assign(t.host_q.size(), std::numeric_limits<float>::quiet_NaN());
  lse_ref.assign(size_t(t.lse_elements()), std::numeric_limits<float>::quiet_NaN());
  r.o = o_ref.data();
  r.lse = lse_ref.data();
  r.dout = r.dq = r.dk = r.dv = nullptr;
  r.workspace = nullptr;
  r.workspace_bytes = 0;
  r.stream = nullptr;
  if (t.p.alibi_slopes) r.alibi_slopes = t.host_alibi.data();
  if (spec_varlen(t.p)) {
    r.cu_seqlens_q = t.host_cu_q.data();
    r.cu_seqlens_k = t.host_cu_k.data();
  } else {
    r.batch = batch;
  }
  return r;
}

namespace {
Diff compare_rows(const fa_params& p, const std::vector<float>& a, const std::vector<float>& b, int batch, bool k_side) {
  const bool varlen = spec_varlen(p);
  const int64_t nb = varlen ? 1 : batch;
  const int64_t rows = k_side ? (varlen ? p.total_k : p.seqlen_k) : (varlen ? p.total_q : p.seqlen_q);
  const int64_t heads = k_side ? p.num_heads_kv : p.num_heads;
  const int64_t bs = k_side ? p.dk_batch_stride : p.o_batch_stride, rs = k_side ? p.dk_row_stride : p.o_row_stride;
  const int64_t hs = k_side ? p.dk_head_stride : p.o_head_stride;
  Diff d;
  for (int64_t bi = 0; bi < nb; ++bi)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t off = bi * bs + r * rs + h * hs;
        for (int64_t c = 0; c < p.head_dim; ++c) {
          const float x = a[size_t(off + c)], y = b[size_t(off + c)];
          if (!std::isfinite(x)) {
            ++d.non_finite;
            continue;
          }
          d.max_abs = std::max(d.max_abs, double(std::fabs(x - y)));
        }
      }
  return d;
}
}  // namespace

fa_params reference_backward_params(const Tensors& t, std::vector<float>& o_ref, std::vector<float>& lse_ref,
                                    std::vector<float>& dq_ref, std::vector<float>& dk_ref, std::vector<float>& dv_ref,
                                    int batch) {
  fa_params r = t.p;
  r.dtype = FA_FLOAT32;
  r.q = t.host_q.data();
  r.k = t.host_k.data();
  r.v = t.host_v.data();
  r.o = o_ref.data();
  r.lse = lse_ref.data();
  r.dout = t.host_dout.data();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  dq_ref.assign(t.host_q.size(), nan);
  dk_ref.assign(t.host_k.size(), nan);
  dv_ref.assign(t.host_v.size(), nan);
  r.dq = dq_ref.data();
  r.dk = dk_ref.data();
  r.dv = dv_ref.data();
  r.workspace = nullptr;
  r.workspace_bytes = 0;
  r.stream = nullptr;
  if (t.p.alibi_slopes) r.alibi_slopes = t.host_alibi.data();
  if (spec_varlen(t.p)) {
    r.cu_seqlens_q = t.host_cu_q.data();
    r.cu_seqlens_k = t.host_cu_k.data();
  } else {
    r.batch = batch;
  }
  return r;
}

Diff compare_o(const fa_params& p, const std::vector<float>& a, const std::vector<float>& b, int batch) {
  return compare_rows(p, a, b, batch, false);
}
Diff compare_k_side(const fa_params& p, const std::vector<float>& a, const std::vector<float>& b, int batch) {
  return compare_rows(p, a, b, batch, true);
}

Diff compare_lse(const fa_params& p, const std::vector<float>& a, const std::vector<float>& b, int batch) {
  const int64_t n = spec_varlen(p) ? int64_t(p.num_heads) * p.total_q : int64_t(batch) * p.num_heads * p.seqlen_q;
  Diff d;
  for (int64_t i = 0; i < n; ++i) {
    const float x = a[size_t(i)], y = b[size_t(i)];
    if (std::isinf(y) && y < 0) {  // a fully masked row: lse must be -inf too
      if (!(std::isinf(x) && x < 0)) ++d.non_finite;
      continue;
    }
    if (!std::isfinite(x)) {
      ++d.non_finite;
      continue;
    }
    d.max_abs = std::max(d.max_abs, double(std::fabs(x - y)));
  }
  return d;
}

double forward_flops(const fa_params& p, const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k) {
  auto one = [&](int64_t sq, int64_t sk) {
    IoProblem io;
    io.seqlen_q = sq;
    io.seqlen_k = sk;
    io.head_dim = p.head_dim;
    io.causal = p.causal != 0;
    io.window_left = p.window_left;
    io.window_right = p.window_right;
    const bool halve = io.causal && p.window_left < 0;
    const double pairs = halve ? 0.5 * double(sq) * double(sk) : visible_pairs(io);
    return 4.0 * double(p.head_dim) * pairs * p.num_heads;
  };
  if (cu_q.empty()) return one(p.seqlen_q, p.seqlen_k) * p.batch;
  double f = 0;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) f += one(cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]);
  return f;
}

const char* layout_note(const ProblemSpec& s) {
  if (!s.varlen_q.empty()) return "packed varlen (total, heads, head_dim)";
  return s.layout == "bhsd" ? "bhsd (heads outer)" : "bshd (contiguous)";
}

}  // namespace fa_cli
