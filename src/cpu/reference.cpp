// Standard attention, materializing S and P per (batch, head), accumulating in double.
// This is the oracle: every other implementation, CUDA included, is tested against it.
//
//   S = scale * Q K^T            (seqlen_q, seqlen_k); softcap: S = c * tanh(S / c);
//                                ALiBi: S_ij -= slope * |i + seqlen_k - seqlen_q - j|
//   P = softmax(S) over visible keys; lse = log(sum_j exp(S_ij)); dropout: Pd = P * Z (Z_ij: 0 for a dropped
//   element, else the keep scale; src/common/dropout.hpp), else Pd = P; O = Pd V
//   backward: dV = Pd^T dO, dP = (dO V^T) * Z, dS = P * (dP - rowsum(P * dP)), dQ = dS K * scale',
//   dK = dS^T Q * scale' (rowsum(P * dP) = rowsum(dO * O))
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/dropout.hpp"
#include "common/dtype.hpp"
#include "common/layout.hpp"
#include "common/mask.hpp"
#include "cpu/cpu_backend.hpp"

namespace flashattn::cpu {
namespace {

constexpr int kRowBlock = 8;  // query rows that take each key in turn (O = P V and the backward's products)

struct HeadProblem {
  const fa_params& p;
  Sequence seq;
  int head, head_kv;
  Mask mask;
  double scale, slope;  // slope: ALiBi's (0: none)
  DropoutMask dropout;

  HeadProblem(const fa_params& params, int b, int h)
      : p(params), seq(sequence(params, b)), head(h), head_kv(h / (params.num_heads / params.num_heads_kv)),
        mask(seq.seqlen_q, seq.seqlen_k, params.causal != 0, params.window_left, params.window_right),
        scale(effective_scale(params)), slope(alibi_slope(params, b, h)), dropout(DropoutMask::of(params)) {}

  // Dropout's factor Z_ij: 0 (dropped) or the keep scale; 1 without dropout.
  double keep(int i, int j) const {
    if (!dropout.on()) return 1.0;
    return dropout.kept(seq.batch_index * p.num_heads + head, i, j) ? double(dropout.scale) : 0.0;
  }

  std::vector<double> load(const TensorRef& t, bool q_side, int rows, int h) const {
    std::vector<double> m(size_t(rows) * p.head_dim);
    for (int i = 0; i < rows; ++i) {
      int64_t off = row_offset(p, t, seq, q_side, i, h);
      for (int c = 0; c < p.head_dim; ++c) m[size_t(i) * p.head_dim + c] = load_element(t.data, off + c, p.dtype);
    }
    return m;
  }

  // Scores S (after scale, softcap and ALiBi; -inf where masked) and, for the backward, the softcap
  // derivative dS/dS_raw per entry (the ALiBi bias is a constant).
  void scores(const std::vector<double>& q, const std::vector<double>& k, std::vector<double>& s,
              std::vector<double>* dcap) const {
    const int sq = seq.seqlen_q, sk = seq.seqlen_k;
    s.assign(size_t(sq) * sk, -std::numeric_limits<double>::infinity());
    if (dcap) dcap->assign(size_t(sq) * sk, 0.0);
    visible_dots(q, k, s);  // the raw dot products q_i . k_j
    for (int i = 0; i < sq; ++i) {
      for (int64_t j = mask.key_begin(i); j < mask.key_end(i); ++j) {
        double x = s[size_t(i) * sk + j] * scale;
        if (p.softcap > 0) {
          double t = std::tanh(x / p.softcap);
          x = p.softcap * t;
          if (dcap) (*dcap)[size_t(i) * sk + j] = scale * (1 - t * t);
        } else if (dcap) {
          (*dcap)[size_t(i) * sk + j] = scale;
        }
        s[size_t(i) * sk + j] = x - slope * double(mask.diagonal_distance(i, j));
      }
    }
  }

