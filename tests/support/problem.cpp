// Host tensors, random problems and the oracle runs of the harness.
#include "support/problem.hpp"

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>

#include "common/dtype.hpp"

namespace fa_test {

void HostTensor::poison() { std::fill(bytes.begin(), bytes.end(), 0xFF); }

void HostTensor::set(const std::vector<float>& values) {
  int64_t i = 0;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        int64_t off = offset(b, r, h);
        for (int64_t c = 0; c < dim; ++c) flashattn::store_element(bytes.data(), off + c, values[size_t(i++)], dtype);
      }
}

std::vector<float> HostTensor::get() const {
  std::vector<float> values(static_cast<size_t>(count()));
  int64_t i = 0;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        int64_t off = offset(b, r, h);
        for (int64_t c = 0; c < dim; ++c) values[size_t(i++)] = flashattn::load_element(bytes.data(), off + c, dtype);
      }
  return values;
}

bool HostTensor::outside_view_untouched() const {
  std::vector<char> in_view(bytes.size(), 0);
  const size_t es = element_size();
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        size_t begin = size_t(offset(b, r, h)) * es;
        std::fill(in_view.begin() + begin, in_view.begin() + begin + size_t(dim) * es, 1);
      }
  for (size_t i = 0; i < bytes.size(); ++i)
    if (!in_view[i] && bytes[i] != 0xFF) return false;
  return true;
}

std::string HostTensor::index_name(int64_t logical) const {
  int64_t c = logical % dim, rest = logical / dim;
  int64_t h = rest % heads;
  rest /= heads;
  int64_t r = rest % rows, b = rest / rows;
  return "(b " + std::to_string(b) + ", row " + std::to_string(r) + ", head " + std::to_string(h) + ", col " +
         std::to_string(c) + ")";
}

HostTensor make_tensor(fa_dtype dtype, int64_t nb, int64_t rows, int64_t heads, int64_t dim, bool bhsd, int padding) {
  HostTensor t;
  t.dtype = dtype;
  t.nb = nb;
  t.rows = rows;
  t.heads = heads;
  t.dim = dim;
  if (bhsd) {
    t.row_stride = dim + padding;
    t.head_stride = rows * t.row_stride + padding;
    t.batch_stride = heads * t.head_stride + padding;
  } else {
    t.head_stride = dim + padding;
    t.row_stride = heads * t.head_stride + padding;
    t.batch_stride = rows * t.row_stride + padding;
  }
  int64_t elements = t.count() == 0 ? 0 : nb * t.batch_stride + padding;
  t.bytes.assign(size_t(elements) * t.element_size(), 0xFF);
  return t;
}

SeqRange Problem::seq(int b) const {
  SeqRange s;
  if (varlen) {
    s.q_start = cu_q[size_t(b)];
    s.k_start = cu_k[size_t(b)];
    s.seqlen_q = cu_q[size_t(b) + 1] - cu_q[size_t(b)];
    s.seqlen_k = cu_k[size_t(b) + 1] - cu_k[size_t(b)];
  } else {
    s.bq = s.bk = b;
    s.seqlen_q = c.seqlen_q;
    s.seqlen_k = used_k.empty() ? c.seqlen_k : used_k[size_t(b)];
    if (!leftpad_k.empty()) {  // the keys start past the padding
      s.k_start = leftpad_k[size_t(b)];
      s.seqlen_k -= leftpad_k[size_t(b)];
    }
  }
  return s;
}

