// FlashAttention-2 backward on the CPU, by recomputation from the forward's lse.
//
//   D = rowsum(dO o O)                                    (pre-pass, per query row)
// One task per (batch, kv head, key block of block_n keys): the task owns dK_j, dV_j of its keys
// (summed over the query heads of the GQA group) and walks every query block that sees them:
//
//   S^T  = K_j Q_i^T                 P^T  = exp2(S^T * scale * log2 e - lse * log2 e)
//   dV_j += P^T dO_i                 dP^T = V_j dO_i^T
//   dS^T = P^T o (dP^T - D_i) * scale        (softcap: * (1 - tanh^2) of the capped score; ALiBi adds
//                                             its bias to S before the exp2 and leaves dS as it is)
//   dK_j += dS^T Q_i                 dQ_i += dS K_j   (added under the lock of query block i)
//
// Transposed S / P / dS put query rows in the vector lanes, as in the forward. dQ is accumulated
// in an fp32 buffer (total_q, num_heads, head_dim) and written in the output dtype at the end.
// With p.deterministic the tasks are whole (batch, kv head) pairs, which walk their key blocks in
// order, so every sum has a fixed order and the gradients are bit-identical run to run.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "common/layout.hpp"
#include "common/mask.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/kernels.hpp"

namespace flashattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

struct Config {
  int head_dim, d_pad, block_m, block_n, m_pad, num_m_blocks, num_n_blocks, group;
  int m_lanes;  // block_m rounded up to whole vectors (m_pad: the transposed tiles' row stride, m_lanes or more)
  float scale, scale_log2, softcap;
  bool dropout;  // fa_params::dropout_p > 0
};

struct Workspace {
  Buffer k, v, dk, dv, q, q_t, dout, do_t, s_t, dp_t, tanh_t, z_t, pd_t, dq, lse2, delta, row;  // z_t, pd_t: dropout's
  std::vector<int32_t> key_begin, key_end;
  explicit Workspace(const Config& c)
      : k(int64_t(c.block_n) * c.d_pad), v(int64_t(c.block_n) * c.d_pad),
        dk(int64_t(c.block_n) * c.d_pad), dv(int64_t(c.block_n) * c.d_pad),
        q(int64_t(c.m_pad) * c.d_pad), q_t(int64_t(c.head_dim) * c.m_pad),
        dout(int64_t(c.m_pad) * c.d_pad), do_t(int64_t(c.head_dim) * c.m_pad),
        s_t(int64_t(c.block_n) * c.m_pad), dp_t(int64_t(c.block_n) * c.m_pad),
        tanh_t(c.softcap > 0 ? int64_t(c.block_n) * c.m_pad : 1),
        z_t(c.dropout ? int64_t(c.block_n) * c.m_pad : 1), pd_t(c.dropout ? int64_t(c.block_n) * c.m_pad : 1),
        dq(int64_t(c.m_pad) * c.d_pad), lse2(c.m_pad), delta(c.m_pad), row(c.d_pad),
        key_begin(size_t(c.m_pad)), key_end(size_t(c.m_pad)) {}
};

struct Shared {
  float* dq_acc;  // (total_q rows, num_heads, d_pad) fp32
  float* delta;   // D, laid out like lse
  std::mutex* locks;  // one per (batch, head, query block)
};

// Row of sequence `seq` in the fp32 (rows, heads) buffers.
int64_t global_row(const fa_params& p, const Sequence& seq, int64_t i) {
  return (is_varlen(p) ? seq.q_start : int64_t(seq.batch_index) * p.seqlen_q) + i;
}