  // out_ij = a_i . b_j (rows of head_dim) where row i sees key j; out's other entries are left alone. Each sum
  // runs over the columns in order, as a plain loop would, but a block of kRows rows and kCols keys at a time over
  // b^T: the block's columns of b^T stay in cache and the keys' sums are independent (vector lanes, not one
  // chain of dependent adds a dot product).
  void visible_dots(const std::vector<double>& a, const std::vector<double>& b, std::vector<double>& out) const {
    constexpr int kRows = 4, kCols = 128;
    const int sq = seq.seqlen_q, sk = seq.seqlen_k, d = p.head_dim;
    std::vector<double> bt(size_t(d) * sk);  // b^T: bt[c * sk + j]
    for (int j = 0; j < sk; ++j)
      for (int c = 0; c < d; ++c) bt[size_t(c) * sk + j] = b[size_t(j) * d + c];
    double acc[kRows][kCols];
    for (int j0 = 0; j0 < sk; j0 += kCols) {
      const int cols = std::min(kCols, sk - j0);
      for (int i0 = 0; i0 < sq; i0 += kRows) {
        const int rows = std::min(kRows, sq - i0);
        bool any = false;  // does a row of the block see a key of this block?
        for (int r = 0; r < rows; ++r)
          any |= mask.key_begin(i0 + r) < std::min<int64_t>(mask.key_end(i0 + r), j0 + cols) &&
                 mask.key_end(i0 + r) > j0;
        if (!any) continue;
        for (int r = 0; r < rows; ++r) std::fill(acc[r], acc[r] + cols, 0.0);
        for (int c = 0; c < d; ++c) {
          const double* __restrict btc = &bt[size_t(c) * sk + j0];
          for (int r = 0; r < rows; ++r) {
            const double ac = a[size_t(i0 + r) * d + c];
            double* __restrict accr = acc[r];
            for (int jj = 0; jj < cols; ++jj) accr[jj] += ac * btc[jj];
          }
        }
        for (int r = 0; r < rows; ++r) {
          const int i = i0 + r;
          const int64_t jb = std::max<int64_t>(mask.key_begin(i), j0), je = std::min<int64_t>(mask.key_end(i), j0 + cols);
          for (int64_t j = jb; j < je; ++j) out[size_t(i) * sk + j] = acc[r][j - j0];
        }
      }
    }
  }

  // In place: S -> P; returns the lse per row (-inf for a fully masked row, whose P row is 0).
  std::vector<double> softmax(std::vector<double>& s) const {
    const int sq = seq.seqlen_q, sk = seq.seqlen_k;
    std::vector<double> lse(sq, -std::numeric_limits<double>::infinity());
    for (int i = 0; i < sq; ++i) {
      double* row = s.data() + size_t(i) * sk;
      double m = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < sk; ++j) m = std::max(m, row[j]);
      if (m == -std::numeric_limits<double>::infinity()) {
        for (int j = 0; j < sk; ++j) row[j] = 0;
        continue;
      }
      double l = 0;
      for (int j = 0; j < sk; ++j) l += (row[j] = std::exp(row[j] - m));
      for (int j = 0; j < sk; ++j) row[j] /= l;
      lse[i] = m + std::log(l);
    }
    return lse;
  }
};

template <class Fn>
void for_each_batch_head(const fa_params& p, Fn fn) {
  const int nb = p.batch, nh = p.num_heads;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < nb; ++b)
    for (int h = 0; h < nh; ++h) fn(b, h);
}

}  // namespace

Status reference_forward(const fa_params& p) {
  for_each_batch_head(p, [&](int b, int h) {
    HeadProblem hp(p, b, h);
    const int sq = hp.seq.seqlen_q, sk = hp.seq.seqlen_k, d = p.head_dim;
    if (sq == 0) return;
    auto q = hp.load(q_ref(p), true, sq, h);
    auto k = hp.load(k_ref(p), false, sk, hp.head_kv);
    auto v = hp.load(v_ref(p), false, sk, hp.head_kv);
    std::vector<double> s;
    hp.scores(q, k, s, nullptr);
    auto lse = hp.softmax(s);
    // O = P V (with dropout P Z), kRowBlock rows at a time: each v_j serves the block's rows while it is in cache,
    // and each O_ic still sums over j in order.
    auto o = o_ref(p);
    std::vector<double> oblk(size_t(kRowBlock) * d);
    for (int i0 = 0; i0 < sq; i0 += kRowBlock) {
      const int rows = std::min(kRowBlock, sq - i0);
      std::fill(oblk.begin(), oblk.end(), 0.0);
      for (int j = 0; j < sk; ++j)
        for (int r = 0; r < rows; ++r) {
          double pij = s[size_t(i0 + r) * sk + j];
          if (pij == 0) continue;
          pij *= hp.keep(i0 + r, j);
          for (int c = 0; c < d; ++c) oblk[size_t(r) * d + c] += pij * v[size_t(j) * d + c];
        }
      for (int r = 0; r < rows; ++r) {
        const int i = i0 + r;
        int64_t off = row_offset(p, o, hp.seq, true, i, h);
        for (int c = 0; c < d; ++c) store_element(p.o, off + c, float(oblk[size_t(r) * d + c]), p.dtype);
        if (p.lse) p.lse[lse_index(p, hp.seq, i, h)] = float(lse[i]);
      }
    }
  });
  return {};
}

