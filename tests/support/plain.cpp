// The plain implementation: standard attention in the input's precision, each intermediate
// rounded to the dtype as PyTorch's eager ops would store it (matmuls accumulate in fp32).
// Its error against the oracle is the yardstick of the anchor rule.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/dropout.hpp"
#include "common/dtype.hpp"
#include "common/mask.hpp"
#include "support/problem.hpp"

namespace fa_test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kU32 = 1.f / (1 << 24);  // fp32 unit roundoff
constexpr int kRowBlock = 8;              // query rows whose dot products are taken together (Head::row_dots)

// One (sequence, query head): S, P and the softcap's tanh, all (seqlen_q, seqlen_k).
struct Head {
  const Problem& pr;
  SeqRange s;
  int s_index, h, hk, d;  // s_index: the sequence's index in the batch
  fa_dtype dt;
  flashattn::Mask mask;
  std::vector<float> p, t;  // P (rounded), tanh of the scaled scores (softcap only)
  // Per row: the relative error of P as another fp32 implementation computes it (the forward's
  // online softmax, or the backward's recomputation from the forward's lse),
  // 4 u (|lse| + max|s| + sqrt(n) + sqrt(d) scale max sum|q k|): exponents of size |s| and |lse|
  // (rescaled by log2 e, the lse stored in fp32), the sum of n exponentials and its rescalings, the
  // dot products in another order, each at the size of random rounding (Higham & Mary's
  // probabilistic bound, lambda = 4).
  std::vector<float> eps;
  flashattn::DropoutMask dropout;

  Head(const Problem& problem, int b, int head)
      : pr(problem), s(problem.seq(b)), s_index(b), h(head), hk(head / (problem.c.num_heads / problem.c.num_heads_kv)),
        d(problem.c.head_dim), dt(problem.c.dtype),
        mask(int32_t(s.seqlen_q), int32_t(s.seqlen_k), problem.c.causal, problem.c.window_left, problem.c.window_right),
        dropout(flashattn::DropoutMask::make(problem.c.dropout_p, problem.c.dropout_seed, kDropoutOffset)) {}

  // Dropout's factor of P_ij: 0 or the keep scale (1 without dropout), as torch's dropout applies it.
  float z(int64_t i, int64_t j) const {
    if (!dropout.on()) return 1.f;
    return dropout.kept(int32_t(s_index * pr.c.num_heads + h), int32_t(i), int32_t(j)) ? dropout.scale : 0.f;
  }

  float r(float x) const { return flashattn::round_to(x, dt); }
  size_t qi(int64_t i) const { return size_t(((s.bq * pr.rows_q + s.q_start + i) * pr.c.num_heads + h) * d); }
  size_t ki(int64_t j) const { return size_t(((s.bk * pr.rows_k + s.k_start + j) * pr.c.num_heads_kv + hk) * d); }

  // The head's rows of k or v (kf or vf) transposed: out[c * seqlen_k + j] = row j's column c.
  std::vector<float> transposed(const std::vector<float>& kv) const {
    const int64_t sk = s.seqlen_k;
    std::vector<float> out(static_cast<size_t>(d * sk));
    for (int64_t j = 0; j < sk; ++j)
      for (int c = 0; c < d; ++c) out[size_t(c * sk + j)] = kv[ki(j) + size_t(c)];
    return out;
  }

  // For rows i0 .. i0 + rows - 1 of a (q, or dO: qf or dof; r = i - i0), over the keys row i sees:
  // dots[r * sk + j] = a_i . b_j and, where abs_dots is given, abs_dots[r * sk + j] = sum_c |a_ic b_jc|, each
  // summed over c in order (the plain dot product, rounding for rounding), from b^T (bt[c * sk + j]): the keys'
  // sums are independent, so they fill vector lanes instead of one chain of dependent adds a key, and a column
  // of b^T serves every row of the block.
  void row_dots(const std::vector<float>& a, int64_t i0, int rows, const float* bt, float* dots,
                float* abs_dots = nullptr) const {
    const int64_t sk = s.seqlen_k;
    for (int r = 0; r < rows; ++r) {
      const int64_t jb = mask.key_begin(i0 + r), je = std::max(jb, mask.key_end(i0 + r));
      std::fill(dots + r * sk + jb, dots + r * sk + je, 0.f);
      if (abs_dots) std::fill(abs_dots + r * sk + jb, abs_dots + r * sk + je, 0.f);
    }
    for (int c = 0; c < d; ++c) {
      const float* __restrict btc = bt + c * sk;
      for (int r = 0; r < rows; ++r) {
        const float ac = a[qi(i0 + r) + size_t(c)];
        float* __restrict acc = dots + r * sk;
        const int64_t jb = mask.key_begin(i0 + r), je = mask.key_end(i0 + r);
        if (abs_dots) {
          float* __restrict acc_abs = abs_dots + r * sk;
          for (int64_t j = jb; j < je; ++j) {
            const float prod = ac * btc[j];
            acc[j] += prod;
            acc_abs[j] += std::fabs(prod);
          }
        } else {
          for (int64_t j = jb; j < je; ++j) acc[j] += ac * btc[j];
        }
      }
    }
  }

