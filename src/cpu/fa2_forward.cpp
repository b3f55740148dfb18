// FlashAttention-2 forward on the CPU.
//
// One task per (batch, head, query block of block_m rows; with GQA and few rows, per (batch, kv head, query
// block) of all its query heads' rows: grouped_heads); OpenMP threads take tasks dynamically,
// the longest (causal: last) query blocks first. Per task, for each key block of up to block_n
// keys that some row of the query block can see (blocks outside the mask are never touched):
//
//   x   = K_j (Q_i * scale * log2 e)^T    (n, m)  scores in log2 units, transposed: a query row per
//                                          vector lane (softcap: softcap * log2 e * tanh(scale S / softcap);
//                                          ALiBi: minus slope * log2 e * |i + seqlen_k - seqlen_q - j|)
//   m_new = max(m, rowmax(x));  P^T = exp2(x - m_new);  alpha = exp2(m - m_new)
//   l = alpha * l + rowsum(P);  O = diag(alpha) O + P V_j      (O unnormalized, fp32)
//
// and once at the end: o = O / l, lse = m * ln2 + log(l) (natural log). Keeping S transposed puts
// the softmax of block_m rows side by side in the vector lanes, so the row max and row sum need no
// horizontal reductions and the mask is a lane-wise compare. K and V are first packed once into
// fp32 (kv head, row, d_pad) copies (O(seqlen * d) memory), so the tasks read them with short,
// cache-friendly strides and convert fp16 / bf16 only once. Scratch per thread is O(block * d).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/layout.hpp"
#include "common/mask.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/kernels.hpp"

namespace flashattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Config {
  int head_dim, d_pad, block_m, block_n, m_pad, num_m_blocks, group;
  int heads_per_block;  // query heads of one kv head whose rows share a block (1, or group: grouped_heads)
  float scale, scale_log2, softcap;
  bool dropout;  // fa_params::dropout_p > 0
};

// K and V as fp32 (num_heads_kv, rows, d_pad); rows = batch * seqlen_k, or total_k when varlen.
struct PackedKV {
  Buffer k, v;
  int64_t rows = 0;
  int d_pad = 0;
  const float* k_row(const fa_params& p, const Sequence& seq, int64_t j, int h_kv) const {
    return k.get() + index(p, seq, j, h_kv);
  }
  const float* v_row(const fa_params& p, const Sequence& seq, int64_t j, int h_kv) const {
    return v.get() + index(p, seq, j, h_kv);
  }
  int64_t index(const fa_params& p, const Sequence& seq, int64_t j, int h_kv) const {
    const int64_t row = (is_varlen(p) ? seq.k_start : int64_t(seq.batch_index) * p.seqlen_k) + j;
    return (h_kv * rows + row) * d_pad;
  }
};

struct Workspace {
  Buffer q_t, s_t, z_t, o, m, l, alpha, row_max, row_sum, row_out;  // z_t: dropout's factors
  std::vector<int32_t> key_begin, key_end;
  explicit Workspace(const Config& c)
      : q_t(int64_t(c.head_dim) * c.m_pad),
        s_t(int64_t(c.block_n) * c.m_pad), z_t(c.dropout ? int64_t(c.block_n) * c.m_pad : 1),
        o(int64_t(c.m_pad) * c.d_pad),
        m(c.m_pad), l(c.m_pad), alpha(c.m_pad), row_max(c.m_pad), row_sum(c.m_pad), row_out(c.d_pad),
        key_begin(size_t(c.m_pad)), key_end(size_t(c.m_pad)) {}
};