// Rows [m0, m0 + rows) of (head h, tensor t) -> x (rows, d_pad) and, when x_t, x^T (d, m_pad).
void load_block(const fa_params& p, const Config& c, const Sequence& seq, const TensorRef& t, const void* data, int h,
                int m0, int rows, float* x, float* x_t) {
  const int d = c.head_dim;
  for (int i = 0; i < rows; ++i) {
    float* xr = x + int64_t(i) * c.d_pad;
    load_row_f32(data, row_offset(p, t, seq, true, m0 + i, h), d, p.dtype, xr);
    std::fill(xr + d, xr + c.d_pad, 0.f);
    for (int cc = 0; cc < d; ++cc) x_t[int64_t(cc) * c.m_pad + i] = xr[cc];
  }
  for (int cc = 0; cc < d; ++cc) std::fill(x_t + int64_t(cc) * c.m_pad + rows, x_t + int64_t(cc) * c.m_pad + c.m_pad, 0.f);
}

// Keys [n0, n0 + nv) of kv head h_kv, rows j0 .. j0 + nv - 1 of the key block in the workspace (w.k, w.v, w.dk,
// w.dv): their gradient contributions from query block [m0, m0 + rows) of head h.
void backward_block(const fa_params& p, const Config& c, Workspace& w, const Shared& sh, const Sequence& seq,
                    const Mask& mask, int h, int64_t n0, int j0, int nv, int m0, int rows) {
  const int d = c.head_dim, d_pad = c.d_pad, m_pad = c.m_pad;
  const float *k = w.k.get() + int64_t(j0) * d_pad, *v = w.v.get() + int64_t(j0) * d_pad;
  float *dk = w.dk.get() + int64_t(j0) * d_pad, *dv = w.dv.get() + int64_t(j0) * d_pad;
  float *s_t = w.s_t.get(), *dp_t = w.dp_t.get(), *tanh_t = w.tanh_t.get();
  load_block(p, c, seq, q_ref(p), p.q, h, m0, rows, w.q.get(), w.q_t.get());
  load_block(p, c, seq, do_ref(p), p.dout, h, m0, rows, w.dout.get(), w.do_t.get());
  float *lse2 = w.lse2.get(), *delta = w.delta.get();
  for (int i = 0; i < m_pad; ++i) {
    if (i < rows) {
      const float lse = p.lse[lse_index(p, seq, m0 + i, h)];
      lse2[i] = lse == kNegInf ? kPosInf : lse * kLog2e;  // fully masked row: P = exp2(-inf) = 0
      delta[i] = sh.delta[lse_index(p, seq, m0 + i, h)];
      w.key_begin[i] = int32_t(mask.key_begin(m0 + i));
      w.key_end[i] = int32_t(mask.key_end(m0 + i));
    } else {
      lse2[i] = kPosInf;
      delta[i] = 0.f;
      w.key_begin[i] = w.key_end[i] = 0;
    }
  }

  gemm<false>(nv, m_pad, d, k, d_pad, w.q_t.get(), m_pad, s_t, m_pad, false);  // S^T (nv, m_pad)
  float multiplier = c.scale_log2;
  if (c.softcap > 0) {
    const float inner = c.scale / c.softcap, outer = c.softcap * kLog2e;
    for (int64_t e = 0; e < int64_t(nv) * m_pad; e += kLanes) {
      const vfloat t = tanhv(inner * vload(s_t + e));
      vstore(tanh_t + e, t);
      vstore(s_t + e, outer * t);
    }
    multiplier = 1.f;
  }
  if (const float slope = alibi_slope(p, seq.batch_index, h); slope != 0) {
    // ALiBi: the scores in log2 units first (the bias is a constant: dS is unchanged).
    if (multiplier != 1.f)
      for (int64_t e = 0; e < int64_t(nv) * m_pad; ++e) s_t[e] *= multiplier;
    multiplier = 1.f;
    add_alibi_t(s_t, nv, rows, m_pad, n0, m0, mask, slope * kLog2e);
  }
  // P^T = exp2(x - lse * log2 e), 0 where masked or padded.
  const bool masked = n0 < mask.key_begin(m0 + rows - 1) || n0 + nv > mask.key_end(m0) || rows < c.m_lanes;
  const vfloat mult = vbroadcast(multiplier), neg_inf = vbroadcast(kNegInf);
  for (int j = 0; j < nv; ++j) {
    float* srow = s_t + int64_t(j) * m_pad;
    const vint jg = vint{} + int32_t(n0 + j);
    for (int i = 0; i < m_pad; i += kLanes) {
      vfloat x = vload(srow + i) * mult;
      if (masked) {
        vint kbv, kev;
        std::memcpy(&kbv, w.key_begin.data() + i, sizeof(vint));
        std::memcpy(&kev, w.key_end.data() + i, sizeof(vint));
        x = (jg >= kbv) & (jg < kev) ? x : neg_inf;
      }
      vstore(srow + i, exp2v(x - vload(lse2 + i)));
    }
  }
  const DropoutMask dropout = DropoutMask::of(p);
  float* z_t = w.z_t.get();
  const float* pd_t = s_t;  // P^T, dropped as the forward did with dropout: (P Z)^T
  if (dropout.on()) {
    dropout_factors_t(z_t, nv, rows, m_pad, n0, m0, dropout, seq.batch_index * p.num_heads + h);
    float* dropped = w.pd_t.get();
    for (int64_t e = 0; e < int64_t(nv) * m_pad; e += kLanes) vstore(dropped + e, vload(s_t + e) * vload(z_t + e));
    pd_t = dropped;
  }
  gemm<false>(nv, d_pad, rows, pd_t, m_pad, w.dout.get(), d_pad, dv, d_pad, true);  // dV += (P Z)^T dO
  gemm<false>(nv, m_pad, d, v, d_pad, w.do_t.get(), m_pad, dp_t, m_pad, false);    // dP^T = V dO^T
  if (dropout.on())  // dP of P itself: (V dO^T) Z
    for (int64_t e = 0; e < int64_t(nv) * m_pad; e += kLanes) vstore(dp_t + e, vload(dp_t + e) * vload(z_t + e));
  // dS^T = P^T (dP^T - D) * dS/dS_raw, in place of dP^T.
  const vfloat scale = vbroadcast(c.scale), one = vbroadcast(1.f);
  for (int j = 0; j < nv; ++j) {
    float *prow = s_t + int64_t(j) * m_pad, *dprow = dp_t + int64_t(j) * m_pad;
    for (int i = 0; i < m_pad; i += kLanes) {
      vfloat ds = vload(prow + i) * (vload(dprow + i) - vload(delta + i)) * scale;
      if (c.softcap > 0) {
        const vfloat t = vload(tanh_t + int64_t(j) * m_pad + i);
        ds = ds * (one - t * t);
      }
      vstore(dprow + i, ds);
    }
  }
  gemm<false>(nv, d_pad, rows, dp_t, m_pad, w.q.get(), d_pad, dk, d_pad, true);  // dK += dS^T Q
  float* dq = w.dq.get();
  gemm<true>(rows, d_pad, nv, dp_t, m_pad, k, d_pad, dq, d_pad, false);  // dQ_i part = dS K

  const int64_t lock = (int64_t(seq.batch_index) * p.num_heads + h) * c.num_m_blocks + m0 / c.block_m;
  std::lock_guard<std::mutex> guard(sh.locks[lock]);
  for (int i = 0; i < rows; ++i) {
    float* acc = sh.dq_acc + (global_row(p, seq, m0 + i) * p.num_heads + h) * d_pad;
    const float* part = dq + int64_t(i) * d_pad;
    for (int cc = 0; cc < d_pad; cc += kLanes) vstore(acc + cc, vload(acc + cc) + vload(part + cc));
  }
}

