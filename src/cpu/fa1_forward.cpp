// FlashAttention-1 forward (Dao et al. 2022, Algorithm 1), written to be read beside the paper.
//
// Per (batch, head), with "HBM" buffers O (seqlen_q, d) fp32, l and m (seqlen_q):
//   for each key block j (B_c keys):                         outer loop, K_j V_j loaded once
//     for each query block i (B_r rows):                     inner loop
//       S_ij = scale * Q_i K_j^T (softcap, ALiBi bias, mask -> -inf)
//       m~ = rowmax(S_ij), P~ = exp(S_ij - m~), l~ = rowsum(P~)
//       m_new = max(m_i, m~), l_new = e^{m_i - m_new} l_i + e^{m~ - m_new} l~
//       P~ dropped (dropout_p > 0; the paper's Algorithm 2): P~ o Z, Z_ij = 1 / (1 - p) or 0 (l~ keeps P~)
//       O_i = diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i + e^{m~ - m_new} P~ V_j)
//       write O_i, l_i = l_new, m_i = m_new back
// and at the end lse = m + log l. O is kept in fp32 (the output dtype only at the final store).
// Plain loops: this implementation is the readable one; FA2 is the fast one.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/dropout.hpp"
#include "common/dtype.hpp"
#include "common/layout.hpp"
#include "common/mask.hpp"
#include "cpu/cpu_backend.hpp"
#include "flashattn/softmax.hpp"

namespace flashattn::cpu {
namespace {

using State = softmax::State<float>;

void forward_head(const fa_params& p, BlockSizes bs, int b, int h) {
  const Sequence seq = sequence(p, b);
  const int sq = seq.seqlen_q, sk = seq.seqlen_k, d = p.head_dim;
  const int h_kv = h / (p.num_heads / p.num_heads_kv);
  const Mask mask(sq, sk, p.causal != 0, p.window_left, p.window_right);
  const float scale = effective_scale(p), slope = alibi_slope(p, b, h);
  const DropoutMask dropout = DropoutMask::of(p);  // an element at a time (src/common/dropout.hpp)
  const int32_t bh = seq.batch_index * p.num_heads + h;
  const int block_r = bs.block_r, block_c = bs.block_c;
  const auto qr = q_ref(p), kr = k_ref(p), vr = v_ref(p), orf = o_ref(p);

  // "HBM": O = 0, l = 0, m = -inf.
  std::vector<float> o(size_t(sq) * d, 0.f);
  std::vector<State> ml(static_cast<size_t>(sq));

  std::vector<float> k_j(size_t(block_c) * d), v_j(size_t(block_c) * d), q_i(size_t(block_r) * d);
  std::vector<float> s_ij(size_t(block_r) * block_c), pv(d);
  for (int n0 = 0; n0 < sk; n0 += block_c) {
    const int nc = std::min(block_c, sk - n0);
    for (int j = 0; j < nc; ++j) {
      load_row(p.k, row_offset(p, kr, seq, false, n0 + j, h_kv), d, p.dtype, &k_j[size_t(j) * d]);
      load_row(p.v, row_offset(p, vr, seq, false, n0 + j, h_kv), d, p.dtype, &v_j[size_t(j) * d]);
    }
    for (int m0 = 0; m0 < sq; m0 += block_r) {
      const int nr = std::min(block_r, sq - m0);
      // Skip a block no row of which sees any key of K_j.
      if (mask.key_begin(m0) >= n0 + nc || mask.key_end(m0 + nr - 1) <= n0) continue;
      for (int i = 0; i < nr; ++i)
        load_row(p.q, row_offset(p, qr, seq, true, m0 + i, h), d, p.dtype, &q_i[size_t(i) * d]);

      for (int i = 0; i < nr; ++i) {
        // S_ij row i, masked entries -inf; the block's softmax state (m~, l~) of the row.
        float* s = &s_ij[size_t(i) * block_c];
        State block_state;
        for (int j = 0; j < nc; ++j) {
          if (!mask.visible(m0 + i, n0 + j)) {
            s[j] = softmax::neg_inf<float>();
            continue;
          }
          float acc = 0;
          for (int c = 0; c < d; ++c) acc += q_i[size_t(i) * d + c] * k_j[size_t(j) * d + c];
          acc *= scale;
          if (p.softcap > 0) acc = p.softcap * std::tanh(acc / p.softcap);
          s[j] = acc - slope * float(mask.diagonal_distance(m0 + i, n0 + j));
        }
        block_state.m = softmax::neg_inf<float>();
        for (int j = 0; j < nc; ++j) block_state.m = std::max(block_state.m, s[j]);
        // P~ = exp(S - m~) (0 where masked), l~ = rowsum(P~), (P~ dropped) V_j.
        std::fill(pv.begin(), pv.end(), 0.f);
        for (int j = 0; j < nc; ++j) {
          float pij = softmax::exp_diff(s[j], block_state.m);
          block_state.l += pij;
          if (dropout.on()) pij = dropout.kept(bh, m0 + i, n0 + j) ? pij * dropout.scale : 0.f;
          if (pij == 0) continue;
          for (int c = 0; c < d; ++c) pv[c] += pij * v_j[size_t(j) * d + c];
        }
        // m_new, l_new, and O_i rescaled and renormalized.
        State& row = ml[size_t(m0 + i)];
        const State next = softmax::merge(row, block_state);
        if (next.l > 0) {
          const float old_w = row.l * softmax::exp_diff(row.m, next.m) / next.l;
          const float new_w = softmax::exp_diff(block_state.m, next.m) / next.l;
          float* o_row = &o[size_t(m0 + i) * d];
          for (int c = 0; c < d; ++c) o_row[c] = old_w * o_row[c] + new_w * pv[c];
        }
        row = next;
      }
    }
  }
  // Rows with no visible key keep O = 0, l = 0: lse = -inf.
  for (int i = 0; i < sq; ++i) {
    store_row(p.o, row_offset(p, orf, seq, true, i, h), d, &o[size_t(i) * d], p.dtype);
    if (p.lse) p.lse[lse_index(p, seq, i, h)] = ml[size_t(i)].lse();
  }
}

}  // namespace

Status fa1_forward(const fa_params& p) {
  const BlockSizes bs = block_sizes(p.cpu_cache_bytes > 0 ? p.cpu_cache_bytes : l2_cache_bytes(), p.head_dim);
  const int nb = p.batch, nh = p.num_heads;
  const int threads = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(threads)
  for (int b = 0; b < nb; ++b)
    for (int h = 0; h < nh; ++h) forward_head(p, bs, b, h);
  return {};
}

}  // namespace flashattn::cpu