fa_params Problem::params() {
  fa_params p;
  fa_params_init(&p);
  auto strides = [](const HostTensor& t, int64_t& bs, int64_t& rs, int64_t& hs) {
    bs = t.batch_stride;
    rs = t.row_stride;
    hs = t.head_stride;
  };
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.o = o.data();
  p.lse = lse.empty() ? nullptr : lse.data();
  p.dout = dout.data();
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  strides(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  strides(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  strides(o, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  strides(dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  strides(dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  strides(dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  strides(dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.batch = varlen ? int32_t(cu_q.size() - 1) : c.batch;
  p.seqlen_q = max_seqlen_q;
  p.seqlen_k = max_seqlen_k;
  p.num_heads = c.num_heads;
  p.num_heads_kv = c.num_heads_kv;
  p.head_dim = c.head_dim;
  if (varlen) {
    p.cu_seqlens_q = cu_q.data();
    p.cu_seqlens_k = cu_k.data();
    p.total_q = rows_q;
    p.total_k = rows_k;
  }
  p.seqused_k = used_k.empty() ? nullptr : used_k.data();
  p.leftpad_k = leftpad_k.empty() ? nullptr : leftpad_k.data();
  if (!alibi_slopes.empty()) {
    p.alibi_slopes = alibi_slopes.data();
    p.alibi_slopes_batch_stride = alibi_batch_stride;
  }
  p.dropout_p = c.dropout_p, p.dropout_seed = c.dropout_seed, p.dropout_offset = kDropoutOffset;
  if (!block_table.empty()) {
    p.block_table = block_table.data();
    p.block_table_batch_stride = table_stride;
    p.page_block_size = c.page_block_size;
    p.num_pages = num_pages;
  }
  p.dtype = c.dtype;
  p.softmax_scale = c.softmax_scale;
  p.causal = c.causal ? 1 : 0;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  p.deterministic = c.deterministic ? 1 : 0;
  p.num_threads = c.num_threads;
  p.cpu_cache_bytes = c.cpu_cache_bytes;
  p.num_splits = c.num_splits;
  return p;
}

uint64_t fresh_seed(const std::string& name) {
  if (const char* env = std::getenv("FA_TEST_SEED")) return std::strtoull(env, nullptr, 0);
  static std::random_device device;
  uint64_t s = (uint64_t(device()) << 32) ^ device();
  return s ^ std::hash<std::string>{}(name);
}

namespace {

// k and v as a paged cache: the sequences' pages in a shuffled pool with two spare pages, the
// pool's unassigned rows NaN, and a table whose entries past the used keys are -1 (never read).
void page_kv(Problem& pr, std::mt19937_64& rng) {
  const int page = pr.c.page_block_size, hk = pr.c.num_heads_kv, d = pr.c.head_dim;
  if (pr.varlen) throw std::invalid_argument("Case: a paged KV cache needs a padded batch");
  const int64_t pages_per_seq = (pr.rows_k + page - 1) / page;
  pr.table_stride = pages_per_seq + 1;  // a spare column, -1
  pr.num_pages = int(pr.nb * pages_per_seq + 2);
  std::vector<int32_t> order(size_t(pr.num_pages));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::shuffle(order.begin(), order.end(), rng);
  pr.block_table.assign(size_t(pr.nb * pr.table_stride), -1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> kpool(size_t(pr.num_pages) * page * hk * d, nan), vpool(kpool.size(), nan);
  for (int64_t b = 0; b < pr.nb; ++b) {
    const int64_t used = pr.used_k.empty() ? pr.rows_k : pr.used_k[size_t(b)];
    for (int64_t i = 0; i * page < used; ++i) {
      const int32_t pg = order[size_t(b * pages_per_seq + i)];
      pr.block_table[size_t(b * pr.table_stride + i)] = pg;
      for (int64_t r = 0; r < page && i * page + r < pr.rows_k; ++r) {
        const size_t from = size_t((b * pr.rows_k + i * page + r) * hk * d), to = size_t((int64_t(pg) * page + r) * hk * d);
        std::copy_n(&pr.kf[from], hk * d, &kpool[to]);
        std::copy_n(&pr.vf[from], hk * d, &vpool[to]);
      }
    }
  }
  pr.k = make_tensor(pr.c.dtype, pr.num_pages, page, hk, d, pr.c.bhsd, pr.c.row_padding);
  pr.v = make_tensor(pr.c.dtype, pr.num_pages, page, hk, d, pr.c.bhsd, pr.c.row_padding);
  pr.k.set(kpool);
  pr.v.set(vpool);
}

}  // namespace

Problem make_problem(const Case& c, uint64_t seed) {
  Problem pr;
  pr.c = c;
  pr.seed = seed != 0 ? seed : fresh_seed(c.name());
  pr.varlen = !c.seqlens_q.empty();
  if (pr.varlen) {
    if (c.seqlens_k.size() != c.seqlens_q.size()) throw std::invalid_argument("Case: seqlens_q and seqlens_k differ in size");
    pr.cu_q.assign(1, 0);
    pr.cu_k.assign(1, 0);
    for (size_t b = 0; b < c.seqlens_q.size(); ++b) {
      pr.cu_q.push_back(pr.cu_q.back() + c.seqlens_q[b]);
      pr.cu_k.push_back(pr.cu_k.back() + c.seqlens_k[b]);
      pr.max_seqlen_q = std::max(pr.max_seqlen_q, c.seqlens_q[b]);
      pr.max_seqlen_k = std::max(pr.max_seqlen_k, c.seqlens_k[b]);
    }
    pr.nb = 1;
    pr.rows_q = pr.cu_q.back();
    pr.rows_k = pr.cu_k.back();
  } else {
    pr.nb = c.batch;
    pr.rows_q = pr.max_seqlen_q = c.seqlen_q;
    pr.rows_k = pr.max_seqlen_k = c.seqlen_k;
  }
  pr.scale = c.softmax_scale != 0.f ? c.softmax_scale : 1.f / std::sqrt(float(c.head_dim));
  const int h = c.num_heads, hk = c.num_heads_kv, d = c.head_dim, pad = c.row_padding;
  const fa_dtype dt = c.dtype;
  pr.q = make_tensor(dt, pr.nb, pr.rows_q, h, d, c.bhsd, pad);
  pr.o = make_tensor(dt, pr.nb, pr.rows_q, h, d, c.bhsd, pad);
  pr.dout = make_tensor(dt, pr.nb, pr.rows_q, h, d, c.bhsd, pad);
  pr.dq = make_tensor(dt, pr.nb, pr.rows_q, h, d, c.bhsd, pad);
  pr.k = make_tensor(dt, pr.nb, pr.rows_k, hk, d, c.bhsd, pad);
  pr.v = make_tensor(dt, pr.nb, pr.rows_k, hk, d, c.bhsd, pad);
  pr.dk = make_tensor(dt, pr.nb, pr.rows_k, hk, d, c.bhsd, pad);
  pr.dv = make_tensor(dt, pr.nb, pr.rows_k, hk, d, c.bhsd, pad);
  pr.lse.assign(size_t(pr.nb * h * pr.rows_q), std::numeric_limits<float>::quiet_NaN());

  std::mt19937_64 rng(pr.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](HostTensor& t, std::vector<float>& logical) {
    logical.resize(size_t(t.count()));
    for (float& x : logical) x = flashattn::round_to(normal(rng), dt);
    t.set(logical);
  };
  fill(pr.q, pr.qf);
  fill(pr.k, pr.kf);
  fill(pr.v, pr.vf);
  fill(pr.dout, pr.dof);
  // Rows [from, to) of sequence b's k and v as NaN (a KV cache's rows no key may come from), so
  // reading one shows.
  auto nan_rows = [&](int64_t b, int64_t from, int64_t to) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const int64_t row = int64_t(hk) * d;
    std::fill(pr.kf.begin() + (b * pr.rows_k + from) * row, pr.kf.begin() + (b * pr.rows_k + to) * row, nan);
    std::fill(pr.vf.begin() + (b * pr.rows_k + from) * row, pr.vf.begin() + (b * pr.rows_k + to) * row, nan);
  };
  if (!c.seqused_k.empty()) {  // a KV cache: the rows past a sequence's used keys
    if (pr.varlen || c.seqused_k.size() != size_t(c.batch))
      throw std::invalid_argument("Case: seqused_k needs a padded batch and one length per sequence");
    pr.used_k.assign(c.seqused_k.begin(), c.seqused_k.end());
    for (int64_t b = 0; b < pr.nb; ++b) nan_rows(b, pr.used_k[size_t(b)], pr.rows_k);
  }
  if (!c.leftpad_k.empty()) {  // a left-padded cache: the rows before a sequence's first key too
    if (pr.varlen || c.leftpad_k.size() != size_t(c.batch))
      throw std::invalid_argument("Case: leftpad_k needs a padded batch and one start per sequence");
    pr.leftpad_k.assign(c.leftpad_k.begin(), c.leftpad_k.end());
    for (int64_t b = 0; b < pr.nb; ++b) nan_rows(b, 0, pr.leftpad_k[size_t(b)]);
  }
  if (!pr.used_k.empty() || !pr.leftpad_k.empty()) {
    pr.k.set(pr.kf);
    pr.v.set(pr.vf);
  }
  if (c.alibi != 0) {
    // Slopes of a geometric sequence over the heads from alibi_max_slope (ALiBi's 2^(-8 h / H) with a
    // larger start, so short sequences see the bias); per sequence (alibi 2) scaled by 1 / (b + 1).
    const int nbatch = pr.varlen ? int(pr.cu_q.size()) - 1 : c.batch;
    const int rows = c.alibi == 2 ? nbatch : 1;
    pr.alibi_batch_stride = c.alibi == 2 ? c.num_heads : 0;
    pr.alibi_slopes.resize(size_t(rows) * c.num_heads);
    for (int b = 0; b < rows; ++b)
      for (int h = 0; h < c.num_heads; ++h)
        pr.alibi_slopes[size_t(b * c.num_heads + h)] = c.alibi_max_slope * std::ldexp(1.f, -h) / float(b + 1);
  }
  if (c.page_block_size > 0) page_kv(pr, rng);
  return pr;
}

namespace {

// The problem again in fp32, contiguous, with the same values: what the reference reads.
struct Fp32Copy {
  Problem pr;
  explicit Fp32Copy(const Problem& src) : pr() {
    pr.c = src.c;
    pr.c.dtype = FA_FLOAT32;
    pr.c.bhsd = false;
    pr.c.row_padding = 0;
    pr.c.num_threads = 0;
    pr.c.page_block_size = 0;  // k and v contiguous
    pr.varlen = src.varlen;
    pr.nb = src.nb;
    pr.rows_q = src.rows_q;
    pr.rows_k = src.rows_k;
    pr.max_seqlen_q = src.max_seqlen_q;
    pr.max_seqlen_k = src.max_seqlen_k;
    pr.cu_q = src.cu_q;
    pr.cu_k = src.cu_k;
    pr.used_k = src.used_k;
    pr.alibi_slopes = src.alibi_slopes;
    pr.alibi_batch_stride = src.alibi_batch_stride;
    pr.scale = src.scale;
    const int h = src.c.num_heads, hk = src.c.num_heads_kv, d = src.c.head_dim;
    auto make = [&](int64_t rows, int heads) { return make_tensor(FA_FLOAT32, pr.nb, rows, heads, d, false, 0); };
    pr.q = make(pr.rows_q, h);
    pr.o = make(pr.rows_q, h);
    pr.dout = make(pr.rows_q, h);
    pr.dq = make(pr.rows_q, h);
    pr.k = make(pr.rows_k, hk);
    pr.v = make(pr.rows_k, hk);
    pr.dk = make(pr.rows_k, hk);
    pr.dv = make(pr.rows_k, hk);
    pr.q.set(src.qf);
    if (src.leftpad_k.empty()) {
      pr.k.set(src.kf);
      pr.v.set(src.vf);
    } else {
      // A left-padded cache as the reference sees it: each sequence's keys moved to row 0 (the rest NaN),
      // its used length less the padding, and no leftpad_k.
      const int64_t row = int64_t(hk) * d;
      std::vector<float> kf(src.kf.size(), std::numeric_limits<float>::quiet_NaN()), vf(kf);
      if (pr.used_k.empty()) pr.used_k.assign(size_t(pr.nb), int32_t(pr.rows_k));
      for (int64_t b = 0; b < pr.nb; ++b) {
        const int64_t pad = src.leftpad_k[size_t(b)], base = b * pr.rows_k * row;
        std::copy(src.kf.begin() + base + pad * row, src.kf.begin() + base + pr.rows_k * row, kf.begin() + base);
        std::copy(src.vf.begin() + base + pad * row, src.vf.begin() + base + pr.rows_k * row, vf.begin() + base);
        pr.used_k[size_t(b)] -= int32_t(pad);
      }
      pr.k.set(kf);
      pr.v.set(vf);
    }
    pr.dout.set(src.dof);
    pr.lse.assign(src.lse.size(), std::numeric_limits<float>::quiet_NaN());
  }
};

void expect_ok(fa_status s, const char* what) {
  if (s != FA_OK)
    throw std::runtime_error(std::string("the reference ") + what + " failed: " + fa_status_name(s) + ": " + fa_last_error());
}

}  // namespace

Outputs reference_forward(const Problem& src) {
  Fp32Copy copy(src);
  fa_params p = copy.pr.params();
  expect_ok(fa_forward(&p, FA_IMPL_CPU_REFERENCE), "forward");
  Outputs out;
  out.o = copy.pr.o.get();
  out.lse = copy.pr.lse;
  return out;
}

Outputs reference_backward(const Problem& src) {
  Fp32Copy copy(src);
  fa_params p = copy.pr.params();
  expect_ok(fa_forward(&p, FA_IMPL_CPU_REFERENCE), "forward");
  expect_ok(fa_backward(&p, FA_IMPL_CPU_REFERENCE), "backward");
  Outputs out;
  out.o = copy.pr.o.get();
  out.lse = copy.pr.lse;
  out.dq = copy.pr.dq.get();
  out.dk = copy.pr.dk.get();
  out.dv = copy.pr.dv.get();
  return out;
}

}  // namespace fa_test