  void forward() {
    const int64_t sq = s.seqlen_q, sk = s.seqlen_k;
    const float cap = pr.c.softcap;
    p.assign(size_t(sq * sk), 0.f);
    t.assign(size_t(sq * sk), 0.f);
    eps.assign(size_t(sq), 0.f);
    std::vector<float> row(static_cast<size_t>(sk)), kt = transposed(pr.kf);
    std::vector<float> dots(static_cast<size_t>(kRowBlock * sk)), abs_dots(static_cast<size_t>(kRowBlock * sk));
    for (int64_t i = 0; i < sq; ++i) {
      if (i % kRowBlock == 0)
        row_dots(pr.qf, i, int(std::min<int64_t>(kRowBlock, sq - i)), kt.data(), dots.data(), abs_dots.data());
      const int64_t kb = mask.key_begin(i), ke = mask.key_end(i);  // the keys row i sees; P is 0 at the others
      float dot_abs = 0.f, s_abs = 0.f;
      for (int64_t j = kb; j < ke; ++j) {
        const size_t rj = size_t((i % kRowBlock) * sk + j);
        const float acc = dots[rj], acc_abs = abs_dots[rj];
        dot_abs = std::max(dot_abs, acc_abs * pr.scale);
        float x = r(acc * pr.scale);
        if (cap > 0.f) {
          float th = std::tanh(x / cap);
          t[size_t(i * sk + j)] = th;
          x = r(cap * th);
        }
        x -= pr.alibi_slope(s_index, h) * float(mask.diagonal_distance(i, j));  // ALiBi, in fp32
        row[size_t(j)] = x;
        s_abs = std::max(s_abs, std::fabs(x));
      }
      float m = kNegInf;
      for (int64_t j = kb; j < ke; ++j) m = std::max(m, row[size_t(j)]);
      if (m == kNegInf) continue;  // fully masked row: P = 0
      float l = 0.f;  // the sum over the row's keys in order (a masked key's term, exp(-inf) = 0, adds nothing)
      for (int64_t j = kb; j < ke; ++j) l += (row[size_t(j)] = std::exp(row[size_t(j)] - m));
      const float n = float(ke - kb);
      eps[size_t(i)] = 4 * kU32 * (std::fabs(m + std::log(l)) + s_abs + std::sqrt(n) + std::sqrt(float(d)) * dot_abs);
      for (int64_t j = kb; j < ke; ++j) p[size_t(i * sk + j)] = r(row[size_t(j)] / l);
    }
  }
};

}  // namespace

Outputs plain_forward(const Problem& pr) {
  Outputs out;
  const int d = pr.c.head_dim;
  out.o.assign(pr.qf.size(), 0.f);
  out.o_floor.assign(pr.qf.size(), 0.f);
  const int nbatch = pr.varlen ? int(pr.cu_q.size()) - 1 : pr.c.batch, nh = pr.c.num_heads;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < nbatch; ++b)
    for (int h = 0; h < nh; ++h) {
      Head hd(pr, b, h);
      hd.forward();
      const int64_t sq = hd.s.seqlen_q, sk = hd.s.seqlen_k;
      std::vector<float> acc(static_cast<size_t>(d));
      for (int64_t i = 0; i < sq; ++i) {
        std::fill(acc.begin(), acc.end(), 0.f);
        float* o_err = &out.o_floor[hd.qi(i)];
        const float eps = hd.eps[size_t(i)];
        for (int64_t j = 0; j < sk; ++j) {
          float pij = hd.p[size_t(i * sk + j)];
          if (pij == 0.f) continue;
          pij = hd.r(pij * hd.z(i, j));  // dropout: the kept probabilities scaled
          const float* v = &pr.vf[hd.ki(j)];
          for (int c = 0; c < d; ++c) {
            acc[size_t(c)] += pij * v[c];
            o_err[c] += eps * pij * std::fabs(v[c]);
          }
        }
        for (int c = 0; c < d; ++c) out.o[hd.qi(i) + size_t(c)] = hd.r(acc[size_t(c)]);
      }
    }
  return out;
}

