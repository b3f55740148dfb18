// The oracle checked on its own: the reference against the attention formula written out
// directly (masks from the header's definitions, not from Mask), and its backward against central
// finite differences of that formula in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "support/harness.hpp"
#include "support/problem.hpp"

namespace {

using namespace fa_test;

// o and lse of one problem from the definition, in double, on the problem's logical inputs
// (q (nb, rows_q, h, d), k/v (nb, rows_k, hk, d)); x points at replaceable copies of them.
struct Formula {
  const Problem& pr;
  std::vector<double> q, k, v;

  explicit Formula(const Problem& p)
      : pr(p), q(p.qf.begin(), p.qf.end()), k(p.kf.begin(), p.kf.end()), v(p.vf.begin(), p.vf.end()) {}

  static bool visible(const Case& c, int64_t i, int64_t j, int64_t sq, int64_t sk) {
    const int64_t diag = i + sk - sq;  // bottom-right aligned
    if (c.causal && j > diag) return false;
    if (c.window_left >= 0 && j < diag - c.window_left) return false;
    if (c.window_right >= 0 && j > diag + c.window_right) return false;
    return true;
  }

  // Fills o (like q) and lse (nb, h, rows_q).
  void run(std::vector<double>& o, std::vector<double>& lse) const {
    const Case& c = pr.c;
    const int h_count = c.num_heads, hk_count = c.num_heads_kv, d = c.head_dim;
    const double scale = c.softmax_scale != 0 ? c.softmax_scale : 1.0 / std::sqrt(double(d));
    o.assign(q.size(), 0.0);
    lse.assign(pr.lse.size(), -std::numeric_limits<double>::infinity());
    const int nbatch = pr.varlen ? int(pr.cu_q.size()) - 1 : c.batch;
    for (int b = 0; b < nbatch; ++b) {
      SeqRange s = pr.seq(b);
      for (int h = 0; h < h_count; ++h) {
        const int hk = h / (h_count / hk_count);
        for (int64_t i = 0; i < s.seqlen_q; ++i) {
          const size_t qi = size_t(((s.bq * pr.rows_q + s.q_start + i) * h_count + h) * d);
          std::vector<double> score(size_t(s.seqlen_k), -std::numeric_limits<double>::infinity());
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < s.seqlen_k; ++j) {
            if (!visible(c, i, j, s.seqlen_q, s.seqlen_k)) continue;
            const size_t kj = size_t(((s.bk * pr.rows_k + s.k_start + j) * hk_count + hk) * d);
            double dot = 0;
            for (int x = 0; x < d; ++x) dot += q[qi + size_t(x)] * k[kj + size_t(x)];
            double sc = scale * dot;
            if (c.softcap > 0) sc = c.softcap * std::tanh(sc / c.softcap);
            score[size_t(j)] = sc;
            m = std::max(m, sc);
          }
          if (m == -std::numeric_limits<double>::infinity()) continue;
          double l = 0;
          for (double& sc : score) l += (sc = std::exp(sc - m));
          for (int64_t j = 0; j < s.seqlen_k; ++j) {
            const size_t vj = size_t(((s.bk * pr.rows_k + s.k_start + j) * hk_count + hk) * d);
            for (int x = 0; x < d; ++x) o[qi + size_t(x)] += score[size_t(j)] / l * v[vj + size_t(x)];
          }
          lse[size_t(pr.lse_index(s.bq, h, s.q_start + i))] = m + std::log(l);
        }
      }
    }
  }

  // The loss whose gradient the backward computes: sum(o * dout).
  double loss() const {
    std::vector<double> o, lse;
    run(o, lse);
    double sum = 0;
    for (size_t i = 0; i < o.size(); ++i) sum += o[i] * pr.dof[i];
    return sum;
  }
};

Case tiny(int sq, int sk, int h, int hk, int d) {
  Case c;
  c.dtype = FA_FLOAT32;
  c.batch = 2;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.num_heads = h;
  c.num_heads_kv = hk;
  c.head_dim = d;
  return c;
}

