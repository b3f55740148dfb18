#include "io_model.hpp"

#include <algorithm>

namespace fa_cli {

namespace {

// Visible key range of row i: the bottom-right-aligned band of src/common/mask.hpp.
struct Band {
  const IoProblem& p;
  int64_t diag(int64_t i) const { return i + p.seqlen_k - p.seqlen_q; }
  int64_t right() const { return p.causal ? 0 : p.window_right; }
  int64_t begin(int64_t i) const { return p.window_left < 0 ? 0 : std::max<int64_t>(0, diag(i) - p.window_left); }
  int64_t end(int64_t i) const {
    int64_t hi = right() < 0 ? p.seqlen_k : diag(i) + right() + 1;
    return std::clamp<int64_t>(hi, 0, p.seqlen_k);
  }
};

// For the q block of rows [r0, r1): the K/V blocks [j0, j1) holding a key some row sees
// (the rows' ranges move monotonically, so their union is one interval).
void visible_blocks(const IoProblem& p, int64_t r0, int64_t r1, int64_t block_c, int64_t* j0, int64_t* j1) {
  Band band{p};
  int64_t lo = band.begin(r0), hi = band.end(r1 - 1);
  if (hi <= lo) {
    *j0 = *j1 = 0;
    return;
  }
  *j0 = lo / block_c;
  *j1 = (hi + block_c - 1) / block_c;
}

int64_t keys_in(const IoProblem& p, int64_t j0, int64_t j1, int64_t block_c) {
  return std::min(j1 * block_c, p.seqlen_k) - j0 * block_c;
}

}  // namespace

double visible_pairs(const IoProblem& p) {
  Band band{p};
  double n = 0;
  for (int64_t i = 0; i < p.seqlen_q; ++i) n += double(std::max<int64_t>(0, band.end(i) - band.begin(i)));
  return n;
}

IoCount io_standard(const IoProblem& p) {
  const double nq = double(p.seqlen_q), nk = double(p.seqlen_k), d = double(p.head_dim), s = nq * nk;
  IoCount c;
  c.reads = nq * d + nk * d + s /*S*/ + s /*P*/ + nk * d /*V*/;
  c.writes = s /*S*/ + s /*P*/ + nq * d /*O*/;
  c.bytes = (2 * nq * d + 2 * nk * d) * p.elem_bytes + 2 * s * p.s_bytes + 2 * s * p.p_bytes;
  return c;
}

IoCount io_flash1(const IoProblem& p, Blocks b) {
  const double d = double(p.head_dim), e = p.elem_bytes;
  IoCount c;
  // Initialize O = 0, l = 0, m = -inf in HBM.
  c.writes = double(p.seqlen_q) * (d + 2);
  c.bytes = double(p.seqlen_q) * (d * e + 8);
  // Per visible (Q block i, K/V block j): read Q_i, O_i, l_i, m_i; write O_i, l_i, m_i.
  int64_t jmin = INT64_MAX, jmax = 0;
  for (int64_t r0 = 0; r0 < p.seqlen_q; r0 += b.block_r) {
    const int64_t r1 = std::min(r0 + b.block_r, p.seqlen_q), rows = r1 - r0;
    int64_t j0, j1;
    visible_blocks(p, r0, r1, b.block_c, &j0, &j1);
    if (j1 <= j0) continue;
    jmin = std::min(jmin, j0);
    jmax = std::max(jmax, j1);
    const double pairs = double(j1 - j0);
    c.reads += pairs * rows * (2 * d + 2);
    c.writes += pairs * rows * (d + 2);
    c.bytes += pairs * rows * (3 * d * e + 16);
  }
  // Each K/V block some query sees is read once (the outer loop).
  if (jmax > jmin) {
    const double keys = double(keys_in(p, jmin, jmax, b.block_c));
    c.reads += 2 * keys * d;
    c.bytes += 2 * keys * d * e;
  }
  return c;
}

IoCount io_flash2(const IoProblem& p, Blocks b) {
  const double d = double(p.head_dim), e = p.elem_bytes;
  IoCount c;
  for (int64_t r0 = 0; r0 < p.seqlen_q; r0 += b.block_r) {
    const int64_t r1 = std::min(r0 + b.block_r, p.seqlen_q);
    const double rows = double(r1 - r0);
    int64_t j0, j1;
    visible_blocks(p, r0, r1, b.block_c, &j0, &j1);
    const double keys = j1 > j0 ? double(keys_in(p, j0, j1, b.block_c)) : 0.0;
    // Read Q_i (skipped when no key is visible), then K_j, V_j of every visible block;
    // write O_i and lse_i.
    const double q_read = keys > 0 ? rows * d : 0.0;
    c.reads += q_read + 2 * keys * d;
    c.writes += rows * (d + 1);
    c.bytes += (q_read + 2 * keys * d + rows * d) * e + rows * 4;
  }
  return c;
}

}  // namespace fa_cli