Outputs plain_backward(const Problem& pr) {
  Outputs out;
  const int d = pr.c.head_dim;
  out.dq.assign(pr.qf.size(), 0.f);
  out.dk.assign(pr.kf.size(), 0.f);
  out.dv.assign(pr.vf.size(), 0.f);
  out.dq_floor.assign(pr.qf.size(), 0.f);
  out.dk_floor.assign(pr.kf.size(), 0.f);
  out.dv_floor.assign(pr.vf.size(), 0.f);
  const float dot_err = 4 * std::sqrt(2.f * float(d)) * kU32;  // dP_ij and D_i: two fp32 dot products of length d
  // The unit roundoff of o as stored in the dtype: a backward's D_i = dO_i . O_i reads that o.
  const float o_round = pr.c.dtype == FA_FLOAT32 ? kU32 : pr.c.dtype == FA_FLOAT16 ? 1.f / (1 << 11) : 1.f / (1 << 8);
  const int nbatch = pr.varlen ? int(pr.cu_q.size()) - 1 : pr.c.batch, nhk = pr.c.num_heads_kv;
  const int group = pr.c.num_heads / nhk;
  const float cap = pr.c.softcap;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < nbatch; ++b)
    for (int hk = 0; hk < nhk; ++hk) {
      SeqRange s = pr.seq(b);
      const int64_t sq = s.seqlen_q, sk = s.seqlen_k;
      // The group's dK, dV: each query head's contribution rounded, summed in fp32 (what the
      // backward of an expanded k / v does), rounded once more.
      std::vector<float> dk_sum(size_t(sk * d), 0.f), dv_sum(size_t(sk * d), 0.f);
      std::vector<float> dk_err(size_t(sk * d), 0.f), dv_err(size_t(sk * d), 0.f);
      for (int h = hk * group; h < (hk + 1) * group; ++h) {
        Head hd(pr, b, h);
        hd.forward();
        // ds_err: the error a recomputing backward may make in dS_ij beyond the plain one's,
        // ((dot_err + eps_i) (|dP_ij| + |D_i|) + dD_i) P_ij |dcap| scale, where dD_i is D's error from
        // o rounded to the dtype; it flows into dq and dk like dS.
        std::vector<float> ds(size_t(sq * sk), 0.f), ds_err(size_t(sq * sk), 0.f), acc(static_cast<size_t>(d));
        const std::vector<float> vt = hd.transposed(pr.vf);
        std::vector<float> dov(static_cast<size_t>(kRowBlock * sk));  // dO_i . V_j of a block of rows
        for (int64_t i = 0; i < sq; ++i) {
          const float* dout = &pr.dof[hd.qi(i)];
          if (i % kRowBlock == 0) hd.row_dots(pr.dof, i, int(std::min<int64_t>(kRowBlock, sq - i)), vt.data(), dov.data());
          // dP_ij = round(dO_i . V_j); D_i = sum_j P_ij dP_ij; dS_ij = round(P_ij (dP_ij - D_i))
          std::vector<float> dp(size_t(sk), 0.f), o(static_cast<size_t>(d), 0.f);
          float D = 0.f;
          for (int64_t j = 0; j < sk; ++j) {
            float pij = hd.p[size_t(i * sk + j)];
            if (pij == 0.f) continue;
            const float* v = &pr.vf[hd.ki(j)];
            const float zij = hd.z(i, j), pd = hd.r(pij * zij);
            for (int c = 0; c < d; ++c) o[size_t(c)] += pd * v[c];
            const float a = dov[size_t((i % kRowBlock) * sk + j)];
            dp[size_t(j)] = hd.r(hd.r(a) * zij);  // dropout's backward: the gradient of P dropped likewise
            D += pij * dp[size_t(j)];
          }
          float dD = 0.f;  // 4 o_round sqrt(sum_c (dO_ic O_ic)^2): o's rounding errors at random-walk size
          for (int c = 0; c < d; ++c) dD += (dout[c] * o[size_t(c)]) * (dout[c] * o[size_t(c)]);
          dD = 4 * o_round * std::sqrt(dD);
          for (int64_t j = 0; j < sk; ++j) {
            float pij = hd.p[size_t(i * sk + j)];
            if (pij == 0.f) continue;
            float x = hd.r(pij * (dp[size_t(j)] - D)), x_err = ((dot_err + hd.eps[size_t(i)]) * (std::fabs(dp[size_t(j)]) + std::fabs(D)) + dD) * pij;
            if (cap > 0.f) {
              float th = hd.t[size_t(i * sk + j)];
              x = hd.r(x * (1.f - th * th));
              x_err *= 1.f - th * th;
            }
            ds[size_t(i * sk + j)] = hd.r(x * pr.scale);
            ds_err[size_t(i * sk + j)] = x_err * pr.scale;
          }
        }
        // dQ_i = round(sum_j dS_ij K_j)
        for (int64_t i = 0; i < sq; ++i) {
          std::fill(acc.begin(), acc.end(), 0.f);
          float* dq_err = &out.dq_floor[hd.qi(i)];
          for (int64_t j = 0; j < sk; ++j) {
            float x = ds[size_t(i * sk + j)], x_err = ds_err[size_t(i * sk + j)];
            const float* k = &pr.kf[hd.ki(j)];
            if (x != 0.f)
              for (int c = 0; c < d; ++c) acc[size_t(c)] += x * k[c];
            if (x_err != 0.f)
              for (int c = 0; c < d; ++c) dq_err[c] += x_err * std::fabs(k[c]);
          }
          for (int c = 0; c < d; ++c) out.dq[hd.qi(i) + size_t(c)] = hd.r(acc[size_t(c)]);
        }
        // dK_j = round(sum_i dS_ij Q_i), dV_j = round(sum_i P_ij dO_i)
        std::vector<float> acc_v(static_cast<size_t>(d));
        for (int64_t j = 0; j < sk; ++j) {
          std::fill(acc.begin(), acc.end(), 0.f);
          std::fill(acc_v.begin(), acc_v.end(), 0.f);
          float* dk_a = &dk_err[size_t(j * d)];
          float* dv_a = &dv_err[size_t(j * d)];
          for (int64_t i = 0; i < sq; ++i) {
            float x = ds[size_t(i * sk + j)], x_err = ds_err[size_t(i * sk + j)];
            const float pij = hd.p[size_t(i * sk + j)] == 0.f ? 0.f : hd.r(hd.p[size_t(i * sk + j)] * hd.z(i, j));
            const float* q = &pr.qf[hd.qi(i)];
            const float* dout = &pr.dof[hd.qi(i)];
            if (x != 0.f)
              for (int c = 0; c < d; ++c) acc[size_t(c)] += x * q[c];
            if (x_err != 0.f)
              for (int c = 0; c < d; ++c) dk_a[c] += x_err * std::fabs(q[c]);
            if (pij != 0.f)
              for (int c = 0; c < d; ++c) {
                acc_v[size_t(c)] += pij * dout[c];
                dv_a[c] += pij * hd.eps[size_t(i)] * std::fabs(dout[c]);
              }
          }
          for (int c = 0; c < d; ++c) {
            dk_sum[size_t(j * d + c)] += hd.r(acc[size_t(c)]);
            dv_sum[size_t(j * d + c)] += hd.r(acc_v[size_t(c)]);
          }
        }
      }
      for (int64_t j = 0; j < sk; ++j) {
        size_t base = size_t(((s.bk * pr.rows_k + s.k_start + j) * nhk + hk) * d);
        for (int c = 0; c < d; ++c) {
          out.dk[base + size_t(c)] = flashattn::round_to(dk_sum[size_t(j * d + c)], pr.c.dtype);
          out.dv[base + size_t(c)] = flashattn::round_to(dv_sum[size_t(j * d + c)], pr.c.dtype);
          out.dk_floor[base + size_t(c)] = dk_err[size_t(j * d + c)];
          out.dv_floor[base + size_t(c)] = dv_err[size_t(j * d + c)];
        }
      }
    }
  return out;
}

}  // namespace fa_test