// Key blocks [nb0, nb1) of kv head h_kv of sequence b.
void backward_keys(const fa_params& p, const Config& c, Workspace& w, const Shared& sh, int b, int h_kv, int nb0,
                   int nb1) {
  const Sequence seq = sequence(p, b);
  const Mask mask(seq.seqlen_q, seq.seqlen_k, p.causal != 0, p.window_left, p.window_right);
  const int d = c.head_dim, d_pad = c.d_pad;
  const auto kr = k_ref(p), vr = v_ref(p), dkr = dk_ref(p), dvr = dv_ref(p);
  for (int nb = nb0; nb < nb1; ++nb) {
    const int64_t n0 = int64_t(nb) * c.block_n;
    if (n0 >= seq.seqlen_k) return;
    const int nv = int(std::min<int64_t>(c.block_n, seq.seqlen_k - n0));
    float *k = w.k.get(), *v = w.v.get(), *dk = w.dk.get(), *dv = w.dv.get();
    for (int j = 0; j < nv; ++j) {
      load_row_f32(p.k, row_offset(p, kr, seq, false, n0 + j, h_kv), d, p.dtype, k + int64_t(j) * d_pad);
      load_row_f32(p.v, row_offset(p, vr, seq, false, n0 + j, h_kv), d, p.dtype, v + int64_t(j) * d_pad);
    }
    std::fill(dk, dk + int64_t(nv) * d_pad, 0.f);
    std::fill(dv, dv + int64_t(nv) * d_pad, 0.f);
    for (int h = h_kv * c.group; h < (h_kv + 1) * c.group; ++h) {
      for (int m0 = 0; m0 < seq.seqlen_q; m0 += c.block_m) {
        const int rows = std::min(c.block_m, seq.seqlen_q - m0);
        // Only the keys of this block some row of the query block sees (none: skipped). Under a band (a window,
        // causal) a query block sees part of a key block: on all of it the backward with a 256-key window ran
        // 4.8x the forward's time at 1k keys (2.0x without a mask).
        const int64_t kb = std::max(n0, mask.key_begin(m0)), ke = std::min(n0 + nv, mask.key_end(m0 + rows - 1));
        if (kb >= ke) continue;
        backward_block(p, c, w, sh, seq, mask, h, kb, int(kb - n0), int(ke - kb), m0, rows);
      }
    }
    for (int j = 0; j < nv; ++j) {
      store_row_f32(p.dk, row_offset(p, dkr, seq, false, n0 + j, h_kv), d, dk + int64_t(j) * d_pad, p.dtype);
      store_row_f32(p.dv, row_offset(p, dvr, seq, false, n0 + j, h_kv), d, dv + int64_t(j) * d_pad, p.dtype);
    }
  }
}

}  // namespace

