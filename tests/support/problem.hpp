// The pieces of the harness: host tensors with strided views, one problem's inputs and outputs,
// and the oracle / plain results. Tests that need more than check_forward/backward use these.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "support/harness.hpp"

namespace fa_test {

// A (nb, rows, heads, dim) view in host memory with element strides (dim contiguous). The buffer
// around the view (padding) holds 0xFF bytes, a NaN in every dtype: an implementation that reads it
// gets NaN, one that writes it is caught by outside_view_untouched().
struct HostTensor {
  fa_dtype dtype = FA_FLOAT32;
  int64_t nb = 0, rows = 0, heads = 0, dim = 0;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
  std::vector<unsigned char> bytes;

  int64_t offset(int64_t b, int64_t r, int64_t h) const { return b * batch_stride + r * row_stride + h * head_stride; }
  int64_t count() const { return nb * rows * heads * dim; }  // elements of the view
  size_t element_size() const { return dtype == FA_FLOAT32 ? 4 : 2; }
  void* data() { return bytes.empty() ? nullptr : bytes.data(); }
  const void* data() const { return bytes.empty() ? nullptr : bytes.data(); }
  void poison();                              // every byte 0xFF
  void set(const std::vector<float>& values); // the view from logical values (b, r, h, c), rounded
  std::vector<float> get() const;             // the view as logical values
  bool outside_view_untouched() const;        // every byte outside the view is still 0xFF
  // Logical index -> "(b, row, head, col)".
  std::string index_name(int64_t logical) const;
};

// Layout of a tensor: BSHD or BHSD, with `padding` extra elements after each head vector and each row.
HostTensor make_tensor(fa_dtype dtype, int64_t nb, int64_t rows, int64_t heads, int64_t dim, bool bhsd, int padding);

// One sequence of the batch in the logical arrays: (tensor batch index, first row, length).
struct SeqRange {
  int64_t bq = 0, q_start = 0, seqlen_q = 0;
  int64_t bk = 0, k_start = 0, seqlen_k = 0;
};

struct Problem {
  Case c;
  uint64_t seed = 0;
  bool varlen = false;
  int64_t nb = 0, rows_q = 0, rows_k = 0;  // tensor dims: varlen (1, total, ...), else (batch, seqlen, ...)
  int max_seqlen_q = 0, max_seqlen_k = 0;
  std::vector<int32_t> cu_q, cu_k;
  std::vector<int32_t> used_k;  // fa_params::seqused_k (empty: none)
  // A paged KV cache (c.page_block_size > 0): k and v are pools of num_pages pages and the table
  // maps (sequence, page of it) to a pool page; empty: k and v are (nb, rows_k, ...).
  std::vector<int32_t> block_table;  // (nb, table_stride)
  int64_t table_stride = 0;
  int num_pages = 0;
  std::vector<int32_t> leftpad_k;  // fa_params::leftpad_k (empty: none)
  std::vector<float> alibi_slopes;  // fa_params::alibi_slopes (empty: none), (nb or 1, num_heads)
  int64_t alibi_batch_stride = 0;
  float alibi_slope(int64_t b, int h) const {  // sequence b's (0: none)
    return alibi_slopes.empty() ? 0.f : alibi_slopes[size_t(b * alibi_batch_stride + h)];
  }
  float scale = 0.f;  // the effective softmax scale
  HostTensor q, k, v, o, dout, dq, dk, dv;
  std::vector<float> lse;  // (nb, heads, rows_q)
  // Logical input values (already rounded to the dtype).
  std::vector<float> qf, kf, vf, dof;

  SeqRange seq(int b) const;
  int64_t lse_index(int64_t bq, int64_t h, int64_t row) const { return (bq * c.num_heads + h) * rows_q + row; }
  // Params pointing at the host tensors (o, lse, dq, dk, dv included).
  fa_params params();
};

// Fresh inputs for case c (seed 0: a fresh one); outputs poisoned.
Problem make_problem(const Case& c, uint64_t seed);
uint64_t fresh_seed(const std::string& name);

// Results as logical arrays (o, dq like q; dk, dv like k; lse (nb, heads, rows_q)).
struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
  // plain_forward only: per element of o, the fp32 error another implementation's P may add,
  // eps_i sum_j P_ij |v_jc| (plain.cpp).
  std::vector<float> o_floor;
  // plain_backward only: per element, the fp32 error a backward that recomputes P from the
  // forward's lse, and dP and D = rowsum(dO * O), may make beyond the plain one's (plain.cpp).
  std::vector<float> dq_floor, dk_floor, dv_floor;
};

// The oracle: FA_IMPL_CPU_REFERENCE on fp32 copies of the rounded inputs.
Outputs reference_forward(const Problem& pr);
Outputs reference_backward(const Problem& pr);  // dq, dk, dv for dout

// The plain implementation: standard attention in the input's precision as PyTorch computes it.
// S = round(scale * QK^T) (fp32 accumulation), softcap on the rounded S, P = round(softmax(S)) in
// fp32, O = round(PV). Backward rounds each intermediate likewise: dV, dP, dS, dQ, dK (GQA: per
// query head, then the group's sum). fp32 inputs: the same in fp32.
Outputs plain_forward(const Problem& pr);
Outputs plain_backward(const Problem& pr);

// Runs impl's forward or backward on pr's tensors with their memory in `space` (Cuda: copied to the
// GPU, workspace allocated and poisoned, copied back); results land in pr's host tensors and lse.
// Returns "" on success, else the status and the library's message.
std::string run_impl(Problem& pr, fa_impl impl, Space space, bool backward);

// The error rule on logical arrays: "" when max|out - ref| <= factor * max|plain - ref| + atol (plus,
// when given, a per-element absolute floor), else a message naming the tensor, the worst element,
// the error and the bound. NaN never passes.
std::string compare(const char* what, const std::vector<float>& out, const std::vector<float>& ref,
                    const std::vector<float>& plain, double factor, fa_dtype dtype, const HostTensor& layout,
                    const std::vector<double>& floor = {});

// lse (and o's fully masked rows) against the reference's: -inf and 0 exactly where the reference has
// -inf, elsewhere within an fp32 error bound. "" when it passes.
std::string check_lse(const Problem& pr, const std::vector<float>& lse, const std::vector<float>& ref_lse,
                      const std::vector<float>& o);

// Everything check_forward / check_backward judge, on outputs already in pr (an entry per check,
// "" when it passes): for tests that build their own inputs (set pr.qf ... and pr.q.set(pr.qf)).
std::vector<std::string> judge_forward(const Problem& pr, const Outputs& ref, const Outputs& plain);
std::vector<std::string> judge_backward(const Problem& pr, const Outputs& ref, const Outputs& plain);
std::string join_errors(const std::vector<std::string>& errors);  // "" when every entry is ""

}  // namespace fa_test