// One query block [m0, m0 + rows) of heads h .. h + c.heads_per_block - 1 of sequence seq: lane r of the block is
// query row m0 + r % rows of head h + r / rows (one head, unless grouped_heads).
void forward_block(const fa_params& p, const Config& c, const PackedKV& kv, Workspace& w, const Sequence& seq, int h,
                   int m0) {
  const int d = c.head_dim, d_pad = c.d_pad, m_pad = c.m_pad;
  const int rows = std::min(c.block_m, seq.seqlen_q - m0), lanes = rows * c.heads_per_block;
  const int h_kv = h / c.group;
  const Mask mask(seq.seqlen_q, seq.seqlen_k, p.causal != 0, p.window_left, p.window_right);
  const auto qr = q_ref(p), orf = o_ref(p);
  const float slope_log2 = alibi_slope(p, seq.batch_index, h) * kLog2e;  // one head a block with ALiBi
  const DropoutMask dropout = DropoutMask::of(p);                      // and with dropout

  // Q_i^T (d, m_pad), times scale * log2 e unless softcap needs the raw score; lanes past `lanes`
  // are zero and never stored.
  const float q_scale = c.softcap > 0 ? 1.f : c.scale_log2;
  float* q_t = w.q_t.get();
  for (int r = 0; r < lanes; ++r) {
    load_row_f32(p.q, row_offset(p, qr, seq, true, m0 + r % rows, h + r / rows), d, p.dtype, w.row_out.get());
    for (int cc = 0; cc < d; ++cc) q_t[int64_t(cc) * m_pad + r] = q_scale * w.row_out.get()[cc];
  }
  for (int cc = 0; cc < d; ++cc) std::fill(q_t + int64_t(cc) * m_pad + lanes, q_t + int64_t(cc) * m_pad + m_pad, 0.f);
  for (int r = 0; r < m_pad; ++r) {
    w.key_begin[r] = r < lanes ? int32_t(mask.key_begin(m0 + r % rows)) : 0;
    w.key_end[r] = r < lanes ? int32_t(mask.key_end(m0 + r % rows)) : 0;
  }
  float *m = w.m.get(), *l = w.l.get(), *o = w.o.get(), *s_t = w.s_t.get();
  std::fill(m, m + m_pad, kNegInf);
  std::fill(l, l + m_pad, 0.f);
  std::fill(o, o + int64_t(lanes) * d_pad, 0.f);

  // Keys some row sees: key_begin and key_end grow with the row.
  const int64_t kb = mask.key_begin(m0), ke = mask.key_end(m0 + rows - 1);
  for (int64_t n0 = kb; n0 < ke; n0 += c.block_n) {
    const int nv = int(std::min<int64_t>(c.block_n, ke - n0));
    const float* k_blk = kv.k_row(p, seq, n0, h_kv);  // K_j (nv, d_pad)
    const float* v_blk = kv.v_row(p, seq, n0, h_kv);  // V_j (nv, d_pad)
    gemm<false>(nv, m_pad, d, k_blk, d_pad, q_t, m_pad, s_t, m_pad, false);  // S^T (nv, m_pad), log2 units

    if (c.softcap > 0) {
      const float inner = c.scale / c.softcap, outer = c.softcap * kLog2e;
      for (int64_t e = 0; e < int64_t(nv) * m_pad; e += kLanes) vstore(s_t + e, outer * tanhv(inner * vload(s_t + e)));
    }
    if (slope_log2 != 0) add_alibi_t(s_t, nv, rows, m_pad, n0, m0, mask, slope_log2);
    // Masking is needed unless every row sees every key of the block.
    const bool masked = n0 < mask.key_begin(m0 + rows - 1) || n0 + nv > mask.key_end(m0);

    // Pass 1: masked scores -> -inf (boundary blocks only), column max per lane.
    float* row_max = w.row_max.get();
    std::fill(row_max, row_max + m_pad, kNegInf);
    const vfloat neg_inf = vbroadcast(kNegInf);
    for (int j = 0; j < nv; ++j) {
      float* srow = s_t + int64_t(j) * m_pad;
      const vint jg = vint{} + int32_t(n0 + j);
      for (int i = 0; i < m_pad; i += kLanes) {
        vfloat x = vload(srow + i);
        if (masked) {
          vint kbv, kev;
          std::memcpy(&kbv, w.key_begin.data() + i, sizeof(vint));
          std::memcpy(&kev, w.key_end.data() + i, sizeof(vint));
          x = (jg >= kbv) & (jg < kev) ? x : neg_inf;
          vstore(srow + i, x);
        }
        vstore(row_max + i, vmax(vload(row_max + i), x));
      }
    }
    // New max (a row with nothing visible yet keeps -inf and uses 0 as its offset), rescale factor.
    float *alpha = w.alpha.get(), *row_sum = w.row_sum.get();
    for (int i = 0; i < m_pad; i += kLanes) {
      vfloat m_old = vload(m + i), m_new = vmax(m_old, vload(row_max + i));
      vfloat m_use = m_new == neg_inf ? vfloat{} : m_new;
      vstore(alpha + i, exp2v(m_old - m_use));
      vstore(m + i, m_new);
      vstore(row_max + i, m_use);
      vstore(row_sum + i, vfloat{});
    }
    // Pass 2: P^T = exp2(x - m), column sums.
    for (int j = 0; j < nv; ++j) {
      float* srow = s_t + int64_t(j) * m_pad;
      for (int i = 0; i < m_pad; i += kLanes) {
        vfloat pv = exp2v(vload(srow + i) - vload(row_max + i));
        vstore(srow + i, pv);
        vstore(row_sum + i, vload(row_sum + i) + pv);
      }
    }
    for (int i = 0; i < m_pad; i += kLanes)
      vstore(l + i, vload(alpha + i) * vload(l + i) + vload(row_sum + i));
    if (dropout.on()) {  // P V with P dropped (the sums above are of P itself)
      float* z_t = w.z_t.get();
      dropout_factors_t(z_t, nv, rows, m_pad, n0, m0, dropout, seq.batch_index * p.num_heads + h);
      for (int64_t e = 0; e < int64_t(nv) * m_pad; e += kLanes) vstore(s_t + e, vload(s_t + e) * vload(z_t + e));
    }
    // O = diag(alpha) O + P V_j.
    for (int i = 0; i < lanes; ++i) {
      if (alpha[i] == 1.f) continue;
      const vfloat a = vbroadcast(alpha[i]);
      float* orow = o + int64_t(i) * d_pad;
      for (int cc = 0; cc < d_pad; cc += kLanes) vstore(orow + cc, vload(orow + cc) * a);
    }
    gemm<true>(lanes, d_pad, nv, s_t, m_pad, v_blk, d_pad, o, d_pad, true);
  }

  // o = O / l; lse in natural log. l == 0: every key masked, o = 0 and lse = -inf.
  for (int r = 0; r < lanes; ++r) {
    const float inv = l[r] > 0 ? 1.f / l[r] : 0.f;
    float* orow = o + int64_t(r) * d_pad;
    for (int cc = 0; cc < d; ++cc) orow[cc] *= inv;
    const int i = m0 + r % rows, head = h + r / rows;
    store_row_f32(p.o, row_offset(p, orf, seq, true, i, head), d, orow, p.dtype);
    if (p.lse) p.lse[lse_index(p, seq, i, head)] = l[r] > 0 ? m[r] * kLn2 + std::log(l[r]) : kNegInf;
  }
}

}  // namespace