Status reference_backward(const fa_params& p) {
  const int group = p.num_heads / p.num_heads_kv;
  // dK, dV sum over the query heads of a group: run a kv head's whole group in one task.
  const int nb = p.batch, nhk = p.num_heads_kv;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < nb; ++b) {
    for (int hk = 0; hk < nhk; ++hk) {
      Sequence seq = sequence(p, b);
      const int sq = seq.seqlen_q, sk = seq.seqlen_k, d = p.head_dim;
      std::vector<double> dk(size_t(sk) * d, 0.0), dv(size_t(sk) * d, 0.0);
      for (int h = hk * group; h < (hk + 1) * group && sq > 0; ++h) {
        HeadProblem hp(p, b, h);
        auto q = hp.load(q_ref(p), true, sq, h);
        auto k = hp.load(k_ref(p), false, sk, hk);
        auto v = hp.load(v_ref(p), false, sk, hk);
        auto dout = hp.load(do_ref(p), true, sq, h);
        std::vector<double> s, dcap;
        hp.scores(q, k, s, &dcap);
        hp.softmax(s);  // s now holds P
        std::vector<double> dov(size_t(sq) * sk);  // dO_i . V_j where row i sees key j
        hp.visible_dots(dout, v, dov);
        std::vector<double> dq(size_t(sq) * d, 0.0), ds(size_t(kRowBlock) * sk), pd(size_t(kRowBlock) * sk);
        for (int i0 = 0; i0 < sq; i0 += kRowBlock) {
          const int rows = std::min(kRowBlock, sq - i0);
          for (int r = 0; r < rows; ++r) {
            const int i = i0 + r;
            // dP_ij = dO_i . V_j ; D_i = sum_j P_ij dP_ij ; dS_ij = P_ij (dP_ij - D_i)
            std::vector<double> dp(sk, 0.0), z(sk, 1.0);  // z: dropout's factors of the row (1 without)
            double D = 0;
            for (int j = 0; j < sk; ++j) {
              double pij = s[size_t(i) * sk + j];
              if (pij == 0) continue;
              z[j] = hp.keep(i, j);
              dp[j] = dov[size_t(i) * sk + j] * z[j];
              D += pij * dp[j];
            }
            for (int j = 0; j < sk; ++j) {
              double pij = s[size_t(i) * sk + j];
              ds[size_t(r) * sk + j] = pij * (dp[j] - D) * dcap[size_t(i) * sk + j];  // through softcap and scale
              pd[size_t(r) * sk + j] = pij * z[j];
            }
          }
          // dV_j += Pd_ij dO_i, dQ_i += dS_ij K_j, dK_j += dS_ij Q_i: the block's rows take each key in turn, so k_j,
          // dK_j and dV_j serve them while in cache (each sum still runs over i, or j, in order).
          for (int j = 0; j < sk; ++j)
            for (int r = 0; r < rows; ++r) {
              const int i = i0 + r;
              if (s[size_t(i) * sk + j] == 0) continue;
              const double dsij = ds[size_t(r) * sk + j], pdij = pd[size_t(r) * sk + j];
              for (int c = 0; c < d; ++c) {
                dv[size_t(j) * d + c] += pdij * dout[size_t(i) * d + c];
                dq[size_t(i) * d + c] += dsij * k[size_t(j) * d + c];
                dk[size_t(j) * d + c] += dsij * q[size_t(i) * d + c];
              }
            }
        }
        auto dqr = dq_ref(p);
        for (int i = 0; i < sq; ++i) {
          int64_t off = row_offset(p, dqr, seq, true, i, h);
          for (int c = 0; c < d; ++c) store_element(p.dq, off + c, float(dq[size_t(i) * d + c]), p.dtype);
        }
      }
      auto dkr = dk_ref(p), dvr = dv_ref(p);
      for (int j = 0; j < sk; ++j) {
        int64_t ok = row_offset(p, dkr, seq, false, j, hk), ov = row_offset(p, dvr, seq, false, j, hk);
        for (int c = 0; c < d; ++c) {
          store_element(p.dk, ok + c, float(dk[size_t(j) * d + c]), p.dtype);
          store_element(p.dv, ov + c, float(dv[size_t(j) * d + c]), p.dtype);
        }
      }
    }
  }
  return {};
}

}  // namespace flashattn::cpu