// The mask and feature combinations the formula is compared on.
std::vector<Case> tiny_cases() {
  std::vector<Case> v;
  for (auto [sq, sk] : {std::pair{5, 5}, std::pair{3, 7}, std::pair{7, 3}}) {
    Case c = tiny(sq, sk, 2, 1, 4);
    v.push_back(c);
    Case x = c;
    x.causal = true;
    v.push_back(x);
    x = c;
    x.window_left = 1;
    v.push_back(x);
    x = c;
    x.window_right = 1;
    v.push_back(x);
    x = c;
    x.window_left = 2;
    x.window_right = 0;
    v.push_back(x);
    x = c;
    x.causal = true;
    x.window_left = 1;
    v.push_back(x);
    x = c;
    x.softcap = 1.5f;
    x.softmax_scale = 0.8f;
    v.push_back(x);
    x.causal = true;
    v.push_back(x);
  }
  Case vl = tiny(1, 1, 2, 2, 3);
  vl.seqlens_q = {2, 0, 4, 3};
  vl.seqlens_k = {3, 2, 4, 0};
  vl.batch = 4;
  vl.seqlen_q = 4;
  vl.seqlen_k = 4;
  v.push_back(vl);
  vl.causal = true;
  v.push_back(vl);
  return v;
}

class ReferenceFormula : public testing::TestWithParam<Case> {};

TEST_P(ReferenceFormula, ForwardEqualsTheDefinition) {
  Problem pr = make_problem(GetParam(), 0);
  Outputs ref = reference_forward(pr);
  std::vector<double> o, lse;
  Formula(pr).run(o, lse);
  for (size_t i = 0; i < o.size(); ++i)
    ASSERT_NEAR(ref.o[i], o[i], 1e-6 * (1 + std::fabs(o[i]))) << pr.o.index_name(int64_t(i)) << " seed " << pr.seed;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse[i])) {
      EXPECT_TRUE(std::isinf(ref.lse[i]) && ref.lse[i] < 0) << "lse " << i;
    } else {
      ASSERT_NEAR(ref.lse[i], lse[i], 1e-6 * (1 + std::fabs(lse[i]))) << "lse " << i << " seed " << pr.seed;
    }
  }
}

// Central differences of sum(o * dout) in double (step 1e-5: truncation ~1e-10, cancellation
// ~1e-11) against the reference gradients (fp32 outputs of double sums).
TEST_P(ReferenceFormula, BackwardEqualsFiniteDifferences) {
  Problem pr = make_problem(GetParam(), 0);
  Outputs ref = reference_backward(pr);
  Formula f(pr);
  const double step = 1e-5;
  auto check = [&](std::vector<double>& x, const std::vector<float>& grad, const HostTensor& layout, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + step;
      const double up = f.loss();
      x[i] = keep - step;
      const double down = f.loss();
      x[i] = keep;
      const double fd = (up - down) / (2 * step);
      ASSERT_NEAR(grad[i], fd, 1e-6 * (1 + std::fabs(fd)))
          << name << " " << layout.index_name(int64_t(i)) << ", case [" << pr.c.name() << "] seed " << pr.seed;
    }
  };
  check(f.q, ref.dq, pr.q, "dq");
  check(f.k, ref.dk, pr.k, "dk");
  check(f.v, ref.dv, pr.v, "dv");
}

INSTANTIATE_TEST_SUITE_P(Tiny, ReferenceFormula, testing::ValuesIn(tiny_cases()),
                         [](const testing::TestParamInfo<Case>& info) { return test_name(info.param.name()); });

// Values whose scores reach ~1e4: the softmax must subtract the row max, not overflow.
TEST(ReferenceForward, LargeScoresDoNotOverflow) {
  Case c = tiny(6, 9, 2, 2, 8);
  c.softmax_scale = 3000.f;  // |q.k| ~ 3: scores ~ 1e4
  Problem pr = make_problem(c, 0);
  Outputs ref = reference_forward(pr);
  std::vector<double> o, lse;
  Formula(pr).run(o, lse);
  for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(ref.o[i], o[i], 1e-6 * (1 + std::fabs(o[i])));
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(ref.lse[i], lse[i], 1e-6 * std::fabs(lse[i]));
}

}  // namespace
