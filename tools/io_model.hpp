// The IO-complexity model of the FlashAttention paper (Dao et al. 2022, Theorem 2): main-memory
// (HBM) traffic of standard attention (Algorithm 0) against flash attention, counted exactly for
// given sizes and block sizes, not only asymptotically. One (batch, head) problem at a time.
//
//   standard (Algorithm 0): read Q, K, write S; read S, write P; read P, V, write O
//       = 2 Nq d + 2 Nk d + 4 Nq Nk                                   = Theta(N d + N^2)
//   flash, FA1 loop order (Algorithm 1): O, l, m initialized in HBM; for each K/V block j
//       (T_c of them) read K_j, V_j once, then for each Q block i read Q_i, O_i, l_i, m_i and
//       write O_i, l_i, m_i: 2 Nk d + T_c (3 Nq d + 4 Nq) + Nq d + 2 Nq  = Theta(N^2 d^2 / M)
//   flash, FA2 loop order: for each Q block i read Q_i, then every K/V block, write O_i and lse_i:
//       2 Nq d + Nq + T_r 2 Nk d
// with block sizes B_c = ceil(M / 4d), B_r = min(B_c, d), T_c = ceil(Nk / B_c), T_r = ceil(Nq / B_r),
// M the on-chip memory in fp32 elements (bytes / 4). Masks (causal, window) drop the block pairs
// with no visible key from the flash counts; standard attention materializes S and P in full.
#pragma once

#include <cstdint>

namespace fa_cli {

struct Blocks {
  int64_t block_r, block_c;
};

// The paper's rule from a budget of M bytes (M / 4 fp32 elements), both sizes at least 1;
// the same rule as the CPU backend's block_sizes (src/cpu/cpu_backend.hpp).
inline Blocks model_blocks(int64_t cache_bytes, int64_t head_dim) {
  int64_t m = cache_bytes / 4;
  int64_t bc = (m + 4 * head_dim - 1) / (4 * head_dim);
  if (bc < 1) bc = 1;
  int64_t br = bc < head_dim ? bc : head_dim;
  return {br, bc};
}

struct IoProblem {
  int64_t seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  int elem_bytes = 2;            // q, k, v, o
  int s_bytes = 2, p_bytes = 2;  // standard attention's S and P in main memory
};

// Traffic of one algorithm on one (batch, head): elements read and written, and bytes
// (q/k/v/o at elem_bytes, S/P at s_bytes/p_bytes, the fp32 statistics l, m, lse at 4).
struct IoCount {
  double reads = 0, writes = 0, bytes = 0;
  double elements() const { return reads + writes; }
  IoCount& operator+=(const IoCount& o) {
    reads += o.reads;
    writes += o.writes;
    bytes += o.bytes;
    return *this;
  }
  IoCount scaled(double f) const { return {reads * f, writes * f, bytes * f}; }
};

IoCount io_standard(const IoProblem& p);
// Number of visible (query, key) pairs of one (batch, head) under the mask.
double visible_pairs(const IoProblem& p);
IoCount io_flash1(const IoProblem& p, Blocks b);
IoCount io_flash2(const IoProblem& p, Blocks b);

}  // namespace fa_cli