Status fa2_forward(const fa_params& p) {
  Config c;
  c.head_dim = p.head_dim;
  c.d_pad = int(round_up(p.head_dim, kLanes));
  // The rule sizes the four tiles Q_i, K_j, V_j, O_i to fill M; on the CPU the score tile S_ij / P_ij
  // (block_m x block_n fp32) lives in the same cache, so the tiles get half of it.
  const int64_t budget = p.cpu_cache_bytes > 0 ? p.cpu_cache_bytes : l2_cache_bytes();
  const BlockSizes bs = block_sizes(budget / 2, p.head_dim);
  // At least 64 rows where the rule's B_r = min(B_c, d) is fewer (head_dim below 64): S^T's rows then fill 4
  // vectors or more, and each K, V block serves more rows (head_dim 16 1.28-1.54x faster, 32 1.02-1.10x;
  // bench/results/cpu-small-head-dim-session68.txt). Fewer query rows than that (decode: one): blocks of those
  // rows, so that S^T's vector lanes (m_pad) are not mostly padding (one row in 64 lanes: the decode forward, 1
  // row over 8k-32k keys, ran 2.4x the time).
  const int block_rows = std::max(bs.block_r, 64);
  c.block_m = std::max(1, std::min(block_rows, p.seqlen_q));
  c.block_n = bs.block_c;
  c.group = p.num_heads / p.num_heads_kv;
  // Grouped heads: with GQA and few query rows (decode) a kv head's query heads share one block, so that each
  // K, V block is read once for all of them and their rows fill the vector lanes (4 query heads a kv head, 1 row
  // over 8k-32k keys: 1.96-2.25x faster). Not with ALiBi or dropout (their slope and mask are per head).
  const bool grouped_heads =
      c.group > 1 && p.seqlen_q * c.group <= block_rows && !p.alibi_slopes && !(p.dropout_p > 0.f);
  c.heads_per_block = grouped_heads ? c.group : 1;
  c.m_pad = int(round_up(int64_t(c.block_m) * c.heads_per_block, kLanes));
  c.num_m_blocks = (p.seqlen_q + c.block_m - 1) / c.block_m;
  c.scale = effective_scale(p);
  c.scale_log2 = c.scale * kLog2e;
  c.softcap = p.softcap;
  c.dropout = p.dropout_p > 0.f;

  const int head_blocks = p.num_heads / c.heads_per_block;
  const int64_t num_tasks = int64_t(p.batch) * head_blocks * c.num_m_blocks;
  const int threads = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
  PackedKV kv;
  kv.rows = is_varlen(p) ? p.total_k : int64_t(p.batch) * p.seqlen_k;
  kv.d_pad = c.d_pad;
  kv.k = Buffer(kv.rows * p.num_heads_kv * c.d_pad, false);
  kv.v = Buffer(kv.rows * p.num_heads_kv * c.d_pad, false);
  const auto kr = k_ref(p), vr = v_ref(p);
#pragma omp parallel num_threads(threads)
  {
    // Pack K and V, zero padding columns.
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < p.batch; ++b) {
      for (int h_kv = 0; h_kv < p.num_heads_kv; ++h_kv) {
        const Sequence seq = sequence(p, b);
        for (int j = 0; j < seq.seqlen_k; ++j) {
          const int64_t at = kv.index(p, seq, j, h_kv);
          float *k_row = kv.k.get() + at, *v_row = kv.v.get() + at;
          load_row_f32(p.k, row_offset(p, kr, seq, false, j, h_kv), c.head_dim, p.dtype, k_row);
          load_row_f32(p.v, row_offset(p, vr, seq, false, j, h_kv), c.head_dim, p.dtype, v_row);
          std::fill(k_row + c.head_dim, k_row + c.d_pad, 0.f);
          std::fill(v_row + c.head_dim, v_row + c.d_pad, 0.f);
        }
      }
    }
    Workspace w(c);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < num_tasks; ++t) {
      // Last query blocks first: under a causal mask they are the longest.
      const int mb = c.num_m_blocks - 1 - int(t % c.num_m_blocks);
      const int h = int((t / c.num_m_blocks) % head_blocks) * c.heads_per_block;
      const int b = int(t / (int64_t(c.num_m_blocks) * head_blocks));
      const Sequence seq = sequence(p, b);
      if (int64_t(mb) * c.block_m >= seq.seqlen_q) continue;
      forward_block(p, c, kv, w, seq, h, mb * c.block_m);
    }
  }
  return {};
}

}  // namespace flashattn::cpu