Status fa2_backward(const fa_params& p) {
  Config c;
  c.head_dim = p.head_dim;
  c.d_pad = int(round_up(p.head_dim, kLanes));
  // As in the forward, the rule's tiles get half of M; the other half holds the score tiles
  // (S / P and dP / dS, block_n x block_m fp32 each).
  const int64_t budget = p.cpu_cache_bytes > 0 ? p.cpu_cache_bytes : l2_cache_bytes();
  const BlockSizes bs = block_sizes(budget / 2, p.head_dim);
  c.block_m = bs.block_r;
  c.block_n = bs.block_c;
  const int threads = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
  // Load balance: at least ~4 tasks per thread (a causal mask makes the tasks unequal), taking
  // smaller key blocks when batch * num_heads_kv alone gives too few (never below 64 keys).
  const int64_t pairs = int64_t(p.batch) * p.num_heads_kv, want_blocks = (4 * int64_t(threads) + pairs - 1) / pairs;
  if (want_blocks > 1 && !p.deterministic) {
    const int64_t balanced = std::max<int64_t>((p.seqlen_k + want_blocks - 1) / want_blocks, 64);
    c.block_n = int(std::min<int64_t>(c.block_n, balanced));
  }
  c.m_lanes = int(round_up(c.block_m, kLanes));
  // The transposed tiles' rows (q_t, do_t, S^T, dP^T: m_pad floats) one vector longer where they would be a
  // multiple of 512 bytes: rows that far apart fall into the same few L1 sets and evict each other (head_dim 128
  // and 256, block_m 128: the backward 1.21-1.26x and 1.39-1.42x faster; bench/results/cpu-bwd-stride-session68.txt).
  // The extra lanes are padding like any other: zero q, dO columns, P = 0 (lse2 = +inf).
  c.m_pad = c.m_lanes % 128 == 0 ? c.m_lanes + kLanes : c.m_lanes;
  c.num_m_blocks = (p.seqlen_q + c.block_m - 1) / c.block_m;
  c.num_n_blocks = (p.seqlen_k + c.block_n - 1) / c.block_n;
  c.group = p.num_heads / p.num_heads_kv;
  c.scale = effective_scale(p);
  c.scale_log2 = c.scale * kLog2e;
  c.softcap = p.softcap;
  c.dropout = p.dropout_p > 0.f;

  const int64_t total_q = is_varlen(p) ? p.total_q : int64_t(p.batch) * p.seqlen_q;
  Buffer dq_acc(total_q * p.num_heads * c.d_pad, false), delta(total_q * p.num_heads, false);
  const int64_t num_locks = int64_t(p.batch) * p.num_heads * std::max(c.num_m_blocks, 1);
  std::unique_ptr<std::mutex[]> locks(new std::mutex[size_t(num_locks)]);
  Shared sh{dq_acc.get(), delta.get(), locks.get()};
  const auto orf = o_ref(p), dorf = do_ref(p), dqr = dq_ref(p);

  const bool deterministic = p.deterministic != 0;
  const int n_split = deterministic ? 1 : std::max(c.num_n_blocks, 1);
  const int64_t num_tasks = int64_t(p.batch) * p.num_heads_kv * n_split;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < total_q; ++r)
      std::fill(dq_acc.get() + r * p.num_heads * c.d_pad, dq_acc.get() + (r + 1) * p.num_heads * c.d_pad, 0.f);

    // D = rowsum(dO o O) per (row, head).
    std::vector<float> o_row(size_t(c.d_pad)), do_row(size_t(c.d_pad));
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < p.num_heads; ++h) {
        const Sequence seq = sequence(p, b);
        for (int i = 0; i < seq.seqlen_q; ++i) {
          load_row_f32(p.o, row_offset(p, orf, seq, true, i, h), p.head_dim, p.dtype, o_row.data());
          load_row_f32(p.dout, row_offset(p, dorf, seq, true, i, h), p.head_dim, p.dtype, do_row.data());
          float acc = 0;
          for (int cc = 0; cc < p.head_dim; ++cc) acc += o_row[cc] * do_row[cc];
          delta.get()[lse_index(p, seq, i, h)] = acc;
        }
      }
    }

    Workspace w(c);
    // Key block 0 of each head first: under a causal mask the first keys are seen by the most rows.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < num_tasks; ++t) {
      const int split = int(t % n_split);
      const int h_kv = int((t / n_split) % p.num_heads_kv);
      const int b = int(t / (int64_t(n_split) * p.num_heads_kv));
      if (deterministic) {
        backward_keys(p, c, w, sh, b, h_kv, 0, c.num_n_blocks);
      } else {
        backward_keys(p, c, w, sh, b, h_kv, split, split + 1);
      }
    }

    // dq from the fp32 accumulator.
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < p.num_heads; ++h) {
        const Sequence seq = sequence(p, b);
        for (int i = 0; i < seq.seqlen_q; ++i)
          store_row_f32(p.dq, row_offset(p, dqr, seq, true, i, h), p.head_dim,
                        dq_acc.get() + (global_row(p, seq, i) * p.num_heads + h) * c.d_pad, p.dtype);
      }
    }
  }
  return {};
}

}  // namespace flashattn::cpu
